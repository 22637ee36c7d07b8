"""`compare --plan`: the seeds, held-out prompts and decodes a design needs for a target detectable difference,
and what that costs, from a pilot's variance components and measured speeds, or from the ones the project ships
(`--from-shipped`: bench/results' compare and engine rows, measured on a 2-core CPU).

Detectable difference of S seeds x P prompts x D decodes: analysis.mde_for with the pilot's components (the
largest over the differences planned for). Cost: every policy (arms x seeds + the start) decodes P x D responses
of the pilot's measured tokens per response at the engine's measured tokens/s, and every (arm, seed) trains for
the pilot's measured seconds; with [training] rounds R, R times, and it samples its pool's responses again in each
round after the first (at the same tokens per response and tokens/s). The start policy and every (arm, seed) after
each round decode the dev prompts greedily (run.dev_records). Units: tokens, seconds, hours.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokencredit.pipeline.compare.analysis import mde_for


@dataclass(frozen=True)
class Costs:
    """Measured: tokens per scored response, decode tokens/s of the scoring engine, seconds to train one
    (arm, seed); and where each figure comes from."""

    tokens_per_response: float
    tokens_per_s: float
    train_seconds: float
    source: str


def measured_costs(pilot: Path) -> Costs:
    """From a compare folder: its scores' tokens and seconds, and its trainings' seconds (train.json)."""
    from tokencredit.pipeline.compare.run import training_seconds

    scores = [json.loads(p.read_text()) for p in sorted((pilot / "scores").glob("*.json"))]
    if not scores:
        raise ValueError(f"--pilot {pilot}: no scored policy (scores/*.json) to measure the engine's speed on")
    responses = sum(len(cells) for s in scores for cells in s["decodes"].values())
    tokens, seconds = sum(s["tokens"] for s in scores), sum(s["seconds"] for s in scores)
    trained = [json.loads(p.read_text())["seconds"] for p in training_seconds(pilot / "train")]
    return Costs(tokens_per_response=tokens / responses, tokens_per_s=tokens / max(seconds, 1e-9),
                 train_seconds=float(np.mean(trained)) if trained else 0.0,
                 source=f"{pilot}: {len(scores)} scored policies ({tokens} tokens in {seconds:.0f} s), "
                        f"{len(trained)} trainings")


SHIPPED = Path(__file__).resolve().parents[2] / "bench" / "results"  # the measured rows of a source checkout


def shipped_file(name: str, results: Path = SHIPPED):
    path = results / name
    if not path.is_file():
        raise ValueError(f"--from-shipped: {path} is missing (the shipped rows come with a source checkout)")
    return json.loads(path.read_text())


def shipped_response_costs(results: Path = SHIPPED) -> dict:
    """SmolLM2's tokens per response at temperature 0.5 (closed_loop_pilot.json, batch 64) and the trainer's
    measured seconds per trained response (train.json: one step of batch 2 x 2 accumulated, over its 4 responses)."""
    pilot = next(r for r in shipped_file("closed_loop_pilot.json", results) if r["temperature"] == 0.5)
    train = shipped_file("train.json", results)
    return {"tokens_per_response": pilot["tokens"] / (pilot["prompts"] * pilot["n"]),
            "ms_per_token": pilot["ms_per_token"],
            "seconds_per_trained_response": train["smollm2"]["trainer_step_s"] / (train["batch_size"]
                                                                                  * train["grad_accum"])}


def shipped_costs(design, results: Path = SHIPPED) -> Costs:
    """The design's costs from the shipped measurements of a 2-core CPU: decode tokens/s of its engine (engine.json:
    the vLLM CPU engine in its default dtype for [policy] backend "vllm", else the transformers backend), SmolLM2's
    tokens per response, and a training as the trainer's seconds per response x [training] steps x batch_size."""
    if design.policy["device"] != "cpu":
        raise ValueError(f"--from-shipped: the shipped speeds are a CPU's; design [policy] device "
                         f"{design.policy['device']!r} needs --tokens-per-s (or a pilot folder)")
    engine = shipped_file("engine.json", results)
    name = f"vllm_{engine['vllm_default_dtype']}" if design.policy["backend"] == "vllm" else "transformers"
    speed = engine["measurements"][f"sample_{name}"]["tokens_per_s"]
    per = shipped_response_costs(results)
    steps, batch = design.training["steps"], design.training["batch_size"]
    return Costs(per["tokens_per_response"], speed, per["seconds_per_trained_response"] * steps * batch,
                 f"shipped: engine.json ({name}, {engine['torch_threads']} threads), closed_loop_pilot.json, "
                 f"train.json x {steps} steps x batch {batch}")


def largest_rows(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """Per (method, baseline), the row of the largest experiment (seeds x prompts x decodes): the best-measured
    components where several designs compared the same arms."""
    def size(r: dict) -> int:
        return len(r["seeds"]) * r["prompts"] * len(r["decodes"])
    out: dict = {}
    for r in sorted(rows, key=size):
        out[(r["method"], r["baseline"])] = r
    return out


SEED_BOUND = 0.8  # one-sided level of the seed component's upper bound in the cautious plan


def seed_component_bound(row: dict, level: float = SEED_BOUND) -> float:
    """The one-sided `level` upper bound of a pilot row's seed component: its seed mean square (expected
    var_cell + prompts x var_seed) scaled by (S - 1) / chi2_{1-level}(S - 1), less the cell term, over the prompts.
    A pilot of a few seeds estimates the component poorly and often at 0, and a plan that trusts 0 keeps the
    interval's degrees of freedom high where a real component of a few 1e-5 leaves it S - 1 (the powered design,
    planned from a 0, measured detectable differences up to 2.7 times the plan's)."""
    from scipy.stats import chi2

    s = len(row["seeds"]) if isinstance(row["seeds"], list) else int(row["seeds"])
    ms_seed = row["var_cell"] + row["prompts"] * row["var_seed"]
    upper = (ms_seed * (s - 1) / chi2.ppf(1 - level, s - 1) - row["var_cell"]) / row["prompts"]
    return max(row["var_seed"], float(upper))


def cautious(components: list[dict]) -> list[dict]:
    """The components with each seed component at its upper bound (seed_component_bound)."""
    return [{**c, "var_seed": seed_component_bound(c)} for c in components]


def plan(components: list[dict], target: float, arms: int, costs: Costs, *, seeds=range(2, 21),
         prompts=(256, 512, 1024, 1536, 2048, 3072, 4096), decodes=(1, 2, 3, 4, 6, 8), max_prompts: int | None = None,
         fixed: dict | None = None, rounds: int = 1, round_responses: float = 0.0, dev_prompts: int = 0) -> dict:
    """The cheapest (seeds, prompts, decodes) whose detectable difference is at most `target` for every
    difference of `components` (rows with var_seed, var_prompt, var_cell, var_decode, decodes), with its
    cost, and the cheapest for each seed count; `fixed` pins any of seeds/prompts/decodes. Each (arm, seed) trains
    `rounds` times (`[training] rounds`), and samples `round_responses` responses (its pool's) in each round after
    the first; the start policy and each (arm, seed) after each round decode `dev_prompts` greedily."""
    fixed = fixed or {}
    grid = {"seeds": [fixed["seeds"]] if "seeds" in fixed else list(seeds),
            "prompts": [fixed["prompts"]] if "prompts" in fixed else [p for p in prompts
                                                                      if max_prompts is None or p <= max_prompts],
            "decodes": [fixed["decodes"]] if "decodes" in fixed else list(decodes)}
    options = []
    for s, p, d in itertools.product(grid["seeds"], grid["prompts"], grid["decodes"]):
        mdes = {f"{c['method']} - {c['baseline']}": float(mde_for(
            c["var_seed"], c["var_prompt"], c["var_cell"], s, p, var_decode=c.get("var_decode"),
            pilot_decodes=len(c["decodes"]) if isinstance(c["decodes"], list) else c["decodes"], decodes=d))
            for c in components}
        tokens = ((arms * s + 1) * p * d + arms * s * (rounds - 1) * round_responses
                  + (arms * s * rounds + 1) * dev_prompts) * costs.tokens_per_response
        seconds = tokens / costs.tokens_per_s + arms * s * rounds * costs.train_seconds
        options.append({"seeds": s, "prompts": p, "decodes": d, "mde": mdes, "worst_mde": max(mdes.values()),
                        "tokens": round(tokens), "hours": seconds / 3600})
    feasible = sorted((o for o in options if o["worst_mde"] <= target), key=lambda o: o["hours"])
    per_seeds = {}
    for o in feasible:
        per_seeds.setdefault(o["seeds"], o)
    closest = min(options, key=lambda o: o["worst_mde"])
    return {"target_mde": target, "arms": arms, "rounds": rounds, "round_responses": round_responses,
            "dev_prompts": dev_prompts,
            "costs": vars(costs),
            "cheapest": feasible[0] if feasible else None,
            "cheapest_per_seed_count": sorted(per_seeds.values(), key=lambda o: o["seeds"]),
            "smallest_mde_in_grid": closest,
            "assumption": "a pilot without a decode term (one decode per cell) is taken to gain nothing from more "
                          "decodes; a measured one splits the cell term (analysis.mde_for)"}


def _rounds(result: dict) -> str:
    """What the plan's cost adds for rounds: every training `rounds` times, each later round's annotate run, and the
    dev prompts' greedy decodes."""
    added = "" if result["rounds"] == 1 else (
        f" x {result['rounds']} rounds, and {result['round_responses']:.0f} responses sampled per (arm, seed) in each "
        "round after the first")
    if result["dev_prompts"]:
        added += (f"; {result['dev_prompts']} dev prompts decoded greedily by the start policy and by every (arm, "
                  "seed) after each round")
    return added


def plan_lines(result: dict) -> list[str]:
    """The plan, printed."""
    c = result["costs"]
    lines = [f"target detectable difference {result['target_mde']} (80% power, two-sided 5%), {result['arms']} arms; "
             f"costs: {c['tokens_per_response']:.1f} tokens per response at {c['tokens_per_s']:.1f} tokens/s, "
             f"{c['train_seconds']:.0f} s per training" + _rounds(result) + f" ({c['source']})"]
    if result["cheapest"] is None:
        o = result["smallest_mde_in_grid"]
        lines.append(f"no design in the grid reaches it; the smallest: {o['seeds']} seeds x {o['prompts']} prompts x "
                     f"{o['decodes']} decodes, detectable {o['worst_mde']:.4f}, {o['hours']:.1f} h")
        return lines
    for o in [result["cheapest"], *result["cheapest_per_seed_count"]]:
        lines.append(f"{o['seeds']} seeds x {o['prompts']} held-out prompts x {o['decodes']} decodes: detectable "
                     + ", ".join(f"{k} {v:.4f}" for k, v in o["mde"].items())
                     + f"; {o['tokens']:,} tokens, {o['hours']:.1f} h")
    lines[1] = "cheapest: " + lines[1]
    return lines


def pilot_rows(pilot: Path, design_hash: str | None) -> list[dict]:
    """The pilot's difference rows: a compare folder's compare.json, or a rows file (a list, or {"rows": [...]}),
    those of one design where `design_hash` (a prefix) is given."""
    path = pilot / "compare.json" if pilot.is_dir() else pilot
    if not path.is_file():
        raise ValueError(f"--pilot {pilot}: no compare.json (run `tokencredit compare` on the pilot first)")
    data = json.loads(path.read_text())
    rows = data["rows"] if isinstance(data, dict) else data
    return [r for r in rows if design_hash is None or str(r.get("design_hash", "")).startswith(design_hash)]


def round_responses(design) -> float:
    """The responses one (arm, seed) samples in a round after the first, its pool's: train prompts x responses per
    prompt, the mean over the arms."""
    import math

    from tokencredit.pipeline.annotate import load_prompt_set
    from tokencredit.pipeline.compare.run import annotate_config

    def responses(pool) -> int:
        config = annotate_config(design, pool, design.prompts["train_split"], design.prompts["train_limit"])
        return len(load_prompt_set(config)[0]) * (pool.n or math.prod(pool.tree))
    return float(np.mean([responses(design.pools[arm.pool]) for arm in design.arms.values()]))


def cli_plan(design, args) -> list[str]:
    """`compare DESIGN --plan --pilot P` (or `--from-shipped`): the plan for the design's comparisons (its primary
    ones where it has any) at its [targets] mde."""
    if "mde" not in design.targets:
        raise ValueError(f"design {design.path} [targets] mde: required by --plan (the detectable difference to reach)")
    if args.from_shipped and args.pilot is not None:
        raise ValueError("--plan: give --pilot or --from-shipped, not both")
    if args.from_shipped:
        pilot = SHIPPED / "compare_details.json"
        shipped_file(pilot.name)
        rows = largest_rows(pilot_rows(pilot, args.pilot_design))
        measured = shipped_costs(design)
    elif args.pilot is None:
        raise ValueError("--plan needs --pilot (a compare folder or rows file with the pilot's components) or "
                         "--from-shipped (the project's measured rows)")
    else:
        pilot = Path(args.pilot)
        rows = {(r["method"], r["baseline"]): r for r in pilot_rows(pilot, args.pilot_design)}
        measured = measured_costs(pilot) if pilot.is_dir() else None
    wanted = design.primary or design.comparisons
    missing = [f"{m} - {b}" for m, b in wanted if (m, b) not in rows]
    if missing:
        raise ValueError(f"{pilot} has no row for {', '.join(missing)} (its rows: "
                         f"{', '.join(f'{m} - {b}' for m, b in rows) or 'none'})")
    tokens_per_s = (args.tokens_per_s or design.targets.get("engine_tokens_per_s")
                    or (measured and measured.tokens_per_s))
    per_response = args.tokens_per_response or (measured and measured.tokens_per_response)
    train_seconds = args.train_seconds if args.train_seconds is not None else (measured and measured.train_seconds)
    if not tokens_per_s or not per_response or train_seconds is None:
        raise ValueError("--plan: the engine's measured speed is unknown; give --tokens-per-s, "
                         "--tokens-per-response and --train-seconds (or a pilot compare folder, or --from-shipped)")
    source = measured.source if measured else "given on the command line"
    costs = Costs(float(per_response), float(tokens_per_s), float(train_seconds), source)
    components = [rows[p] if args.var_decode is None or rows[p].get("var_decode") is not None
                  else {**rows[p], "var_decode": args.var_decode} for p in wanted]
    target = float(design.targets["mde"])
    from tokencredit.pipeline.compare.run import dev_records

    rounds = {"rounds": design.rounds, "round_responses": round_responses(design) if design.rounds > 1 else 0.0,
              "dev_prompts": len(dev_records(design))}
    lines = plan_lines(plan(components, target, len(design.arms), costs, max_prompts=args.max_prompts, **rounds))
    if args.from_shipped:  # which shipped experiment each component comes from
        lines[1:1] = ["components: " + ", ".join(
            f"{c['method']} - {c['baseline']} from {c.get('design', c['design_hash'][:8])} ({len(c['seeds'])} seeds "
            f"x {c['prompts']} prompts x {len(c['decodes'])} decodes)" for c in components)]
    fixed = {"prompts": design.prompts["heldout_limit"], "decodes": len(design.decodes)}
    if fixed["prompts"]:  # the seeds this design needs at its own prompts and decodes
        lines += [f"at this design's {fixed['prompts']} held-out prompts x {fixed['decodes']} decodes:"]
        lines += plan_lines(plan(components, target, len(design.arms), costs, fixed=fixed, **rounds))[1:2]
    if all("seeds" in c and "prompts" in c for c in components):
        bounded = cautious(components)
        lines += [f"cautious, each seed component at its {SEED_BOUND:.0%} upper bound ("
                  + ", ".join(f"{c['method']} - {c['baseline']} {c['var_seed']:.2g}" for c in bounded) + "):"]
        lines += plan_lines(plan(bounded, target, len(design.arms), costs, max_prompts=args.max_prompts,
                                 seeds=range(2, 61), **rounds))[1:2]
        if fixed["prompts"]:
            lines += plan_lines(plan(bounded, target, len(design.arms), costs, fixed=fixed, seeds=range(2, 61),
                                     **rounds))[1:2]
    else:
        lines += ["no cautious plan: the pilot's rows do not give their seeds and prompts"]
    return lines
