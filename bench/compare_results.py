"""A finished `tokencredit compare` run's rows into the project's results, analysed by compare's own code.

    python bench/compare_results.py bench/compare_designs/NAME.toml DIR

Writes bench/results/compare_NAME_per_prompt.json (the run's registration and each policy's held-out rewards per
decode: what its rows are re-analysed from without DIR, tests/test_closed_loop.py), replaces the design's rows of
bench/results/compare.json (compare's row keys) and compare_details.json (every column, `design` NAME), and draws
docs/experiments/compare_NAME.png. Refused while a difference has fewer seeds than the design: `compare
--report-only` on the seeds scored so far gives such rows, which are not the registered result.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
FIGURES = ROOT / "docs" / "experiments"


def pack(out: Path) -> dict:
    """DIR's registration and every scored policy (arm, seed, scored_at, rewards per decode in the order of
    `prompts`)."""
    from tokencredit.pipeline.compare.report import load_scores

    policies, prompts = {}, None
    for label, score in load_scores(out).items():
        prompts = prompts or sorted(next(iter(score["decodes"].values())))
        decodes = {d: [cells[p]["reward"] for p in prompts] for d, cells in score["decodes"].items()}
        policies[label] = {"arm": score["arm"], "seed": score["seed"], "scored_at": score["scored_at"],
                           "decodes": decodes}
    return {"registration": json.loads((out / "registration.json").read_text()), "prompts": prompts,
            "policies": policies}


def unpack(packed: dict) -> tuple[dict, dict[str, dict]]:
    """(registration, compare's scores: LABEL -> arm, seed, scored_at, decodes) of a packed run."""
    return packed["registration"], {
        label: {**policy, "decodes": {d: {p: {"reward": r, "scores": {}} for p, r in zip(packed["prompts"], rewards)}
                                      for d, rewards in policy["decodes"].items()}}
        for label, policy in packed["policies"].items()}


def design_rows(design, packed: dict) -> list[dict]:
    """The design's difference rows from a packed run; ValueError where one has fewer seeds than the design."""
    from tokencredit.pipeline.compare.report import rows_for

    registration, scores = unpack(packed)
    rows = rows_for(scores, registration, design.comparisons, design.primary, design.targets.get("mde"))
    short = [f"{r['method']} - {r['baseline']} ({len(r['seeds'])} seeds)" for r in rows
             if len(r["seeds"]) < len(design.seeds)]
    if short or not rows:
        raise ValueError(f"{design.path}: not every seed of its {len(design.seeds)} is scored: "
                         f"{', '.join(short) or 'no difference has two seeds'}")
    return rows


def publish(design_path: Path, out: Path, results: Path = RESULTS, figures: Path = FIGURES) -> list[dict]:
    """The design's rows of the run in `out` into `results` (compare.json, compare_details.json, the packed rewards)
    and its figure into `figures`; the rows. Nothing is written where a seed is missing (`design_rows`)."""
    from tokencredit.pipeline.compare.design import load_design
    from tokencredit.pipeline.compare.report import KEYS, plot

    design, name, packed = load_design(design_path), design_path.stem, pack(out)
    rows = design_rows(design, packed)
    (results / f"compare_{name}_per_prompt.json").write_text(json.dumps(packed, separators=(",", ":")) + "\n")
    for file, keep in (("compare.json", lambda r: r["design_hash"] != design.sha256),
                       ("compare_details.json", lambda r: r["design"] != name)):
        kept = [r for r in json.loads((results / file).read_text()) if keep(r)]
        new = [{k: r[k] for k in KEYS} if file == "compare.json" else {"design": name, **r} for r in rows]
        (results / file).write_text(json.dumps(kept + new, indent=1) + "\n")
    plot(rows, figures / f"compare_{name}.png")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("design", type=Path, help="the run's design file (bench/compare_designs/NAME.toml)")
    parser.add_argument("out", type=Path, help="the run's folder (tokencredit compare --out)")
    args = parser.parse_args()
    try:
        rows = publish(args.design, args.out)
    except (OSError, ValueError) as error:
        print(f"compare_results: error: {error}", file=sys.stderr)
        return 2
    print(f"{len(rows)} rows of {args.design.stem} into {RESULTS}/compare.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
