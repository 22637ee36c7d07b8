"""Where a credit points: the token it penalizes most, the cut that `repair` and `values` share."""
from __future__ import annotations

from collections.abc import Sequence


def penalty_cut(advantage: Sequence[float]) -> int:
    """t* = argmax_t of the penalty -A[k,t] (the earliest of ties: 0 for a uniform credit)."""
    return min(range(len(advantage)), key=lambda t: (advantage[t], t)) if advantage else 0
