"""Response parts for the credit analysis: per-character labels -> contiguous labelled spans."""
from __future__ import annotations

import itertools
import operator


def label_runs(labels: list[str]) -> list[tuple[int, int, str]]:
    """[(start, end, label)] covering the characters, one span per run of equal labels."""
    # the label changes found by C-level iteration: a 2 MB response's labels are 2 million items
    changes = itertools.compress(range(1, len(labels)), map(operator.ne, labels, labels[1:]))
    cuts = [0, *changes, len(labels)] if labels else []
    return [(start, end, labels[start]) for start, end in zip(cuts, cuts[1:])]
