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
All other kinds are binary. Keywords match whole words, case-insensitively; starts_with and
ends_with compare exactly, ignoring surrounding whitespace.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_SHOWN_CHARS = 30  # longest piece of the response quoted in a `found` note


# ---------------------------------------------------------------- counting (shared with the demo builder)

def words(text: str) -> list[str]:
    return re.findall(r"\w+(?:'\w+)*", text)


def sentences(text: str) -> list[str]:
    """Pieces ended by . ! or ? followed by whitespace (or the end); pieces without a word do not count."""
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if re.search(r"\w", s)]


def paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n[ \t]*\n", text.strip()) if p.strip()]


def bullets(text: str) -> list[str]:
    return re.findall(r"^[ \t]*[*-][ \t]+\S.*$", text, re.MULTILINE)


def section_numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^[ \t]*SECTION[ \t]+(\d{1,6})\b", text, re.MULTILINE)]


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
    n = len(sentences(r))
    return _within(n, min, max), _plural(n, "sentence")


def _char_count(r: str, min: int | None = None, max: int | None = None) -> tuple[float, str]:
    n = len(r.strip())
    return _within(n, min, max), _plural(n, "character")


def _paragraph_count(r: str, n: int) -> tuple[float, str]:
    got = len(paragraphs(r))
    return float(got == n), _plural(got, "paragraph")


def _bullet_count(r: str, n: int) -> tuple[float, str]:
    got = len(bullets(r))
    return float(got == n), _plural(got, "bullet point")


def _sections(r: str, n: int) -> tuple[float, str]:
    got = section_numbers(r)
    found = "SECTION " + ", ".join(map(str, got)) if got else "no SECTION headers"
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
    value, error = parse_json(r.strip())
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


def _keyword_frequency(r: str, keyword: str, n: int) -> tuple[float, str]:
    got = keyword_count(r, keyword)
    return min(1.0, got / n), f"{_plural(got, 'time')}"


def _title(r: str) -> tuple[float, str]:
    m = re.search(r"<<[^<>\n]+>>", r)
    return (1.0, f"the title {m.group(0)}") if m else (0.0, "no <<title>>")


# ---------------------------------------------------------------- the table

@dataclass(frozen=True)
class Checker:
    args: dict[str, tuple[Callable[[Any], str | None], bool]]
    describe: Callable[..., str]
    check: Callable[..., tuple[float, str]]
    bounded: bool = False  # takes optional `min`/`max`: at least one, min <= max


_MIN_MAX = {"min": (_count, False), "max": (_count, False)}

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
        {"keyword": (_text, True), "n": (_positive, True)},
        lambda keyword, n: f"Use the word '{keyword}' at least {_plural(n, 'time')}.",
        _keyword_frequency),
    "word_count": Checker(
        _MIN_MAX, lambda min=None, max=None: f"Use {_bounds(min, max)} words.", _word_count, bounded=True),
    "sentence_count": Checker(
        _MIN_MAX, lambda min=None, max=None: f"Write {_bounds(min, max)} sentences.", _sentence_count, bounded=True),
    "char_count": Checker(
        _MIN_MAX, lambda min=None, max=None: f"Use {_bounds(min, max)} characters.", _char_count, bounded=True),
    "paragraph_count": Checker(
        {"n": (_positive, True)},
        lambda n: f"Write exactly {_plural(n, 'paragraph')} separated by blank lines.",
        _paragraph_count),
    "bullet_count": Checker(
        {"n": (_positive, True)},
        lambda n: f"Use exactly {_plural(n, 'bullet point')} starting with '* '.",
        _bullet_count),
    "sections": Checker(
        {"n": (_positive, True)},
        lambda n: f"Write {_plural(n, 'section')} marked SECTION 1{' to SECTION ' + str(n) if n > 1 else ''}.",
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
    if spec.bounded:
        lo, hi = args.get("min"), args.get("max")
        if lo is None and hi is None:
            return f"{kind} needs 'min' or 'max'"
        if lo is not None and hi is not None and lo > hi:
            return f"min {lo} is above max {hi}"
    return None
