"""Speed of `tokencredit values` against the sampler on the same batch (issue 26).

    python -m bench values [--quick] [-- [--run bench/.own/both] [--pairs 64] [--k 16] [--cuts 8]]

Side by side, chunk by chunk of responses (values first in even chunks, the sampler first in odd ones, so load
from other processes falls on both alike):

- values: `pipeline.values.values_shard` on the chunk, end to end: the originals verified for their span starts,
  every cut's K continuations (`continue_prefixes`: each prefix prefilled once, its cache copied to its K rows),
  each continuation decoded and verified, the curves and decisive segments built;
- sampler: the transformers sampler's `generate` on the same rows (prompt + prefix, the same seeds), in batches of
  the same size holding the same prefixes, each batch decoding up to its longest row's budget as `generate` does.

The figure is seconds per continuation token (the tokens each side drew): the issue's target is values within 1.2x
of the sampler's. The target's size is 64 failed pairs x 8 cuts x K 16; a smaller `--pairs` is reported as such.
The figures so far are written after every chunk, so a stopped run leaves what it measured (labelled reduced);
`--resume` continues it from the next chunk.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from common import ROOT, Harness
from registry import Target, benchmark

TARGET = dict(pairs=64, cuts=8, k=16)


def sampler_side(sampler, chunk, cut_maps, sampling, config) -> tuple[float, int]:
    """(seconds, tokens) of the flat sampler on the chunk's rows, batched as continue_prefixes batches them."""
    from tokencredit.pipeline.sample.tree import _batches
    from tokencredit.pipeline.values import continuation_seed

    prefixes = [(c, p) for c, m in zip(chunk, cut_maps) for p in m]
    started, tokens = time.perf_counter(), 0
    for batch in _batches(list(range(len(prefixes))), [config.k] * len(prefixes), config.batch_size):
        prompts, seeds, budget = [], [], 0
        for i in batch:
            curve, p = prefixes[i]
            prompts += [[*curve.prompt_token_ids, *curve.token_ids[:p]]] * config.k
            seeds += [continuation_seed(sampling.seed, curve.response_id, p, j) for j in range(config.k)]
            budget = max(budget, sampling.max_new_tokens - p)
        out, _ = sampler.generate(prompts, seeds, dataclasses.replace(sampling, max_new_tokens=budget))
        tokens += sum(map(len, out))
    return time.perf_counter() - started, tokens


def measure(args, on_chunk=None) -> dict:
    from tokencredit.pipeline.dataset.export import run_records
    from tokencredit.pipeline.sample.transformers_backend import load_sampler
    from tokencredit.pipeline.annotate import verify_samples
    from tokencredit.pipeline.values import (ValuesConfig, _sample, cut_sources, run_pairs, run_sampling, select,
                                             values_shard)

    settings, sampling = run_sampling(args.run)
    config = ValuesConfig(k=args.k, cuts=args.cuts, pairs=args.pairs, seed=args.seed, batch_size=args.batch_size)
    curves = select(*run_pairs(args.run), config)
    records, _, refs = run_records(args.run)
    sampler, tokenizer = load_sampler(settings.get("model"))
    totals = {"values_s": 0.0, "values_tokens": 0, "sampler_s": 0.0, "sampler_tokens": 0, "values_sampling_s": 0.0}
    chunks = [curves[i:i + args.chunk] for i in range(0, len(curves), args.chunk)]
    done = resumed(args, sum(len(c.pairs) for c in curves), totals)
    result = summary(settings.get("model"), args, [c for chunk in chunks[:done] for c in chunk], totals) \
        if done else None
    for n, chunk in enumerate(chunks):
        if n < done:
            continue
        originals = verify_samples([_sample(c, c.response, c.response_id) for c in chunk], records, refs)
        cut_maps = [cut_sources(c, [list(s.spans) for s in v.rewards], tokenizer, args.cuts)
                    for c, v in zip(chunk, originals)]

        def values():
            started = time.perf_counter()
            _, _, counts = values_shard(chunk, records, sampler, tokenizer, sampling, config, refs)
            totals["values_s"] += time.perf_counter() - started
            totals["values_tokens"] += counts["continuation_tokens"]
            totals["values_sampling_s"] += counts["sampling_s"]

        def flat():
            seconds, tokens = sampler_side(sampler, chunk, cut_maps, sampling, config)
            totals["sampler_s"] += seconds
            totals["sampler_tokens"] += tokens
        for side in ((values, flat) if n % 2 == 0 else (flat, values)):
            side()
        print(f"chunk {n + 1}/{len(chunks)}: {json.dumps({k: round(v, 2) for k, v in totals.items()})}", flush=True)
        result = summary(settings.get("model"), args, [c for chunk in chunks[:n + 1] for c in chunk], totals)
        if on_chunk is not None:
            on_chunk({**result, "pairs_planned": sum(len(c.pairs) for c in curves), "chunk": args.chunk,
                      "seed": args.seed, "chunks_done": n + 1})
    return result


def resumed(args, planned: int, totals: dict) -> int:
    """With --resume: the chunks values_speed.json already measured with these settings (their totals added to
    `totals`), else 0."""
    if not args.resume or not args.results.exists():
        return 0
    old = json.loads(args.results.read_text())
    same = {"run": args.run, "cuts": args.cuts, "k": args.k, "batch_size": args.batch_size, "pairs_planned": planned,
            "chunk": args.chunk, "seed": args.seed}
    if any(old.get(key) != value for key, value in same.items()):
        print(f"--resume: {args.results} measured other settings; starting over", flush=True)
        return 0
    for key in totals:
        totals[key] = old[key]
    print(f"--resume: {old['chunks_done']} chunks already measured", flush=True)
    return old["chunks_done"]


def summary(model: str | None, args, curves, totals: dict) -> dict:
    """The figures over the chunks measured so far (`curves`: their responses)."""
    per_token = {side: totals[f"{side}_s"] / max(totals[f"{side}_tokens"], 1) for side in ("values", "sampler")}
    return {"model": model, "run": args.run, "pairs": sum(len(c.pairs) for c in curves),
            "responses": len(curves), "cuts": args.cuts, "k": args.k, "batch_size": args.batch_size, **totals,
            "values_s_per_token": per_token["values"], "sampler_s_per_token": per_token["sampler"],
            "ratio": per_token["values"] / per_token["sampler"],
            "sampling_only_ratio": totals["values_sampling_s"] / max(totals["values_tokens"], 1) / per_token["sampler"]}


def tiny_run(folder: Path) -> str:
    """A quick run's input: the demo set annotated by the shipped tiny policy (2 prompts per task x 4 responses)."""
    from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
    from tokencredit.pipeline.config import SamplingConfig

    run_annotation(AnnotateConfig(limit=2, sampling=SamplingConfig(n=4, max_new_tokens=24)), str(folder), progress=False)
    return str(folder)


@benchmark("values", measures="`tokencredit values` end to end (cuts, continuations sharing each prefix's cache, "
           "verification, curves) against the sampler's `generate` on the same rows and batches, interleaved chunk by "
           "chunk: seconds per continuation token.", results=("values_speed.json",),
           targets=(Target("ratio", "<=", 1.2),))
def run(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench values --")
    parser.add_argument("--run", default=None, help="a complete run (default: bench/.own/both, as bench/own_runs.py, "
                        "removed after 3cfae4c, wrote it; --quick: a tiny-policy run of the demo set)")
    parser.add_argument("--pairs", type=int, default=2 if h.quick else TARGET["pairs"])
    parser.add_argument("--k", type=int, default=2 if h.quick else TARGET["k"])
    parser.add_argument("--cuts", type=int, default=2 if h.quick else TARGET["cuts"])
    parser.add_argument("--batch-size", type=int, default=128, help="continuations per forward (both sides)")
    parser.add_argument("--chunk", type=int, default=2, help="responses per timed chunk")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue after the chunks values_speed.json holds "
                        "(the same run and settings)")
    args = parser.parse_args(h.argv)
    args.results = h.results("values_speed.json")
    with tempfile.TemporaryDirectory(prefix="bench-values-") as work:
        args.run = args.run or (tiny_run(Path(work) / "run") if h.quick else str(ROOT / "bench" / ".own" / "both"))
        h.repeats = 1
        result = measure(args, on_chunk=lambda result: args.results.write_text(json.dumps(result, indent=1) + "\n"))
    # a run smaller than the target's is no verdict on it
    return result | {"reduced": any(getattr(args, key) < value for key, value in TARGET.items())}
