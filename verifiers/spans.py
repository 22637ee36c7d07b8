"""Verifier spans: the characters of a response that violate a reward (method.md section 2,
"Verifier-located relevance").

A span is `(start, end)`, character offsets into the response string with 0 <= start < end <=
len(response); a reward's spans are sorted by start and do not overlap. A built-in check builds its
spans with the helpers here (`merged` makes them valid); `check` validates any reward's spans, as a
score is validated, and names the reward in its error.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

Span = tuple[int, int]


def problem(spans: object, length: int) -> str | None:
    """None when `spans` is a valid span sequence for a response of `length` characters, else what is wrong."""
    if not isinstance(spans, (tuple, list)):
        return f"spans must be a list of (start, end) pairs, got {type(spans).__name__}"
    previous_end = 0
    for n, span in enumerate(spans):
        ok = isinstance(span, (tuple, list)) and len(span) == 2 and all(type(x) is int for x in span)
        if not ok:
            return f"span {n} is {span!r}, expected a pair of integers (start, end)"
        start, end = span
        if not 0 <= start < end <= length:
            return f"span {n} ({start}, {end}) is not inside the response (0 <= start < end <= {length})"
        if start < previous_end:
            return f"span {n} ({start}, {end}) overlaps or precedes the span before it (spans must be sorted, disjoint)"
        previous_end = end
    return None


def check(spans: object, response: str, where: str) -> tuple[Span, ...]:
    """The spans as a tuple of pairs; ValueError naming `where` (record and reward) when they are invalid."""
    why = problem(spans, len(response))
    if why:
        raise ValueError(f"{where}: {why}")
    return tuple((int(s), int(e)) for s, e in spans)


def merged(spans: Iterable[Span]) -> tuple[Span, ...]:
    """Sorted, overlapping or touching spans joined, empty ones dropped: a valid span sequence."""
    out: list[list[int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return tuple((s, e) for s, e in out)


def matches(pattern: str | re.Pattern, text: str, flags: int = 0, offset: int = 0) -> list[Span]:
    """The spans of every match of `pattern` in `text`, shifted by `offset`."""
    found = re.finditer(pattern, text, flags) if isinstance(pattern, str) else pattern.finditer(text)
    return [(m.start() + offset, m.end() + offset) for m in found if m.end() > m.start()]


def word(name: str, text: str, offset: int = 0) -> list[Span]:
    """Case-insensitive occurrences of `name` in `text` with no word character either side (as
    `checkers.keyword_count` counts them)."""
    return matches(r"(?<!\w)" + re.escape(name) + r"(?!\w)", text, re.IGNORECASE, offset)


def covering(spans: Sequence[Span]) -> Span | None:
    """One span from the first start to the last end, None for no spans."""
    return (spans[0][0], spans[-1][1]) if spans else None
