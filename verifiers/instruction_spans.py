"""Where a response violates an instruction constraint: the spans of `tokencredit.verifiers.spans` per kind.

    spans_for("no_commas", "Yes, it is.", {}) -> ((3, 4),)

A kind is here when the check can say which characters break it:
    keyword_exclude     every occurrence of a forbidden keyword (whole word, any case)
    no_commas           every comma (ASCII and full-width)
    punctuation_ban     every banned character
    word_count          max: the words past the limit (from the first word too many to the last word)
    sentence_count      max: the sentences past the limit
    paragraph_count     too many: the paragraphs past the asked number
    bullet_count        too many: the bullet points past the asked number
    char_count          max: the characters past the limit
    keyword_frequency   max: the occurrences past the limit
    letter_frequency    max: the occurrences past the limit
    starts_with         the opening words that differ from the phrase's, word against word
    ends_with           the closing words that differ from the phrase's, aligned from the end; text after
                        the phrase's last occurrence when the response goes on past it
    quotation           the first and/or last character where a double quote is missing
    lowercase           every word with a capital letter
    uppercase           every word with a lowercase letter
    title               a malformed title (<title>, <<title>, ...) where no <<title>> exists
    placeholders        an opened placeholder never closed on its line ([name)
Kinds not listed (a missing keyword, too few words, the language, ...) have no place in the response:
their spans are empty, and the credit stays uniform or comes from the replay.
`spans_for` is called only for a failed (score < 1) constraint.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from tokencredit.verifiers import text as _text
from tokencredit.verifiers.spans import Span, matches, merged, word

_WORD = re.compile(r"\w+(?:'\w+)*")  # the words `checkers.words` counts (the same pattern)


def _bounds(r: str) -> tuple[int, int]:
    """[start, end) of the response without its surrounding whitespace."""
    return len(r) - len(r.lstrip()), len(r.rstrip())


def _past(spans: list[Span], limit: int | None) -> list[Span]:
    """The items past the first `limit` as one span (the whole excess), none when within it."""
    if limit is None or len(spans) <= limit:
        return []
    return [(spans[limit][0], spans[-1][1])]


def _keyword_exclude(r: str, keywords: list[str]) -> list[Span]:
    return [s for k in keywords for s in word(k, r)]


def _no_commas(r: str) -> list[Span]:
    return matches(r"[,\uff0c]", r)


def _punctuation_ban(r: str, chars: str) -> list[Span]:
    return matches("[" + re.escape("".join(sorted(set(chars)))) + "]", r)


def _word_count(r: str, min: int | None = None, max: int | None = None) -> list[Span]:
    return _past(matches(_WORD, r), max)


def _sentence_count(r: str, min: int | None = None, max: int | None = None) -> list[Span]:
    """Past the sentences found (`count_limit`), the excess runs to the end of the text."""
    limit = _text.count_limit(min, max)
    spans = _text.sentence_spans(r, limit, with_word=True)
    if len(spans) == limit:
        spans[-1] = (spans[-1][0], len(r.rstrip()))
    return _past(spans, max)


def _paragraph_count(r: str, n: int) -> list[Span]:
    """Paragraphs as `checkers.paragraphs` splits them (at blank lines), as spans without their whitespace."""
    pieces, start = [], 0
    for gap in [*re.finditer(r"\n[ \t]*\n", r), None]:
        end = gap.start() if gap else len(r)
        text = r[start:end]
        if text.strip():
            pieces.append((start + len(text) - len(text.lstrip()), start + len(text.rstrip())))
        start = gap.end() if gap else end
    return _past(pieces, n)


def _bullet_count(r: str, n: int) -> list[Span]:
    return _past(matches(r"^[ \t]*[*-][ \t]+\S.*$", r, re.MULTILINE), n)  # `checkers.bullets`' pattern


def _char_count(r: str, min: int | None = None, max: int | None = None) -> list[Span]:
    start, end = _bounds(r)
    return [(start + max, end)] if max is not None and end - start > max else []


def _keyword_frequency(r: str, keyword: str, n: int | None = None, max: int | None = None) -> list[Span]:
    return word(keyword, r)[max:] if max is not None else []


def _letter_frequency(r: str, letter: str, min: int | None = None, max: int | None = None) -> list[Span]:
    return matches(re.escape(letter), r, re.IGNORECASE)[max:] if max is not None else []


def _starts_with(r: str, phrase: str) -> list[Span]:
    start, end = _bounds(r)
    return _differing_words(r, phrase, from_end=False) or [(start, min(end, start + len(phrase.strip())))]


def _ends_with(r: str, phrase: str) -> list[Span]:
    start, end = _bounds(r)
    at = r.rfind(phrase.strip(), start, end)
    if at >= 0:  # the phrase is there, followed by more text: that text is what is wrong
        after = at + len(phrase.strip())
        return [(after + len(r[after:end]) - len(r[after:end].lstrip()), end)]
    return _differing_words(r, phrase, from_end=True) or [(max(start, end - len(phrase.strip())), end)]


def _differing_words(r: str, phrase: str, from_end: bool) -> list[Span]:
    """The whitespace-separated words of the response that differ from the phrase's, word against word from
    the start (or the end); none when every compared word matches (a difference in spacing)."""
    got, want = list(re.finditer(r"\S+", r)), phrase.split()
    if from_end:
        got, want = got[::-1], want[::-1]
    return sorted((m.start(), m.end()) for m, w in zip(got, want) if m.group() != w)


def _quotation(r: str) -> list[Span]:
    start, end = _bounds(r)
    if end - start < 2:
        return [(start, end)]
    return ([(start, start + 1)] if r[start] != '"' else []) + ([(end - 1, end)] if r[end - 1] != '"' else [])


def _case(r: str, want_lower: bool) -> list[Span]:
    return [(m.start(), m.end()) for m in _WORD.finditer(r)
            if (m.group() != m.group().lower() if want_lower else m.group() != m.group().upper())]


def _title(r: str) -> list[Span]:
    return matches(r"<{1,2}[^<>\n]+>{1,2}", r)  # called only without a <<title>>: every one is malformed


def _placeholders(r: str) -> list[Span]:
    return matches(r"\[[^\[\]\n]*(?=\n|$)", r)


SPANS: dict[str, Callable[..., list[Span]]] = {
    "keyword_exclude": _keyword_exclude,
    "no_commas": _no_commas,
    "punctuation_ban": _punctuation_ban,
    "word_count": _word_count,
    "sentence_count": _sentence_count,
    "paragraph_count": _paragraph_count,
    "bullet_count": _bullet_count,
    "char_count": _char_count,
    "keyword_frequency": _keyword_frequency,
    "letter_frequency": _letter_frequency,
    "starts_with": _starts_with,
    "ends_with": _ends_with,
    "quotation": _quotation,
    "lowercase": lambda r: _case(r, want_lower=True),
    "uppercase": lambda r: _case(r, want_lower=False),
    "title": _title,
    "placeholders": lambda r, n: _placeholders(r),
}


def spans_for(kind: str, response: str, args: dict) -> tuple[Span, ...]:
    """The violating spans of a failed constraint of `kind` (valid: sorted, disjoint); () where it cannot say."""
    fn = SPANS.get(kind)
    return merged(fn(response, **args)) if fn is not None else ()


__all__ = ["SPANS", "spans_for"]
