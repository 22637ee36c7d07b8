"""What `--locate both` costs against `--locate replay` (issue 19): the pairs with verifier spans skip the replay.

    python -m bench locate_cost [--quick] [-- [--model smollm2-135m-instruct] [--limit 4] [--repeats 3]]

The demo prompt set (every task, `--limit` prompts each, n responses) is annotated with `gdpo,mrtpo` under each
option, in turns (replay, both, replay, both, ...) so that load from other processes falls on both alike; each
run samples the same responses (same seed). Reported: the median wall time of a whole annotation, the replays
run and the response tokens replayed (from the run's manifest, exact), and their ratios both / replay.
Target: both <= replay. Writes its row to bench/RESULTS.md and `locate_both_over_replay_seconds`,
`locate_both_over_replay_tokens` to bench/results/speed.json (`--quick`: a smaller run, into a temporary results folder).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from common import Harness
from registry import Target, benchmark

LOCATES = ("replay", "both")


def annotate_once(args, locate: str) -> dict:
    """Seconds and replay statistics of one whole annotation of the demo set under `locate`."""
    from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
    from tokencredit.pipeline.config import CreditConfig, SamplingConfig

    config = AnnotateConfig(prompts="demo", limit=args.limit, model=args.model,
                            sampling=SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens, seed=args.seed),
                            credit=CreditConfig(kinds=("gdpo", "mrtpo"), locate=locate))
    with tempfile.TemporaryDirectory(prefix="tokencredit-locate-") as out:
        start = time.perf_counter()
        run_annotation(config, out, progress=False)
        seconds = time.perf_counter() - start
        stats = json.loads((Path(out) / "manifest.json").read_text())["stats"]
    return {"seconds": seconds, "replays_done": stats["replays_done"], "tokens_replayed": stats["tokens_replayed"],
            "verifier_located": stats.get("verifier_located", 0)}


def measure(args) -> dict[str, dict]:
    annotate_once(args, "replay")  # warm-up: model loading and first-call costs fall on neither side
    runs: dict[str, list[dict]] = {locate: [] for locate in LOCATES}
    for _ in range(args.repeats):
        for locate in LOCATES:
            runs[locate].append(annotate_once(args, locate))
    return {locate: {"seconds": statistics.median(r["seconds"] for r in rs),
                     **{k: rs[0][k] for k in ("replays_done", "tokens_replayed", "verifier_located")}}
            for locate, rs in runs.items()}


@benchmark("locate_cost", measures="The demo set annotated with gdpo,mrtpo under `--locate replay` and `--locate "
           "both`, in turns, the same responses: median wall time of a whole annotation and the replays run (the "
           "manifest's counts).", results=("speed.json",),
           targets=(Target("locate_both_over_replay_seconds", "<=", 1.0),))
def run(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench locate_cost --")
    parser.add_argument("--model", default=None, help="registry name or folder (default: the shipped tiny policy)")
    parser.add_argument("--limit", type=int, default=1 if h.quick else 4, help="demo prompts per task")
    parser.add_argument("--n", type=int, default=2 if h.quick else 4, help="responses per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=16 if h.quick else 48)
    parser.add_argument("--repeats", type=int, default=1 if h.quick else 3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(h.argv)
    h.repeats = args.repeats
    result = measure(args)
    replay, both = result["replay"], result["both"]
    ratios = {"locate_both_over_replay_seconds": round(both["seconds"] / replay["seconds"], 3),
              "locate_both_over_replay_tokens": round(both["tokens_replayed"] / max(replay["tokens_replayed"], 1), 3)}
    h.update_figures(ratios)
    return ratios | {f"{locate}_{key}": value for locate, r in result.items() for key, value in r.items()}
