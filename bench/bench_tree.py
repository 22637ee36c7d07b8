"""Tree-sampled groups against flat sampling, the sampler's default batch, and where each branch rule lands.

    python -m bench tree [--quick] [-- [--model PATH]]

(a) A 4 x 4 tree (`SamplingConfig(tree=(4, 4))`, the default branch) against 16 flat samples of the same demo
    prompts: same model, batch, threads and max_new_tokens, turns alternated in one run, medians. Target:
    tree / flat time <= 0.85. Prefilled and decoded tokens are counted both ways (the sampler's counters).
(b) Seconds per generated token of flat sampling at batch 16 ... 256 (the same prompts x 16 samples),
    alternated; `default_batch` is what `SamplingConfig()` (batch_size None) picks on this
    machine. Target: its time within 1.2x of the best batch's.
(c) Per branch rule (sentence, fraction:0.25, entropy:0.1): the share of roots that branch, where the branch
    lands (root tokens / leaf tokens), and the share of sibling leaves that differ.
Figures: bench/results/tree.json; a row in bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import statistics

from common import Harness, demo_records, interleaved_times
from registry import Target, benchmark

SMOLLM2 = "smollm2-135m-instruct"
TARGET_TREE, TARGET_BATCH = 0.85, 1.2
BATCHES = (16, 32, 64, 128, 256)
BRANCHES = ("sentence", "fraction:0.25", "entropy:0.1")


def counted(sampler, fn) -> tuple[int, int, list]:
    """(tokens prefilled, tokens decoded one step at a time, fn's samples)."""
    before = sampler.prefilled_tokens, sampler.decoded_tokens
    samples = fn()
    return sampler.prefilled_tokens - before[0], sampler.decoded_tokens - before[1], samples


def tree_vs_flat(sampler, records, max_new: int, batch: int, repeats: int) -> dict:
    from tokencredit.pipeline.config import SamplingConfig

    tree = SamplingConfig(tree=(4, 4), max_new_tokens=max_new, batch_size=batch)
    flat = SamplingConfig(n=16, max_new_tokens=max_new, batch_size=batch)
    runs = {"tree": lambda: sampler.sample(records, tree), "flat": lambda: sampler.sample(records, flat)}
    counts = {name: counted(sampler, fn) for name, fn in runs.items()}
    times = interleaved_times(runs, repeats=repeats)
    tokens = {name: sum(len(s.token_ids) for s in c[2]) for name, c in counts.items()}
    return {"tree_over_flat_time": times["tree"] / times["flat"], "tree_s": times["tree"], "flat_s": times["flat"],
            "prefill_tokens_tree": counts["tree"][0], "prefill_tokens_flat": counts["flat"][0],
            "decoded_tokens_tree": counts["tree"][1], "decoded_tokens_flat": counts["flat"][1],
            "response_tokens_tree": tokens["tree"], "response_tokens_flat": tokens["flat"]}


def batch_sweep(sampler, records, max_new: int, repeats: int) -> dict:
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.sample.rows import render_prompt

    longest = max(len(render_prompt(sampler.tokenizer, r.prompt)[1]) for r in records)
    default = sampler.batch_rows(SamplingConfig(max_new_tokens=max_new), longest)
    sizes = sorted({*BATCHES, default})
    configs = {b: SamplingConfig(n=16, max_new_tokens=max_new, batch_size=b) for b in sizes}
    tokens = {}

    def run(b):
        samples = sampler.sample(records, configs[b])
        tokens[b] = sum(len(s.token_ids) for s in samples)

    times = interleaved_times({b: (lambda b=b: run(b)) for b in sizes}, repeats=repeats)
    per_token = {b: times[b] / tokens[b] for b in sizes}
    best = min(per_token, key=per_token.get)
    return {"default_batch": default, "best_batch": best, "default_over_best": per_token[default] / per_token[best],
            "seconds_per_token": {str(b): t for b, t in per_token.items()}}


def branch_stats(sampler, records, max_new: int) -> dict:
    from tokencredit.pipeline.config import SamplingConfig

    stats = {}
    for branch in BRANCHES:
        samples = sampler.sample(records, SamplingConfig(tree=(4, 4), max_new_tokens=max_new, branch=branch,
                                                         batch_size=64))
        roots = [samples[i:i + 4] for i in range(0, len(samples), 4)]
        branched = [leaves for leaves in roots if leaves[0].segments[0].end < len(leaves[0].token_ids)]
        differ = [len({tuple(s.token_ids) for s in leaves}) > 1 for leaves in roots]
        stats[branch] = {
            "roots_branched": len(branched) / len(roots),
            "root_share_of_leaf": statistics.mean(s.segments[0].end / max(1, len(s.token_ids)) for s in samples),
            "root_tokens_mean": statistics.mean(s.segments[0].end for s in samples),
            "sibling_sets_that_differ": sum(differ) / len(differ)}
    return stats


@benchmark("tree", measures="`sample_trees` 4 x 4 against 16 flat samples of the same demo prompts (same batch, "
           "threads, budget; alternated, medians); flat sampling's seconds per token at batch 16-256 against the auto "
           "default; where each branch rule lands.", results=("tree.json",),
           targets=(Target("tree_over_flat_time", "<=", TARGET_TREE), Target("default_over_best", "<=", TARGET_BATCH)))
def run(h: Harness) -> dict:
    from tokencredit.pipeline.sample import make_sampler

    parser = argparse.ArgumentParser(prog="python -m bench tree --")
    parser.add_argument("--model", default=None if h.quick else SMOLLM2, help="default: SmolLM2 (--quick: tiny policy)")
    sampler = make_sampler("transformers", parser.parse_args(h.argv).model)
    sampler.progress = False
    prompts, max_new, h.repeats = (1, 8, 1) if h.quick else (8, 96, 3)
    records = demo_records(prompts)
    tree = tree_vs_flat(sampler, records, max_new, 64, h.repeats)
    # the sweep's 6 batch sizes cost 6x a flat run each: 8 prompts (128 rows, one batch of the largest) and 2 reps
    sweep = batch_sweep(sampler, demo_records(prompts), max_new, min(h.repeats, 2))
    figures = {**tree, **sweep, "branch_stats": branch_stats(sampler, records, max_new), "mode": h.mode}
    h.results("tree.json").write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return figures
