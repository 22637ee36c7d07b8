"""The statistics of `tokencredit compare`: a difference between two arms, its variance components and interval.

Data of one difference: `diff[s, p, d]` = reward of the arm minus the baseline's, trained seed `s` (the two arms
share a seed's batch order), held-out prompt `p`, decode `d` (greedy and sampled decodes, the same sampling seed
for both arms). Decodes are averaged within a cell first, so the model is two-way crossed with one value per cell:

    cell[s, p] = mu + seed[s] + prompt[p] + e[s, p],   var seed = var_seed, prompt = var_prompt, e = var_cell

(`var_cell` holds the seed x prompt interaction and the decoding noise of the cell mean; `var_decode` splits off
the noise between decodes of one cell, where a cell has more than one). The estimate is the grand mean; its
variance var_seed / S + var_prompt / P + var_cell / (S P) is estimated with the ANOVA (method of moments)
mean squares, the interval is Student's t with Satterthwaite's degrees of freedom. The crossed seeds x prompts
bootstrap (each replicate resamples seeds and prompts) counts the cell term about three times (once in each
resampled margin and once in the cells): it is kept as a column for the older rows, which used it, and it
over-covers where the cell term dominates and under-covers where a real seed term meets few seeds
(tests/test_compare_analysis.py prints both coverages). Where the seed and the prompt components are both 0 the
variance-components interval is conservative (its variance is floored at the cells' own share; about 0.98 in
simulation).

Units: rewards in [0, 1]; variances in reward units squared.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

# Two-sided 5% test with 80% power: the detectable difference is (t_0.975 + t_0.80) standard errors.
ALPHA, POWER = 0.05, 0.80


@dataclass(frozen=True)
class Components:
    """Variance components of a difference (reward units squared), clamped at 0, and the mean squares they
    come from; `var_decode` is the within-cell variance between decodes (None with one decode per cell)."""

    var_seed: float
    var_prompt: float
    var_cell: float
    var_decode: float | None
    ms_seed: float
    ms_prompt: float
    ms_cell: float
    seeds: int
    prompts: int
    decodes: int


def components(diff) -> Components:
    """ANOVA estimates of the components of `diff` [S, P] or [S, P, D] (S >= 2, P >= 2)."""
    diff = np.asarray(diff, dtype=float)
    if diff.ndim == 2:
        diff = diff[..., None]
    n_seeds, n_prompts, n_decodes = diff.shape
    if n_seeds < 2 or n_prompts < 2:
        raise ValueError(f"variance components need >= 2 seeds and >= 2 prompts, got {n_seeds} x {n_prompts}")
    cell = diff.mean(axis=2)
    ms_seed, ms_prompt, ms_cell = _mean_squares(cell)
    var_decode = float(diff.var(axis=2, ddof=1).mean()) if n_decodes > 1 else None
    return Components(var_seed=max(float(ms_seed - ms_cell) / n_prompts, 0.0),
                      var_prompt=max(float(ms_prompt - ms_cell) / n_seeds, 0.0), var_cell=float(ms_cell),
                      var_decode=var_decode, ms_seed=float(ms_seed), ms_prompt=float(ms_prompt),
                      ms_cell=float(ms_cell), seeds=n_seeds, prompts=n_prompts, decodes=n_decodes)


def _mean_squares(cell: np.ndarray) -> tuple:
    """(MS seed, MS prompt, MS residual) of cell [..., S, P]: expected values var_cell + P var_seed,
    var_cell + S var_prompt, var_cell."""
    n_seeds, n_prompts = cell.shape[-2:]
    grand = cell.mean(axis=(-2, -1), keepdims=True)
    by_seed = cell.mean(axis=-1, keepdims=True)
    by_prompt = cell.mean(axis=-2, keepdims=True)
    ms_seed = n_prompts * ((by_seed - grand) ** 2).sum(axis=(-2, -1)) / (n_seeds - 1)
    ms_prompt = n_seeds * ((by_prompt - grand) ** 2).sum(axis=(-2, -1)) / (n_prompts - 1)
    ms_cell = ((cell - by_seed - by_prompt + grand) ** 2).sum(axis=(-2, -1)) / ((n_seeds - 1) * (n_prompts - 1))
    return ms_seed, ms_prompt, ms_cell


def _se_df(ms_seed, ms_prompt, ms_cell, n_seeds: int, n_prompts: int):
    """Standard error of the grand mean and its Satterthwaite degrees of freedom, from the mean squares.

    var(mean) = var_seed / S + var_prompt / P + var_cell / (S P) = (MS_seed + MS_prompt - MS_cell) / (S P),
    unbiased: the components are not clamped here (clamping a component whose truth is 0 at 0 biases the
    variance up and the interval over-covers); a sum below the cells' own share, MS_cell / (S P), which a
    negative margin estimate can give, is raised to it."""
    total = np.maximum(ms_seed + ms_prompt - ms_cell, ms_cell)
    variance = total / (n_seeds * n_prompts)
    df_terms = (ms_seed ** 2 / (n_seeds - 1) + ms_prompt ** 2 / (n_prompts - 1)
                + ms_cell ** 2 / ((n_seeds - 1) * (n_prompts - 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(df_terms > 0, total ** 2 / np.where(df_terms > 0, df_terms, 1), 1e9)
    return np.sqrt(variance), np.clip(df, 1.0, 1e9)


def detectable_factor(df) -> np.ndarray:
    """Standard errors in the detectable difference at 80% power, two-sided 5%: t_0.975 + t_0.80 (2.80 for a
    normal estimate)."""
    return stats.t.ppf(1 - ALPHA / 2, df) + stats.t.ppf(POWER, df)


def intervals(cell, level: float = 0.95) -> dict:
    """The variance-components interval of the mean of `cell` [..., S, P] (decodes already averaged per
    cell), vectorised over the leading axes. Arrays diff, ci_low, ci_high, se, df, mde (80% power, 5%)."""
    cell = np.asarray(cell, dtype=float)
    n_seeds, n_prompts = cell.shape[-2:]
    se, df = _se_df(*_mean_squares(cell), n_seeds, n_prompts)
    mean = cell.mean(axis=(-2, -1))
    half = stats.t.ppf(0.5 + level / 2, df) * se
    return {"diff": mean, "ci_low": mean - half, "ci_high": mean + half, "se": se, "df": df,
            "mde": detectable_factor(df) * se}


def crossed_means(cells, draws: int = 10_000, seed: int = 0):
    """Bootstrap replicates of the mean of seeds x prompts arrays, seeds and prompts resampled together.

    cells: [..., S, P] (every leading array resampled with the same draws, so replicates of a ratio pair
    up). Each replicate draws P prompts and S seeds with replacement, independently, and averages the
    S x P drawn cells; returns [..., draws]. The prompts are drawn first, so with one seed the replicates are
    a prompts-only bootstrap's over the same prompts.
    """
    cells = np.asarray(cells, dtype=float)
    n_seeds, n_prompts = cells.shape[-2:]
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, n_prompts, size=(draws, n_prompts))
    seeds = rng.integers(0, n_seeds, size=(draws, n_seeds))
    counts = np.bincount((np.arange(draws)[:, None] * n_prompts + prompts).ravel(),
                         minlength=draws * n_prompts).reshape(draws, n_prompts)
    per_seed = cells @ counts.T / n_prompts  # [..., S, draws]: each seed's mean over the drawn prompts
    return per_seed[..., seeds.T, np.arange(draws)].mean(axis=-2)


def crossed_interval(cell, draws: int = 10_000, seed: int = 0) -> dict:
    """The crossed bootstrap's 95% percentile interval and detectable difference (2.8 bootstrap standard
    errors) of the mean of cell [S, P]: the older rows' `ci_low_seeds`, `ci_high_seeds`, `mde_seeds`."""
    means = crossed_means(cell, draws, seed)
    low, high = np.quantile(means, [0.025, 0.975])
    return {"ci_low": float(low), "ci_high": float(high), "mde": float(2.8 * means.std())}


def difference(arm, baseline) -> dict:
    """One row of a comparison: arm and baseline rewards [S, P, D] (or [S, P]), paired by seed, prompt and
    decode. Keys: diff, ci_low, ci_high, mde (variance components), per_seed_diff, the components
    (var_seed, var_prompt, var_cell, var_decode), se, df, and the crossed bootstrap's ci_low_crossed,
    ci_high_crossed, mde_crossed beside them; seeds, prompts, decodes."""
    diff = np.asarray(arm, dtype=float) - np.asarray(baseline, dtype=float)
    if diff.ndim == 2:
        diff = diff[..., None]
    cell = diff.mean(axis=2)
    comp = components(diff)
    row = intervals(cell)
    crossed = crossed_interval(cell)
    return {"diff": float(row["diff"]), "ci_low": float(row["ci_low"]), "ci_high": float(row["ci_high"]),
            "mde": float(row["mde"]), "se": float(row["se"]), "df": float(row["df"]),
            "per_seed_diff": [float(x) for x in cell.mean(axis=1)],
            "var_seed": comp.var_seed, "var_prompt": comp.var_prompt, "var_cell": comp.var_cell,
            "var_decode": comp.var_decode, "seeds": comp.seeds, "prompts": comp.prompts, "decodes": comp.decodes,
            "ci_low_crossed": crossed["ci_low"], "ci_high_crossed": crossed["ci_high"],
            "mde_crossed": crossed["mde"]}


def mde_for(var_seed: float, var_prompt: float, var_cell: float, seeds, prompts, *, var_decode: float | None = None,
            pilot_decodes: int = 1, decodes=None) -> np.ndarray:
    """The detectable difference of a design of `seeds` x `prompts` (x `decodes`), from a pilot's components.

    The pilot's `var_cell` holds its decoding noise divided by `pilot_decodes`; with `var_decode` measured (the
    variance between decodes of one cell), the cell term of a design with D decodes is var_cell -
    var_decode / pilot_decodes + var_decode / D. Without it (a greedy-only pilot) the cell term is taken as
    unchanged by more decodes: the plan does not count on a gain it has not measured. Degrees of freedom by
    Satterthwaite from the expected mean squares. Broadcasts over seeds, prompts, decodes."""
    seeds, prompts = np.asarray(seeds, dtype=float), np.asarray(prompts, dtype=float)
    cell = np.asarray(var_cell, dtype=float)
    if var_decode is not None and decodes is not None:
        cell = np.maximum(var_cell - var_decode / pilot_decodes, 0.0) + var_decode / np.asarray(decodes, dtype=float)
    ms_seed, ms_prompt = cell + prompts * var_seed, cell + seeds * var_prompt
    se, df = _se_df(ms_seed, ms_prompt, cell, seeds, prompts)
    return detectable_factor(df) * se
