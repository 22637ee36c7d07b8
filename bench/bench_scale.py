"""Rows per second and peak memory of `run_annotation` at 1x, 4x and 16x a base prompt count.

    python bench/bench_scale.py [--quick] [--base N]

Each size runs in a fresh process (the models are loaded before the clock starts, so the time is
the stage itself, and the peak RSS is that of the run): credit rows per second, seconds and peak
extra RSS. Linear cost means time ratios near 4 and 16. Prompts are taken round-robin over the
demo tasks (`limit` per task), credit ("gdpo", "mrtpo"); the default base keeps the 16x run within
about 5 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time

from common import THREADS, mib, model_paths, peak_extra_bytes, run_child, upsert_result, verdict

FACTORS = (1, 4, 16)


def config_for(prompts: int, policy_path, rm_path):
    """AnnotateConfig with `prompts` demo prompts spread over the tasks (limit per task)."""
    from tokencredit.pipeline.annotate import AnnotateConfig, load_prompt_set

    tasks = sorted({r.task for r in load_prompt_set(AnnotateConfig(limit=None))[0]})
    if prompts % len(tasks):
        raise ValueError(f"--base x factor must be a multiple of the {len(tasks)} demo tasks {tasks}")
    return AnnotateConfig(tasks=tuple(tasks), limit=prompts // len(tasks), model=policy_path, reward_model=rm_path,
                          cpu_threads=THREADS)


def child(prompts: int) -> None:
    from tokencredit.pipeline.annotate import load_models, run_annotation

    policy_path, rm_path, _ = model_paths()
    config = config_for(prompts, policy_path, rm_path)
    load_models(config)
    out = tempfile.mkdtemp(prefix="bench_scale_", dir="/tmp")
    try:
        start = time.perf_counter()
        extra, manifest = peak_extra_bytes(lambda: run_annotation(config, out, progress=False))
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({"prompts": prompts, "seconds": seconds, "extra": extra, "totals": manifest["totals"]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="factors 1x and 4x only")
    parser.add_argument("--base", type=int, default=6, help="prompts at 1x (a multiple of the task count)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)

    _, _, note = model_paths()
    factors = FACTORS[:2] if args.quick else FACTORS
    print(f"sizes: base {args.base} prompts x {factors}, 4 samples each, max_new_tokens 96, credit gdpo+mrtpo; "
          f"{note}")
    runs = {}
    for f in factors:
        runs[f] = run_child(__file__, ["--child", str(args.base * f)], timeout=1800)
        r = runs[f]
        print(f"{f:2d}x: {r['prompts']} prompts, {r['totals']['responses']} responses, {r['totals']['credits']} "
              f"credit rows in {r['seconds']:.1f} s = {r['totals']['credits'] / r['seconds']:,.0f} rows/s; "
              f"peak extra RSS {mib(r['extra'])}", flush=True)
    ratios = {f: runs[f]["seconds"] / runs[1]["seconds"] for f in factors[1:]}
    rows = {f: runs[f]["totals"]["credits"] / runs[1]["totals"]["credits"] for f in factors[1:]}
    # at most linear: time grows no faster than the work (credit rows), within 25%; a fixed start-up
    # cost (first batches, writer set-up) makes the small run slower per row, so growth below
    # linear is expected
    linear = all(ratios[f] / rows[f] <= 1.25 for f in factors[1:])
    print("time ratios: " + ", ".join(f"{f}x/1x = {ratios[f]:.2f} (rows {rows[f]:.2f})" for f in factors[1:])
          + f"; at most linear: {verdict(linear)}")
    upsert_result(
        "Annotation scaling (bench_scale.py)",
        "`run_annotation` (sample, verify, GDPO + MRTPO credit, write) at 1x/4x/16x a base prompt count, "
        "each in a fresh process after loading the models; peak extra RSS of the run.",
        "quick" if args.quick else "full",
        f"base {args.base} prompts x 4 samples, max_new_tokens 96; {note}",
        "; ".join(f"{f}x: {runs[f]['totals']['credits']} rows, {runs[f]['seconds']:.1f} s, "
                  f"{runs[f]['totals']['credits'] / runs[f]['seconds']:,.0f} rows/s, peak {mib(runs[f]['extra'])}"
                  for f in factors)
        + "; time ratios " + ", ".join(f"{f}x/1x {ratios[f]:.2f} (rows {rows[f]:.2f})" for f in factors[1:]),
        f"at most linear (time ratio <= 1.25 x rows ratio): {verdict(linear)}",
    )


if __name__ == "__main__":
    main()
