"""IFEval-style constraint checkers: one kind, one sentence, one check.

Every kind in `CHECKERS` has
    args                                   {name: (validator, required)}, enforced by `validate_args`
    describe(**args) -> str                the sentence used in the prompt and in the feedback
    check(response, **args) -> (score, found)   score in [0, 1]; `found` says what was seen

Partial credit (score = a fraction):
    keyword_include     fraction of the keywords present
    keyword_exclude     fraction of the keywords absent
    punctuation_ban     fraction of the banned characters absent
    placeholders        min(1, placeholders found / n)
    keyword_frequency   min(1, occurrences / n)
    json_format         with `keys`: fraction of the keys present in a top-level JSON object
                        (0 when the response is not a JSON object); without `keys`: binary
    highlighted_sections  min(1, highlighted sections found / n)
All other kinds are binary. Keywords match whole words, case-insensitively; starts_with and
ends_with compare exactly, ignoring surrounding whitespace. Sentences are Punkt's
(`tokencredit.verifiers.text`). An empty or whitespace-only response scores 0 on every kind (in
`tokencredit.verifiers.instructions`, before any check runs).

These are the project's own semantics ("tokencredit"); `tokencredit.verifiers.ifeval` has the IFEval
reference's checks for the same kinds.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tokencredit.verifiers import text as _text_tools

_SHOWN_CHARS = 30  # longest piece of the response quoted in a `found` note


# ---------------------------------------------------------------- counting (shared with the demo builder)

def words(text: str) -> list[str]:
    return re.findall(r"\w+(?:'\w+)*", text)


def sentences(text: str, limit: int | None = None) -> list[str]:
    """Punkt's sentences that hold a word ("Mr. and Mrs. Jones came home." is one), the first `limit` when given."""
    return [text[s:e] for s, e in _text_tools.sentence_spans(text, limit, with_word=True)]


def paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n[ \t]*\n", text.strip()) if p.strip()]


def bullets(text: str) -> list[str]:
    return re.findall(r"^[ \t]*[*-][ \t]+\S.*$", text, re.MULTILINE)


def section_numbers(text: str, splitter: str = "SECTION") -> list[int]:
    pattern = rf"^[ \t]*{re.escape(splitter)}[ \t]+(\d{{1,6}})\b"
    return [int(n) for n in re.findall(pattern, text, re.MULTILINE)]


def highlights(text: str) -> list[str]:
    """Markdown highlights on one line, *like this* or **like this**, with some text inside."""
    return [m for m in re.findall(r"\*\*[^\n*]+\*\*|\*[^\n*]+\*", text) if m.strip("*").strip()]


def unfence(text: str) -> str:
    """The body of a Markdown code fence (```json ... ```) that wraps the whole text, else the text."""
    m = re.fullmatch(r"\s*```[A-Za-z]*[ \t]*\n?(.*?)\n?```\s*", text, re.DOTALL)
    return m.group(1) if m else text


def placeholders(text: str) -> list[str]:
    return re.findall(r"\[[^\[\]\n]+\]", text)


def keyword_count(text: str, keyword: str) -> int:
    return len(re.findall(rf"(?<!\w){re.escape(keyword)}(?!\w)", text, re.IGNORECASE))


def parse_json(text: str) -> tuple[Any, str | None]:
    """(value, None) when the whole text is one JSON value, else (None, why not)."""
    try:
        return json.loads(text), None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        return None, str(e).split(":")[0]
    except RecursionError:
        return None, "nested too deeply"


# ---------------------------------------------------------------- argument validators: None or what is wrong

def _count(v: Any) -> str | None:
    return None if type(v) is int and v >= 0 else "must be a non-negative integer"


def _positive(v: Any) -> str | None:
    return None if type(v) is int and v >= 1 else "must be a positive integer"


def _text(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() else "must be a non-empty string"


def _word_list(v: Any) -> str | None:
    ok = isinstance(v, list) and v and all(isinstance(w, str) and w.strip() for w in v)
    return None if ok else "must be a non-empty list of non-empty strings"


def _letter(v: Any) -> str | None:
    return None if isinstance(v, str) and len(v) == 1 and v.isalpha() else "must be one letter"


def _language_code(v: Any) -> str | None:
    return None if isinstance(v, str) and re.fullmatch(r"[a-z]{2}(-[a-z]{2})?", v) else "must be an ISO 639-1 code like 'en'"


def _key_list(v: Any) -> str | None:
    return None if isinstance(v, list) and all(isinstance(k, str) for k in v) else "must be a list of strings"


# ---------------------------------------------------------------- wording helpers

def _quoted(items: list[str], joiner: str) -> str:
    q = [f"'{w}'" for w in items]
    return q[0] if len(q) == 1 else f"{', '.join(q[:-1])} {joiner} {q[-1]}"


def _snip(text: str) -> str:
    flat = " ".join(text.split())
    return f"'{flat[:_SHOWN_CHARS]}...'" if len(flat) > _SHOWN_CHARS else f"'{flat}'"


def _sentence(text: str) -> str:
    """End with a period unless a quoted phrase already ends the sentence ('That is all.')."""
    return text if text.endswith((".'", "!'", "?'")) else text + "."


def _bounds(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f"exactly {lo}" if lo == hi else f"between {lo} and {hi}"
    return f"at least {lo}" if lo is not None else f"at most {hi}"


def _times(lo: int | None, hi: int | None) -> str:
    return "time" if (lo if lo is not None else hi) == 1 and (hi is None or hi == 1) else "times"


def _within(n: int, lo: int | None, hi: int | None) -> float:
    return float((lo is None or n >= lo) and (hi is None or n <= hi))


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


# ---------------------------------------------------------------- checks

def _keyword_include(r: str, keywords: list[str]) -> tuple[float, str]:
    have = [k for k in keywords if keyword_count(r, k)]
    miss = [k for k in keywords if k not in have]
    found = _quoted(have, "and") if have else "none"
    return len(have) / len(keywords), found + (f"; missing {_quoted(miss, 'and')}" if miss else "")


def _keyword_exclude(r: str, keywords: list[str]) -> tuple[float, str]:
    used = [k for k in keywords if keyword_count(r, k)]
    return 1 - len(used) / len(keywords), f"used {_quoted(used, 'and')}" if used else "none of them"


def _word_count(r: str, min: int | None = None, max: int | None = None) -> tuple[float, str]:
    n = len(words(r))
    return _within(n, min, max), _plural(n, "word")


def _sentence_count(r: str, min: int | None = None, max: int | None = None) -> tuple[float, str]:
    limit = _text_tools.count_limit(min, max)
    n = len(sentences(r, limit))  # past the limit the score is decided and only the count is not exact
    return _within(n, min, max), _plural(n, "sentence") if n < limit else f"more than {limit - 1} sentences"


def _char_count(r: str, min: int | None = None, max: int | None = None) -> tuple[float, str]:
    n = len(r.strip())
    return _within(n, min, max), _plural(n, "character")


def _paragraph_count(r: str, n: int) -> tuple[float, str]:
    got = len(paragraphs(r))
    return float(got == n), _plural(got, "paragraph")


def _bullet_count(r: str, n: int) -> tuple[float, str]:
    got = len(bullets(r))
    return float(got == n), _plural(got, "bullet point")


def _sections(r: str, n: int, splitter: str = "SECTION") -> tuple[float, str]:
    got = section_numbers(r, splitter)
    found = f"{splitter} " + ", ".join(map(str, got)) if got else f"no {splitter} headers"
    return float(got == list(range(1, n + 1))), found


def _starts_with(r: str, phrase: str) -> tuple[float, str]:
    text = r.strip()
    return float(text.startswith(phrase.strip())), f"starts with {_snip(text[: len(phrase.strip())])}"


def _ends_with(r: str, phrase: str) -> tuple[float, str]:
    text, p = r.strip(), phrase.strip()
    return float(text.endswith(p)), f"ends with {_snip(text[len(text) - len(p):])}"


def _quotation(r: str) -> tuple[float, str]:
    t = r.strip()
    if not t:
        return 0.0, "an empty response"
    return float(len(t) >= 2 and t[0] == '"' and t[-1] == '"'), f"starts with {t[0]!r}, ends with {t[-1]!r}"


def _case(r: str, want_lower: bool) -> tuple[float, str]:
    wrong = [w for w in words(r) if (w != w.lower() if want_lower else w != w.upper())]
    cased = any(c.islower() or c.isupper() for c in r)
    if not cased:
        return 0.0, "no letters"
    other = "uppercase" if want_lower else "lowercase"
    return float(not wrong), f"{other} in {_quoted(wrong[:3], 'and')}" if wrong else f"no {other} letters"


def _lowercase(r: str) -> tuple[float, str]:
    return _case(r, want_lower=True)


def _uppercase(r: str) -> tuple[float, str]:
    return _case(r, want_lower=False)


def _placeholders(r: str, n: int) -> tuple[float, str]:
    got = placeholders(r)
    return min(1.0, len(got) / n), _plural(len(got), "placeholder") + (f" ({', '.join(got[:3])})" if got else "")


def _json_format(r: str, keys: list[str] | None = None) -> tuple[float, str]:
    value, error = parse_json(unfence(r).strip())
    if error:
        return 0.0, f"invalid JSON ({error})"
    if not keys:
        return 1.0, "valid JSON"
    if not isinstance(value, dict):
        return 0.0, f"a JSON {type(value).__name__}, not an object"
    miss = [k for k in keys if k not in value]
    found = "a JSON object" + (f" missing {_quoted(miss, 'and')}" if miss else " with all keys")
    return 1 - len(miss) / len(keys), found


def _no_commas(r: str) -> tuple[float, str]:
    n = r.count(",") + r.count("\uff0c")  # ASCII and full-width comma
    return float(n == 0), _plural(n, "comma")


def _punctuation_ban(r: str, chars: str) -> tuple[float, str]:
    banned = sorted(set(chars))
    used = [c for c in banned if c in r]
    return 1 - len(used) / len(banned), f"used {_quoted(used, 'and')}" if used else "none of them"


def _keyword_frequency(r: str, keyword: str, n: int | None = None, max: int | None = None) -> tuple[float, str]:
    got = keyword_count(r, keyword)
    at_least = min(1.0, got / n) if n else 1.0
    return at_least * _within(got, None, max), f"{_plural(got, 'time')}"


def _letter_frequency(r: str, letter: str, min: int | None = None, max: int | None = None) -> tuple[float, str]:
    got = r.lower().count(letter.lower())
    return _within(got, min, max), _plural(got, "time")


def _capital_word_frequency(r: str, min: int | None = None, max: int | None = None) -> tuple[float, str]:
    got = len([w for w in _text_tools.word_tokens(r) if w.isupper()])
    return _within(got, min, max), _plural(got, "all-capital word")


def _response_language(r: str, language: str) -> tuple[float, str]:
    got = _text_tools.language(r)
    return float(got == language), f"language {got}" if got else "no language it could tell"


def _nth_paragraph_first_word(r: str, n: int, nth: int, word: str) -> tuple[float, str]:
    found = paragraphs(r)
    first = _first_word(found[nth - 1]) if nth <= len(found) else ""
    seen = f"{_plural(len(found), 'paragraph')}" + (f", paragraph {nth} starts with '{first}'" if first else "")
    return float(len(found) == n and first == word.lower()), seen


def _first_word(paragraph: str) -> str:
    m = re.match(r"[\W_]*(\w[\w'-]*)", paragraph)
    return m.group(1).lower() if m else ""


def _postscript(r: str, marker: str) -> tuple[float, str]:
    lines = [line.strip() for line in r.splitlines()]
    found = any(line.lower().startswith(marker.lower()) for line in lines if line)
    return float(found), f"a line starting with '{marker}'" if found else f"no line starting with '{marker}'"


CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


def _constrained_response(r: str) -> tuple[float, str]:
    used = [o for o in CONSTRAINED_OPTIONS if o in r]
    return float(len(used) == 1), f"{_quoted(used, 'and')}" if used else "none of the options"


def _highlighted_sections(r: str, n: int) -> tuple[float, str]:
    got = highlights(r)
    return min(1.0, len(got) / n), _plural(len(got), "highlighted section")


def _two_responses(r: str) -> tuple[float, str]:
    parts = [p.strip() for p in r.split("******")]
    inner_empty = any(not p for p in parts[1:-1])
    answers = [p for p in parts if p]
    ok = not inner_empty and len(answers) == 2 and answers[0] != answers[1]
    same = len(answers) == 2 and answers[0] == answers[1]
    return float(ok), f"{_plural(len(answers), 'response')}" + (", the same twice" if same else "")


def _repeat_prompt(r: str, prompt: str) -> tuple[float, str]:
    repeated = r.strip().startswith(prompt.strip())
    return float(repeated), "the request repeated first" if repeated else "no exact repeat of the request first"


def _title(r: str) -> tuple[float, str]:
    m = re.search(r"<<[^<>\n]+>>", r)
    return (1.0, f"the title {m.group(0)}") if m else (0.0, "no <<title>>")


# ---------------------------------------------------------------- the table

@dataclass(frozen=True)
class Checker:
    args: dict[str, tuple[Callable[[Any], str | None], bool]]
    describe: Callable[..., str]
    check: Callable[..., tuple[float, str]]
    bounds: tuple[str, str] | None = None  # (lower, upper) optional args: at least one, lower <= upper


_MIN_MAX = {"min": (_count, False), "max": (_count, False)}
_BOUNDED = ("min", "max")

CHECKERS: dict[str, Checker] = {
    "keyword_include": Checker(
        {"keywords": (_word_list, True)},
        lambda keywords: f"Include the {'keyword' if len(keywords) == 1 else 'keywords'} {_quoted(keywords, 'and')}.",
        _keyword_include),
    "keyword_exclude": Checker(
        {"keywords": (_word_list, True)},
        lambda keywords: f"Do not use the {'word' if len(keywords) == 1 else 'words'} {_quoted(keywords, 'or')}.",
        _keyword_exclude),
    "keyword_frequency": Checker(
        {"keyword": (_text, True), "n": (_positive, False), "max": (_count, False)},
        lambda keyword, n=None, max=None: f"Use the word '{keyword}' {_bounds(n, max)} {_times(n, max)}.",
        _keyword_frequency, bounds=("n", "max")),
    "letter_frequency": Checker(
        {"letter": (_letter, True), **_MIN_MAX},
        lambda letter, min=None, max=None: f"Use the letter '{letter}' {_bounds(min, max)} {_times(min, max)}.",
        _letter_frequency, bounds=_BOUNDED),
    "capital_word_frequency": Checker(
        _MIN_MAX, lambda min=None, max=None: f"Use {_bounds(min, max)} words in all capital letters.",
        _capital_word_frequency, bounds=_BOUNDED),
    "response_language": Checker(
        {"language": (_language_code, True)},
        lambda language: f"Answer in the language with code '{language}' and no other.",
        _response_language),
    "nth_paragraph_first_word": Checker(
        {"n": (_positive, True), "nth": (_positive, True), "word": (_text, True)},
        lambda n, nth, word: f"Write exactly {_plural(n, 'paragraph')} separated by blank lines; "
        f"paragraph {nth} must start with the word '{word}'.",
        _nth_paragraph_first_word),
    "postscript": Checker(
        {"marker": (_text, True)},
        lambda marker: f"End with a postscript starting with '{marker}'.", _postscript),
    "constrained_response": Checker(
        {}, lambda: f"Answer with one of {_quoted(list(CONSTRAINED_OPTIONS), 'or')}", _constrained_response),
    "highlighted_sections": Checker(
        {"n": (_positive, True)},
        lambda n: f"Highlight at least {_plural(n, 'section')} with markdown, like *highlighted section*.",
        _highlighted_sections),
    "two_responses": Checker(
        {}, lambda: "Give two different responses separated by 6 asterisks: ******.", _two_responses),
    "repeat_prompt": Checker(
        {"prompt": (_text, True)},
        lambda prompt: "First repeat the request word for word without change, then give your answer.",
        _repeat_prompt),
    "word_count": Checker(
        _MIN_MAX, lambda min=None, max=None: f"Use {_bounds(min, max)} words.", _word_count, bounds=_BOUNDED),
    "sentence_count": Checker(
        _MIN_MAX, lambda min=None, max=None: f"Write {_bounds(min, max)} sentences.", _sentence_count, bounds=_BOUNDED),
    "char_count": Checker(
        _MIN_MAX, lambda min=None, max=None: f"Use {_bounds(min, max)} characters.", _char_count, bounds=_BOUNDED),
    "paragraph_count": Checker(
        {"n": (_positive, True)},
        lambda n: f"Write exactly {_plural(n, 'paragraph')} separated by blank lines.",
        _paragraph_count),
    "bullet_count": Checker(
        {"n": (_positive, True)},
        lambda n: f"Use exactly {_plural(n, 'bullet point')} starting with '* '.",
        _bullet_count),
    "sections": Checker(
        {"n": (_positive, True), "splitter": (_text, False)},
        lambda n, splitter="SECTION": f"Write {_plural(n, 'section')} marked {splitter} 1"
        f"{f' to {splitter} {n}' if n > 1 else ''}.",
        _sections),
    "starts_with": Checker(
        {"phrase": (_text, True)}, lambda phrase: _sentence(f"Start your response with '{phrase}'"), _starts_with),
    "ends_with": Checker(
        {"phrase": (_text, True)}, lambda phrase: _sentence(f"End your response with '{phrase}'"), _ends_with),
    "quotation": Checker({}, lambda: "Wrap your whole response in double quotes.", _quotation),
    "lowercase": Checker({}, lambda: "Use only lowercase letters.", _lowercase),
    "uppercase": Checker({}, lambda: "Use only capital letters.", _uppercase),
    "placeholders": Checker(
        {"n": (_positive, True)},
        lambda n: f"Include at least {_plural(n, 'placeholder')} in square brackets, like [name].",
        _placeholders),
    "json_format": Checker(
        {"keys": (_key_list, False)},
        lambda keys=None: "Answer in JSON only"
        + (f", with the {'key' if len(keys) == 1 else 'keys'} {_quoted(keys, 'and')}." if keys else "."),
        _json_format),
    "no_commas": Checker({}, lambda: "Do not use any commas.", _no_commas),
    "punctuation_ban": Checker(
        {"chars": (_text, True)},
        lambda chars: f"Do not use the {'character' if len(set(chars)) == 1 else 'characters'} "
        f"{_quoted(sorted(set(chars)), 'or')}.",
        _punctuation_ban),
    "title": Checker({}, lambda: "Include a title in double angular brackets, like <<title>>.", _title),
}


def validate_args(kind: str, args: Any) -> str | None:
    """None when `args` fit `kind`, else what is wrong (the caller names the record and field)."""
    if kind not in CHECKERS:
        return f"unknown constraint kind {kind!r}; known: {', '.join(sorted(CHECKERS))}"
    if not isinstance(args, dict):
        return "must be an object"
    spec = CHECKERS[kind]
    unknown = sorted(set(args) - set(spec.args))
    if unknown:
        return f"unknown argument(s) {', '.join(unknown)} for {kind}; allowed: {', '.join(spec.args) or 'none'}"
    for name, (check, required) in spec.args.items():
        if name not in args:
            if required:
                return f"{kind} needs argument {name!r}"
            continue
        problem = check(args[name])
        if problem:
            return f"{name} {problem}, got {args[name]!r}"
    if spec.bounds:
        lower, upper = spec.bounds
        lo, hi = args.get(lower), args.get(upper)
        if lo is None and hi is None:
            return f"{kind} needs '{lower}' or '{upper}'"
        if lo is not None and hi is not None and lo > hi:
            return f"{lower} {lo} is above {upper} {hi}"
    return None
