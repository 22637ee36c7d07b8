"""IFEval's semantics for the constraint kinds of `tokencredit.verifiers.checkers`, and IFEval's vocabulary.

    constraint = from_ifeval("length_constraints:number_words", {"num_words": 300, "relation": "less than"})
        -> Constraint("word_count", {"max": 299})
    passed = check(constraint.kind, response, constraint.args)              # IFEval strict: True / False
    passed = check_loose(constraint.kind, response, constraint.args)        # IFEval loose

Each check follows `check_following` of the reference (Google's IFEval, as copied into lm-eval's
`tasks/ifeval/instructions.py`), given the same arguments:
keywords match as case-insensitive substrings (forbidden words as whole words), paragraphs are
separated by `***` (by blank lines for nth_paragraph_first_word), sections count "at least n",
ends_with ignores case and a closing quote, the case kinds also need English (langdetect; a text
whose language cannot be told passes, as in the reference), json_format accepts a ```json fence.
Keywords, postscript markers and section splitters are regular expressions, as in the reference
(one that does not compile is taken literally instead of raising). Kinds that IFEval lacks (char_count, starts_with, punctuation_ban) keep the
project's check, passed only at score 1. The loose mode passes when any of the reference's eight
variants of the response passes (first line, last line, both removed; asterisks removed).
An empty or whitespace-only response fails every check in both modes, as in the reference.
"""
from __future__ import annotations

import collections
import json
import re
from collections.abc import Callable
from typing import Any

from tokencredit.schemas.records import Constraint

from tokencredit.verifiers import text as text_tools
from tokencredit.verifiers.checkers import CHECKERS, CONSTRAINED_OPTIONS, validate_args

SEMANTICS = ("ifeval", "ifeval-loose")


# ---------------------------------------------------------------- the reference's checks, in our kinds' arguments

def _pattern(text: str) -> str:
    """`text` as the reference uses it, a regular expression; literally when it does not compile."""
    try:
        re.compile(text)
        return text
    except re.error:
        return re.escape(text)


def _within(n: int, lo: int | None, hi: int | None) -> bool:
    return (lo is None or n >= lo) and (hi is None or n <= hi)


def _english_case(value: str, is_case: Callable[[str], bool]) -> bool:
    detected = text_tools.language(value)
    return is_case(value) and (detected is None or detected == "en")


def _paragraph_count(value: str, n: int) -> bool:
    paragraphs = re.split(r"\s?\*\*\*\s?", value)
    count = len(paragraphs)
    for i, paragraph in enumerate(paragraphs):
        if not paragraph.strip():
            if i in (0, len(paragraphs) - 1):
                count -= 1
            else:
                return False
    return count == n


def _nth_paragraph_first_word(value: str, n: int, nth: int, word: str) -> bool:
    paragraphs = re.split(r"\n\n", value)
    count = sum(1 for p in paragraphs if p.strip())
    if nth > count:
        return False
    paragraph = paragraphs[nth - 1].strip()
    if not paragraph:
        return False
    first = paragraph.split()[0].strip().lstrip("'").lstrip('"')
    first = re.split(r"[.,?!'\"]", first, maxsplit=1)[0].lower()
    return count == n and first == word.lower()


def _postscript(value: str, marker: str) -> bool:
    marker = marker.strip()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + _pattern(marker.lower()) + r".*$"
    return bool(re.findall(pattern, value.lower(), flags=re.MULTILINE))


def _highlighted_sections(value: str, n: int) -> bool:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", value) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", value) if h.removeprefix("**").removesuffix("**").strip()]
    return len(single) + len(double) >= n


def _sections(value: str, n: int, splitter: str = "SECTION") -> bool:
    return len(re.split(r"\s?" + _pattern(splitter.strip()) + r"\s?\d+\s?", value)) - 1 >= n


def _json_format(value: str, keys: list[str] | None = None) -> bool:
    body = value.strip()
    for prefix in ("```json", "```Json", "```JSON", "```"):
        body = body.removeprefix(prefix)
    body = body.removesuffix("```").strip()
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return not keys or (isinstance(parsed, dict) and all(k in parsed for k in keys))


def _two_responses(value: str) -> bool:
    parts = value.split("******")
    answers = []
    for i, part in enumerate(parts):
        if not part.strip():
            if i not in (0, len(parts) - 1):
                return False
        else:
            answers.append(part)
    return len(answers) == 2 and answers[0].strip() != answers[1].strip()


def _bullet_count(value: str, n: int) -> bool:
    stars = re.findall(r"^\s*\*[^\*].*$", value, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", value, flags=re.MULTILINE)
    return len(stars) + len(dashes) == n


def _own(kind: str) -> Callable[..., bool]:
    """A kind IFEval lacks: the project's check, passed at score 1."""
    return lambda value, **args: CHECKERS[kind].check(value, **args)[0] >= 1.0


def _count(pattern_of: Callable[[str], str]) -> Callable[..., int]:
    return lambda value, keyword: len(re.findall(pattern_of(keyword), value, flags=re.IGNORECASE))


_occurrences = _count(lambda k: _pattern(k.strip()))

CHECKS: dict[str, Callable[..., bool]] = {
    "keyword_include": lambda v, keywords: all(re.search(_pattern(k), v, flags=re.IGNORECASE) for k in keywords),
    "keyword_exclude": lambda v, keywords: not any(
        re.search(r"\b" + _pattern(w) + r"\b", v, flags=re.IGNORECASE) for w in keywords),
    "keyword_frequency": lambda v, keyword, n=None, max=None: _within(_occurrences(v, keyword), n, max),
    "letter_frequency": lambda v, letter, min=None, max=None: _within(
        collections.Counter(v.lower())[letter.strip().lower()], min, max),
    "capital_word_frequency": lambda v, min=None, max=None: _within(
        len([w for w in text_tools.word_tokens(v) if w.isupper()]), min, max),
    "response_language": lambda v, language: text_tools.language(v) in (None, language),
    "word_count": lambda v, min=None, max=None: _within(len(re.findall(r"\w+", v)), min, max),
    "sentence_count": lambda v, min=None, max=None: _within(
        len(text_tools.sentence_spans(v, text_tools.count_limit(min, max))), min, max),
    "paragraph_count": _paragraph_count,
    "nth_paragraph_first_word": _nth_paragraph_first_word,
    "placeholders": lambda v, n: len(re.findall(r"\[.*?\]", v)) >= n,
    "postscript": _postscript,
    "bullet_count": _bullet_count,
    "constrained_response": lambda v: any(o in v.strip() for o in CONSTRAINED_OPTIONS),
    "highlighted_sections": _highlighted_sections,
    "sections": _sections,
    "json_format": _json_format,
    "title": lambda v: any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", v)),
    "two_responses": _two_responses,
    "repeat_prompt": lambda v, prompt: v.strip().lower().startswith(prompt.strip().lower()),
    "ends_with": lambda v, phrase: v.strip().strip('"').lower().endswith(phrase.strip().lower()),
    "uppercase": lambda v: _english_case(v, str.isupper),
    "lowercase": lambda v: _english_case(v, str.islower),
    "no_commas": lambda v: "," not in v,
    "quotation": lambda v: len(v.strip()) > 1 and v.strip()[0] == '"' and v.strip()[-1] == '"',
    "starts_with": lambda v, phrase: v.strip().lower().startswith(phrase.strip().lower()),
    "char_count": _own("char_count"),
    "punctuation_ban": _own("punctuation_ban"),
}


# Sentences for the kinds whose IFEval meaning differs from the project's wording in `checkers`.
DESCRIBE: dict[str, Callable[..., str]] = {
    "paragraph_count": lambda n: f"Write exactly {n} paragraph{'s' * (n != 1)} separated by the markdown divider ***.",
    "sections": lambda n, splitter="SECTION": f"Write at least {n} section{'s' * (n != 1)}, "
    f"each starting with '{splitter} X' where X is its number.",
}


def check(kind: str, response: str, args: dict[str, Any]) -> bool:
    """IFEval strict: the reference's check on the response as it is."""
    return bool(response.strip()) and CHECKS[kind](response, **args)


def loose_variants(response: str) -> list[str]:
    """The reference's eight variants: as is, first/last/both lines removed, each also without '*'."""
    lines = response.split("\n")
    trimmed = [response, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return [trimmed[0], trimmed[0].replace("*", ""), *trimmed[1:], *(t.replace("*", "") for t in trimmed[1:])]


def check_loose(kind: str, response: str, args: dict[str, Any]) -> bool:
    return any(check(kind, variant, args) for variant in loose_variants(response))


# ---------------------------------------------------------------- IFEval's instruction ids -> constraints

def _relation(lower: str, upper: str) -> Callable[[int, str], dict[str, int]]:
    """IFEval's (threshold, "less than" | "at least") as inclusive bounds."""
    def bounds(threshold: int, relation: str) -> dict[str, int]:
        if relation == "at least":
            return {lower: threshold}
        if relation == "less than":
            return {upper: threshold - 1}
        raise ValueError(f"relation must be 'less than' or 'at least', got {relation!r}")
    return bounds


_MIN_MAX, _N_MAX = _relation("min", "max"), _relation("n", "max")

# IFEval id -> (our kind, kwargs -> our args)
IFEVAL_IDS: dict[str, tuple[str, Callable[..., dict[str, Any]]]] = {
    "keywords:existence": ("keyword_include", lambda keywords: {"keywords": list(keywords)}),
    "keywords:frequency": ("keyword_frequency", lambda keyword, frequency, relation:
                           {"keyword": keyword.strip(), **_N_MAX(frequency, relation)}),
    "keywords:forbidden_words": ("keyword_exclude", lambda forbidden_words: {"keywords": sorted(set(forbidden_words))}),
    "keywords:letter_frequency": ("letter_frequency", lambda letter, let_frequency, let_relation:
                                  {"letter": letter.strip().lower(), **_MIN_MAX(let_frequency, let_relation)}),
    "language:response_language": ("response_language", lambda language: {"language": language}),
    "length_constraints:number_sentences": ("sentence_count", lambda num_sentences, relation:
                                            _MIN_MAX(num_sentences, relation)),
    "length_constraints:number_paragraphs": ("paragraph_count", lambda num_paragraphs: {"n": num_paragraphs}),
    "length_constraints:number_words": ("word_count", lambda num_words, relation: _MIN_MAX(num_words, relation)),
    "length_constraints:nth_paragraph_first_word": (
        "nth_paragraph_first_word", lambda num_paragraphs, nth_paragraph, first_word:
        {"n": num_paragraphs, "nth": nth_paragraph, "word": first_word.lower()}),
    "detectable_content:number_placeholders": ("placeholders", lambda num_placeholders: {"n": num_placeholders}),
    "detectable_content:postscript": ("postscript", lambda postscript_marker: {"marker": postscript_marker.strip()}),
    "detectable_format:number_bullet_lists": ("bullet_count", lambda num_bullets: {"n": num_bullets}),
    "detectable_format:constrained_response": ("constrained_response", lambda: {}),
    "detectable_format:number_highlighted_sections": ("highlighted_sections", lambda num_highlights:
                                                      {"n": num_highlights}),
    "detectable_format:multiple_sections": ("sections", lambda section_spliter, num_sections:
                                            {"n": num_sections, "splitter": section_spliter.strip()}),
    "detectable_format:json_format": ("json_format", lambda: {}),
    "detectable_format:title": ("title", lambda: {}),
    "combination:two_responses": ("two_responses", lambda: {}),
    "combination:repeat_prompt": ("repeat_prompt", lambda prompt_to_repeat: {"prompt": prompt_to_repeat}),
    "startend:end_checker": ("ends_with", lambda end_phrase: {"phrase": end_phrase.strip()}),
    "change_case:capital_word_frequency": ("capital_word_frequency", lambda capital_frequency, capital_relation:
                                           _MIN_MAX(capital_frequency, capital_relation)),
    "change_case:english_capital": ("uppercase", lambda: {}),
    "change_case:english_lowercase": ("lowercase", lambda: {}),
    "punctuation:no_comma": ("no_commas", lambda: {}),
    "startend:quotation": ("quotation", lambda: {}),
}


def from_ifeval(instruction_id: str, kwargs: dict[str, Any]) -> Constraint:
    """One IFEval instruction (id and its kwargs; null values are dropped, as the reference does) as
    a constraint; ValueError saying what is wrong."""
    if instruction_id not in IFEVAL_IDS:
        raise ValueError(f"unknown constraint kind {instruction_id!r}; known IFEval ids: {', '.join(IFEVAL_IDS)}")
    kind, convert = IFEVAL_IDS[instruction_id]
    given = {k: v for k, v in kwargs.items() if v is not None}
    try:
        args = convert(**given)
    except TypeError as e:  # a missing or unexpected kwarg: name it in the reference's words
        raise ValueError(f"{instruction_id}: {str(e).split(')', 1)[-1].strip()}") from None
    except (AttributeError, ValueError) as e:
        raise ValueError(f"{instruction_id}: {e}") from None
    problem = validate_args(kind, args)
    if problem:
        raise ValueError(f"{instruction_id}: {problem}")
    return Constraint(kind, args)
