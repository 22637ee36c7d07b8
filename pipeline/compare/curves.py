"""Learning curves of a compare folder: each arm's greedy dev reward after each round (DIR/scores/dev), per seed and
as the mean over its seeds with a variance-components interval, and a figure of the measured points.

Row keys: arm ('start' for the start policy), round (the rounds trained; the start policy's row is round 0), mean,
ci_low, ci_high (95%), gain (the mean less the start policy's on the same prompts), gain_ci_low, gain_ci_high,
seeds (those measured), per_seed ({seed: its mean}), prompts. With two seeds or more the interval is the
held-out rows' (analysis.intervals: seed, prompt and cell components of the seeds x prompts rewards); with one
seed it is Student's t over the prompts alone (the seed's variance is not in it); with fewer than two prompts, or
for the start policy's row, there is none (null). Rewards in [0, 1].
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import stats

from tokencredit.pipeline.compare import analysis
from tokencredit.pipeline.compare.registry import save_figure


def load_dev(out: Path) -> list[dict]:
    """DIR/scores/dev's results: the start policy's first, then each (arm, seed) after each round."""
    dev = out / "scores" / "dev"
    paths = [dev / "start.json", *sorted(dev.glob("*/round-*.json"))]
    return [json.loads(p.read_text()) for p in paths if p.is_file()]


def greedy(result: dict) -> dict[str, float]:
    """{dev prompt id: greedy reward} of one scored policy."""
    return {prompt: cell["reward"] for prompt, cell in result["decodes"]["greedy"].items()}


def mean_interval(cell: np.ndarray) -> tuple[float, float | None, float | None]:
    """(mean, 95% low, high) of cell [S, P]: variance components with S >= 2, Student's t over prompts with S = 1,
    no interval with P < 2."""
    seeds, prompts = cell.shape
    mean = float(cell.mean())
    if prompts < 2:
        return mean, None, None
    if seeds >= 2:
        row = analysis.intervals(cell)
        return mean, float(row["ci_low"]), float(row["ci_high"])
    half = float(stats.t.ppf(0.975, prompts - 1) * cell[0].std(ddof=1) / np.sqrt(prompts))
    return mean, mean - half, mean + half


def curve_rows(results: list[dict]) -> list[dict]:
    """One row for the start policy and one per (arm, round) measured, from `load_dev`'s results."""
    start = next((greedy(r) for r in results if r.get("arm") is None), None)
    rows = [] if start is None else [{"arm": "start", "round": 0, "mean": float(np.mean(list(start.values()))),
                                      "ci_low": None, "ci_high": None, "gain": 0.0, "gain_ci_low": None,
                                      "gain_ci_high": None, "seeds": [], "per_seed": {}, "prompts": len(start)}]
    groups: dict[tuple[str, int], dict[int, dict[str, float]]] = {}
    for result in results:
        if result.get("arm") is not None:
            groups.setdefault((result["arm"], result["round"]), {})[result["seed"]] = greedy(result)
    for (arm, r), by_seed in sorted(groups.items()):
        seeds = sorted(by_seed)
        prompts = sorted(set.intersection(*(set(by_seed[s]) for s in seeds), *([set(start)] if start else [])))
        cell = np.array([[by_seed[s][p] for p in prompts] for s in seeds]).reshape(len(seeds), len(prompts))
        mean, low, high = mean_interval(cell)
        gain = (mean_interval(cell - np.array([start[p] for p in prompts])) if start and prompts
                else (None, None, None))
        rows.append({"arm": arm, "round": r, "mean": mean, "ci_low": low, "ci_high": high, "gain": gain[0],
                     "gain_ci_low": gain[1], "gain_ci_high": gain[2], "seeds": seeds,
                     "per_seed": {str(s): float(cell[i].mean()) for i, s in enumerate(seeds)},
                     "prompts": len(prompts)})
    return rows


def curve_table(rows: list[dict]) -> list[str]:
    """Markdown lines: one per row."""
    def ci(low, high, sign: str = "") -> str:
        return "" if low is None else f" [{low:{sign}.4f}, {high:{sign}.4f}]"

    lines = ["| arm | rounds | dev reward [95%] | gain over the start [95%] | seeds | prompts |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        gain = "" if r["gain"] is None else f"{r['gain']:+.4f}{ci(r['gain_ci_low'], r['gain_ci_high'], '+')}"
        lines.append(f"| {r['arm']} | {r['round']} | {r['mean']:.4f}{ci(r['ci_low'], r['ci_high'])} | {gain} "
                     f"| {len(r['seeds'])} | {r['prompts']} |")
    return lines


def plot_curves(rows: list[dict], path: Path) -> None:
    """Dev reward against rounds for every arm: each seed's measured points (small, joined by straight lines), the
    arm's mean with its interval, the start policy at round 0; measured points only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = next((r for r in rows if r["arm"] == "start"), None)
    arms = sorted({r["arm"] for r in rows} - {"start"})
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, arm in enumerate(arms):
        color, shift = f"C{i}", 0.04 * (i - (len(arms) - 1) / 2)  # apart, so that intervals do not hide each other
        mine = sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["round"])
        for seed in sorted({s for r in mine for s in r["per_seed"]}, key=int):
            points = [(r["round"], r["per_seed"][seed]) for r in mine if seed in r["per_seed"]]
            if start:
                points.insert(0, (0, start["mean"]))
            ax.plot([x + shift for x, _ in points], [y for _, y in points], "-", marker=".", color=color, lw=0.6,
                    alpha=0.45, ms=4)
        xs = [r["round"] + shift for r in mine]
        ys = [r["mean"] for r in mine]
        errors = [[0 if r["ci_low"] is None else r["mean"] - r["ci_low"] for r in mine],
                  [0 if r["ci_high"] is None else r["ci_high"] - r["mean"] for r in mine]]
        ax.errorbar(xs, ys, yerr=errors, fmt="o-", color=color, capsize=3, lw=1.6, label=arm)
    if start:
        ax.plot([0], [start["mean"]], "ks", label="start policy")
    ax.set_xticks(sorted({r["round"] for r in rows}))
    ax.set_xlabel("rounds trained")
    ax.set_ylabel("greedy dev reward")
    ax.set_title("each arm's mean over seeds (95% interval); thin lines: each seed", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
