"""A reward model from verifier labels (issue 26): held-out pairwise accuracy of `rm train`.

    python -m bench reward_model [--quick] [-- [--limit 256] [--n 8] [--base smollm2-135m-instruct]]

A run of the model's own samples on the closed-loop train prompts (instructions, temperature 0.5 as the
closed-loop pilot chose, max_new_tokens 96) is annotated once into `--work` (default
`bench/.reward_model/`, resumed when stopped), then `tokencredit.pipeline.train.reward_model.train_reward_model`
fits the head on the frozen base with a quarter of the prompts held out. Rows of
`bench/results/reward_model.json`, one per reward family: `mean` (the order it trains on: higher mean reward
in the same group) and each instruction constraint kind (pairs of one prompt's responses where that
constraint passed in one and failed in the other), with `base`, `pairs_train`, `pairs_heldout`,
`pairwise_accuracy` and a 95% bootstrap interval over held-out prompts (`ci_low`, `ci_high`).
`--train-layers N` also trains the base's top N decoder layers with the head (`rm train --train-layers`): its
rows carry `train_layers` and sit beside the frozen head's (`train_layers` 0), its folder is `rm-top{N}`.
`--quick` uses the shipped tiny policy on a few demo prompts, into a temporary results folder.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from common import ROOT, Harness  # noqa: F401  (also sets torch threads)
from registry import Target, benchmark

TARGET = 0.75


def annotate(args, out) -> float:
    """Sample and verify the run (GDPO credit only: the labels are what rm train reads); seconds taken."""
    from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
    from tokencredit.pipeline.config import CreditConfig, SamplingConfig

    config = AnnotateConfig(prompts=args.prompts, tasks=("instructions",), split=args.split, limit=args.limit,
                            model=args.model, credit=CreditConfig(kinds=("gdpo",)), shard_size=8,
                            sampling=SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens,
                                                    temperature=args.temperature, seed=args.seed))
    start = time.perf_counter()
    run_annotation(config, str(out))
    return time.perf_counter() - start


@benchmark("reward_model", measures="`tokencredit rm train`: a linear head on the frozen base (pooling and L2 chosen "
           "by cross-validation over the train prompts), Bradley-Terry on pairs of one prompt's responses (higher mean "
           "reward chosen), a quarter of the prompts held out: held-out pairwise accuracy with a 95% bootstrap interval "
           "over held-out prompts.", results=("reward_model.json",),
           targets=(Target("mean_pairwise_accuracy", ">=", TARGET),))
def run(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench reward_model --")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="policy the run samples")
    parser.add_argument("--base", default="smollm2-135m-instruct", help="base of the reward model")
    parser.add_argument("--prompts", default=str(ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl"))
    parser.add_argument("--split", default="train")
    parser.add_argument("--limit", type=int, default=256, help="prompts (256: the whole train split)")
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run", default=None, help="an annotated run to train on instead of sampling one")
    parser.add_argument("--allow-incomplete", action="store_true", help="train on the shards of --run written so far")
    parser.add_argument("--work", default=str(ROOT / "bench" / ".reward_model"))
    parser.add_argument("--train-layers", type=int, default=0, help="top decoder layers trained with the head")
    parser.add_argument("--epochs", type=int, default=2, help="epochs when --train-layers > 0")
    parser.add_argument("--layer-lr", type=float, default=2e-5, help="step size when --train-layers > 0")
    args = parser.parse_args(h.argv)
    if h.quick:  # the tiny policy on the demo prompts
        args.model = args.base = None
        args.prompts, args.split, args.limit, args.n, args.max_new_tokens = "demo", None, 16, 8, 32

    from tokencredit.pipeline.models.loading import DEFAULT_POLICY
    from tokencredit.pipeline.train.reward_model import RewardModelConfig, train_reward_model

    with tempfile.TemporaryDirectory(prefix="bench-rm-") as tmp:
        work = Path(tmp) if h.quick else Path(args.work)
        run_dir = args.run or str(work / f"run-{args.limit}x{args.n}")
        seconds = annotate(args, run_dir) if args.run is None else 0.0
        start = time.perf_counter()
        folder = "rm" + (f"-top{args.train_layers}" if args.train_layers else "")
        config = RewardModelConfig(base=args.base or str(DEFAULT_POLICY), train_layers=args.train_layers,
                                   epochs=args.epochs, layer_lr=args.layer_lr)
        report = train_reward_model(run_dir, work / folder, config, allow_incomplete=args.allow_incomplete)
    rows = [{"base": args.base or "tiny-policy", "model": args.model or "tiny-policy", "pooling": report["pooling"],
             "train_layers": args.train_layers, **row} for row in report["families"]]
    path = h.results("reward_model.json")
    old = json.loads(path.read_text()) if path.exists() else []
    kept = [r for r in old if r.get("train_layers", 0) != args.train_layers]
    path.write_text(json.dumps(kept + rows, indent=1) + "\n")
    mean = next(r for r in rows if r["family"] == "mean")
    return {"mean_pairwise_accuracy": mean["pairwise_accuracy"], "mean_ci_low": mean["ci_low"],
            "mean_ci_high": mean["ci_high"], "train_accuracy": report["train_accuracy"],
            "pairs_train": report["pairs_train"], "pairs_heldout": report["pairs_heldout"],
            "pooling": report.get("pooling", "last"), "l2": report["l2"], "train_layers": args.train_layers,
            "annotate_s": round(seconds, 1), "rm_train_s": round(time.perf_counter() - start, 1),
            **{f"{r['family']}_pairwise_accuracy": r["pairwise_accuracy"] for r in rows
               if r["family"] != "mean" and r["pairs_heldout"] >= 10}}
