"""The report of a compare folder: one row per difference (analysis.difference), the per-kind breakdown
(exploratory), a plot of the measured points, written as DIR/compare.json, DIR/report.md and DIR/compare.png; the
learning curves on the dev prompts (curves.py) beside them, DIR/learning_curve.png.

Row keys: method, baseline, diff, ci_low, ci_high, mde, per_seed_diff, seeds, prompts, decodes, design_hash,
design_commit, exploratory, var_seed, var_prompt, var_cell; beside them var_decode, se, df, the crossed
bootstrap's ci_low_crossed, ci_high_crossed, mde_crossed, primary, met (the target mde, where the design has one)
and scored_before_commit (the policies of the row scored before the design's commit).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from tokencredit.pipeline.compare import analysis, curves
from tokencredit.pipeline.compare.registry import (exploratory_arms, save_figure, scored_before_commit, temporary,
                                                     write_json)
from tokencredit.pipeline.interrupts import hold

KEYS = ("method", "baseline", "diff", "ci_low", "ci_high", "mde", "per_seed_diff", "seeds", "prompts", "decodes",
        "design_hash", "design_commit", "exploratory", "var_seed", "var_prompt", "var_cell")


def load_scores(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((out / "scores").glob("*.json"))}


def kind_of(reward: str) -> str:
    """A reward's kind: its name less the constraint index the instruction verifier puts first (c0_word_count)."""
    return re.sub(r"^c\d+_", "", reward)


def rewards(scores: dict[str, dict], arm: str, seeds: list[int], prompts: list[str], decodes: list[str],
            kind: str | None = None) -> np.ndarray:
    """[S, P, D] rewards of an arm: the mean reward, or with `kind` the mean score of that kind's rewards."""
    def value(cell: dict) -> float:
        if kind is None:
            return cell["reward"]
        return float(np.mean([v for n, v in cell["scores"].items() if kind_of(n) == kind]))

    return np.array([[[value(scores[f"{arm}-{s}"]["decodes"][d][p]) for d in decodes] for p in prompts]
                     for s in seeds])


def gain_over_start(scores: dict[str, dict], arm: str, seeds: list[int], prompts: list[str],
                    decodes: list[str]) -> float | None:
    """The arm's mean reward over `seeds`, `prompts` and `decodes` less the start policy's on the same prompts and
    decodes; None where the start policy was not scored on all of them."""
    start = scores.get("start", {}).get("decodes", {})
    if any(p not in start.get(d, {}) for d in decodes for p in prompts):
        return None
    before = np.mean([[start[d][p]["reward"] for d in decodes] for p in prompts])
    return float(rewards(scores, arm, seeds, prompts, decodes).mean() - before)


def relative(gains: dict[str, float | None], base: str, value: float) -> float | None:
    """`value` over the baseline's gain over the start policy (None where that gain is unknown or not positive:
    a share of no gain means nothing)."""
    gain = gains[base]
    return None if gain is None or gain <= 0 else value / gain


def rows_for(scores: dict[str, dict], registration: dict, comparisons, primary=(), target_mde: float | None = None,
             decodes: list[str] | None = None) -> list[dict]:
    """One row per (method, baseline) whose seeds are scored for both (the seeds scored for both, the prompts
    every one of those policies was scored on)."""
    exploratory = exploratory_arms(registration)
    rows = []
    for method, base in comparisons:
        seeds = sorted({r["seed"] for r in scores.values() if r["arm"] == method}
                       & {r["seed"] for r in scores.values() if r["arm"] == base})
        if len(seeds) < 2:
            continue
        labels = [f"{a}-{s}" for a in (method, base) for s in seeds]
        names = decodes or sorted(set.intersection(*(set(scores[x]["decodes"]) for x in labels)),
                                  key=lambda d: (d != "greedy", d))
        prompts = sorted(set.intersection(*(set(scores[x]["decodes"][d]) for x in labels for d in names)))
        row = analysis.difference(rewards(scores, method, seeds, prompts, names),
                                  rewards(scores, base, seeds, prompts, names))
        early = sorted(x for x in labels if scored_before_commit(registration, scores[x].get("scored_at")))
        gains = {arm: gain_over_start(scores, arm, seeds, prompts, names) for arm in (method, base)}
        rows.append({"method": method, "baseline": base, **{k: row[k] for k in KEYS[2:8]},
                     "seeds": seeds, "prompts": len(prompts), "decodes": names,
                     "design_hash": registration["design_hash"], "design_commit": registration["design_commit"],
                     "exploratory": bool({method, base} & exploratory),
                     "var_seed": row["var_seed"], "var_prompt": row["var_prompt"], "var_cell": row["var_cell"],
                     "var_decode": row["var_decode"], "se": row["se"], "df": row["df"],
                     "ci_low_crossed": row["ci_low_crossed"], "ci_high_crossed": row["ci_high_crossed"],
                     "mde_crossed": row["mde_crossed"], "primary": (method, base) in set(primary),
                     "gain_over_start": gains, "relative_diff": relative(gains, base, row["diff"]),
                     "relative_mde": relative(gains, base, row["mde"]),
                     "met": None if target_mde is None else row["mde"] <= target_mde,
                     "scored_before_commit": early})
    return rows


def kind_rows(scores: dict[str, dict], registration: dict, comparisons) -> list[dict]:
    """Per difference and reward kind: the difference of that kind's score on the prompts that have it, with
    its interval (exploratory: not what the design was sized for)."""
    out = []
    for row in rows_for(scores, registration, comparisons):
        labels = [f"{a}-{s}" for a in (row["method"], row["baseline"]) for s in row["seeds"]]
        first = scores[labels[0]]["decodes"][row["decodes"][0]]
        names = sorted({kind_of(n) for cell in first.values() for n in cell["scores"]})
        for name in names:
            prompts = sorted(p for p, cell in first.items()
                             if name in map(kind_of, cell["scores"]) and all(p in scores[x]["decodes"][d] for x in labels
                                                               for d in row["decodes"]))
            if len(prompts) < 2:
                continue
            d = analysis.difference(rewards(scores, row["method"], row["seeds"], prompts, row["decodes"], name),
                                    rewards(scores, row["baseline"], row["seeds"], prompts, row["decodes"], name))
            out.append({"method": row["method"], "baseline": row["baseline"], "kind": name, "prompts": len(prompts),
                        "diff": d["diff"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "exploratory": True})
    return out


def table(rows: list[dict], design_seeds: int | None = None) -> str:
    """Markdown: one line per difference (a row with fewer seeds than the design's `design_seeds` is marked
    incomplete: its targets are not measured yet)."""
    lines = ["| difference | estimate [95% interval] | per seed | detectable (80%, 5%) | crossed bootstrap "
             "(older rows) | components seed / prompt / cell | seeds x prompts x decodes | note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        note = "; ".join(filter(None, [
            "exploratory (arm added after registration)" if r["exploratory"] else "",
            "primary" if r.get("primary") else "",
            f"incomplete: {len(r['seeds'])} of {design_seeds} seeds" if design_seeds and len(r["seeds"]) < design_seeds
            else "",
            f"scored before the design's commit: {', '.join(r['scored_before_commit'])}"
            if r.get("scored_before_commit") else ""]))
        lines.append(f"| {r['method']} - {r['baseline']} | {r['diff']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] "
                     f"| {', '.join(f'{x:+.3f}' for x in r['per_seed_diff'])} | {r['mde']:.4f} "
                     f"| [{r['ci_low_crossed']:+.4f}, {r['ci_high_crossed']:+.4f}], {r['mde_crossed']:.4f} "
                     f"| {r['var_seed']:.4g} / {r['var_prompt']:.4g} / {r['var_cell']:.4g} "
                     f"| {len(r['seeds'])} x {r['prompts']} x {len(r['decodes'])} | {note} |")
    return "\n".join(lines)


def arm_lines(scores: dict[str, dict], untrained: set[str] = frozenset()) -> list[str]:
    """Markdown: each arm's mean held-out reward over every prompt and decode it was scored on, per seed (a seed
    in `untrained`, ARM-SEED, had nothing to train on and is the base policy: marked *), and the start's."""
    lines = ["| policy | mean reward | per seed (* untrained: the base policy) |", "| --- | --- | --- |"]
    arms: dict[str, dict[int, float]] = {}
    for label, result in scores.items():
        mean = float(np.mean([c["reward"] for cells in result["decodes"].values() for c in cells.values()]))
        if result.get("arm") is None:
            lines.append(f"| {label} | {mean:.4f} | |")
        else:
            arms.setdefault(result["arm"], {})[result["seed"]] = mean
    for arm, seeds in sorted(arms.items()):
        lines.append(f"| {arm} | {np.mean(list(seeds.values())):.4f} | "
                     + ", ".join(f"{s}: {v:.3f}" + ("*" if f"{arm}-{s}" in untrained else "")
                                 for s, v in sorted(seeds.items())) + " |")
    return lines


def detected(row: dict) -> str:
    """'detected above 0', 'detected below 0' or 'not detected': where the difference's 95% interval lies."""
    if row["ci_low"] > 0:
        return "detected above 0"
    if row["ci_high"] < 0:
        return "detected below 0"
    return "not detected"


def verdict(row: dict) -> str:
    """`detected`, with the detectable difference beside 'not detected' (which is not 'no difference')."""
    found = detected(row)
    return found if found != "not detected" else f"{found} (detectable difference {row['mde']:.3f})"


def plot(rows: list[dict], path: Path) -> None:
    """Each difference's estimate with its interval and its per-seed differences: measured points only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 1.4 + 0.5 * len(rows)))
    for y, r in enumerate(rows):
        ax.errorbar(r["diff"], y, xerr=[[r["diff"] - r["ci_low"]], [r["ci_high"] - r["diff"]]], fmt="o",
                    color="tab:gray" if r["exploratory"] else "tab:blue", capsize=3)
        ax.plot(r["per_seed_diff"], [y + 0.2] * len(r["per_seed_diff"]), "x", color="tab:orange", ms=4)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_ylim(-0.6, len(rows) - 0.2)
    ax.set_yticks(range(len(rows)), [f"{r['method']} - {r['baseline']}" + (" (expl.)" if r["exploratory"] else "")
                                     for r in rows])
    ax.set_xlabel("held-out reward difference (95% interval; x: per seed)")
    fig.tight_layout()
    save_figure(fig, path)


def write_report(out: Path, design, registration: dict) -> list[dict]:
    """DIR/compare.json (rows, per-kind rows, learning-curve rows), DIR/report.md, DIR/compare.png,
    DIR/learning_curve.png (curves.py: from the dev scores); the rows."""
    scores = load_scores(out)
    rows = rows_for(scores, registration, design.comparisons, design.primary, design.targets.get("mde"))
    kinds = kind_rows(scores, registration, design.comparisons)
    curve = curves.curve_rows(curves.load_dev(out))
    write_json(out / "compare.json", {"rows": rows, "per_kind_exploratory": kinds, "learning_curve": curve,
                                      "registration": {k: v for k, v in registration.items() if k != "content"}})
    commit = registration["design_commit"] or "none (the design file was not committed: not pre-registered)"
    text = [f"# compare: {design.path}", "",
            f"Design sha256 {registration['design_hash']}, commit {commit}.", "",
            *arm_lines(scores, {p.parent.name for p in (out / "train").glob("*/untrained.json")}), "",
            table(rows, len(design.seeds)), "", *(f"- {r['method']} - {r['baseline']}: {verdict(r)}" for r in rows),
            *(f"- {m} - {b}: not measured (fewer than 2 seeds scored for both)" for m, b in design.comparisons
              if (m, b) not in {(r["method"], r["baseline"]) for r in rows}), "",
            "## Per reward kind (exploratory)", "", "| difference | kind | prompts | estimate [95%] |", "| --- | --- | --- | --- |",
            *(f"| {k['method']} - {k['baseline']} | {k['kind']} | {k['prompts']} | {k['diff']:+.4f} "
              f"[{k['ci_low']:+.4f}, {k['ci_high']:+.4f}] |" for k in kinds), "",
            "## Learning curves (dev prompts, greedy)", "", *curves.curve_table(curve)]
    tmp = temporary(out / "report.md")
    tmp.write_text("\n".join(text) + "\n")
    hold()
    tmp.replace(out / "report.md")
    if rows:
        plot(rows, out / "compare.png")
    if any(r["arm"] != "start" for r in curve):
        curves.plot_curves(curve, out / "learning_curve.png")
    return rows
