"""Response parts for the credit analysis: per-character labels -> contiguous labelled spans."""
from __future__ import annotations

import itertools


def label_runs(labels: list[str]) -> list[tuple[int, int, str]]:
    """[(start, end, label)] covering the characters, one span per run of equal labels."""
    spans, pos = [], 0
    for label, group in itertools.groupby(labels):
        n = sum(1 for _ in group)
        spans.append((pos, pos + n, label))
        pos += n
    return spans
