"""The run's `training` view read as rows, with the advantage a trainer asked for by name.

An advantage is a kind of the view ("gdpo", "mrtpo", "p2t", "mc") or a mix such as "mrtpo:0.5,gdpo:0.5",
the coefficient-weighted sum per token; every per-token list aligns with `token_ids`.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from tokencredit.pipeline.dataset.query import connect

ADVANTAGE_KINDS = ("gdpo", "mrtpo", "p2t", "mc")
# The largest sum of a mix's |coefficients|: the view's advantages are normalized (|A| rarely past 10^2), so a mix
# stays 30 orders below float32's largest number, where 'gdpo:3.4e38,mrtpo:3.4e38' made 830 of 1,354 of them inf;
# a value that still overflows is refused when it is read (`check_finite_advantages`)
MAX_MIX_WEIGHT = 1e6
FLOAT32_MAX = float(np.finfo(np.float32).max)  # what the exports and the trainer hold an advantage in


def parse_advantage(spec: str) -> dict[str, float]:
    """'mrtpo' -> {'mrtpo': 1.0}; 'mrtpo:0.5,gdpo:0.5' -> {'mrtpo': 0.5, 'gdpo': 0.5}. ValueError naming the
    coefficient when one is not a finite number, and when their absolute values sum past MAX_MIX_WEIGHT."""
    mix: dict[str, float] = {}
    for part in spec.split(","):
        kind, _, coef = part.strip().partition(":")
        if kind not in ADVANTAGE_KINDS:
            raise ValueError(f"unknown advantage kind {kind!r} in {spec!r}: choose from "
                             f"{', '.join(ADVANTAGE_KINDS)} or a mix like 'mrtpo:0.5,gdpo:0.5'")
        try:
            weight = float(coef) if coef else 1.0
        except ValueError:
            raise ValueError(f"advantage {spec!r}: coefficient {coef!r} of {kind!r} is not a number") from None
        if not math.isfinite(weight):  # NaN or inf (1e400) would make every advantage NaN or inf; a negative is a
            # choice ('mrtpo:2,gdpo:-1' is MRTPO with beta 1 from beta 0.5 columns)
            raise ValueError(f"advantage {spec!r}: coefficient {coef!r} of {kind!r} is not a finite number")
        mix[kind] = mix.get(kind, 0.0) + weight
    if sum(abs(c) for c in mix.values()) > MAX_MIX_WEIGHT:
        raise ValueError(f"advantage {spec!r}: the coefficients' absolute values sum past {MAX_MIX_WEIGHT:g}; the "
                         f"weighted advantages could overflow float32 (largest {FLOAT32_MAX:.3g})")
    return mix


def read_training(data: str | Path, advantage: str | None, allow_incomplete: bool = False) -> list[dict[str, Any]]:
    """Rows of the run's `training` view (ordered by response_id); with `advantage` given, each row
    also has `advantages`: the chosen kind, or the coefficient-weighted sum of a mix, per token.

    Raises ValueError naming the kind, the run directory and a response id when the kind's column
    is missing or NULL, or when a list is not aligned with token_ids.
    """
    mix = parse_advantage(advantage) if advantage is not None else {}
    columns = ", ".join(["response_id", "group_id", "task", "prompt", "response", "prompt_token_ids",
                         "token_ids", "sample_logprobs", "sft_weight", "passed_all", *(f"adv_{k}" for k in mix)])
    try:
        rows = connect(data, allow_incomplete=allow_incomplete).sql(
            f"SELECT {columns} FROM training ORDER BY response_id").to_arrow_table().to_pylist()
    except duckdb.BinderException as err:
        raise ValueError(f"run dir {data}: cannot read advantage {advantage!r} from the training view "
                         f"({str(err).splitlines()[0]})") from err
    if not rows:
        raise ValueError(f"run dir {data}: the training view is empty (no response with status 'ok')")
    for row in rows:
        for kind in mix:
            if row[f"adv_{kind}"] is None:
                missing = sum(r[f"adv_{kind}"] is None for r in rows)
                raise ValueError(f"run dir {data}: advantage kind {kind!r} (column adv_{kind}) is NULL for "
                                 f"{missing} of {len(rows)} responses, e.g. response {row['response_id']!r}; "
                                 f"that credit was not computed for this run: choose another kind")
            check_aligned(row, data, f"adv_{kind}")
        check_aligned(row, data, "sft_weight")  # after the kinds: it derives from adv_mrtpo or adv_mc
        if mix:
            per_kind = [np.asarray(row[f"adv_{k}"], dtype=np.float64) * c for k, c in mix.items()]
            row["advantages"] = np.sum(per_kind, axis=0).tolist()
            check_finite_advantages(row, data, advantage)
    return rows


def check_finite_advantages(row: dict[str, Any], data: str | Path, advantage: str) -> None:
    """ValueError naming the response and token where the row's `advantages` hold NaN, an infinity or a value past
    float32's range (what the trainer and the exports hold them in)."""
    values = np.asarray(row["advantages"], dtype=np.float64)
    bad = np.flatnonzero(~(np.abs(values) <= FLOAT32_MAX))  # NaN compares false
    if bad.size:
        raise ValueError(f"run dir {data}: response {row['response_id']!r}: advantage {advantage!r} is "
                         f"{values[bad[0]]:.3g} at token {bad[0]} ({bad.size} of {values.size} tokens are not finite "
                         f"float32 numbers); choose smaller coefficients or check the run's credit columns")


def check_aligned(row: dict[str, Any], data: str | Path, field: str) -> None:
    if len(row[field]) != len(row["token_ids"]):
        raise ValueError(f"run dir {data}: response {row['response_id']!r}: field {field!r} has "
                         f"{len(row[field])} values for {len(row['token_ids'])} tokens")
