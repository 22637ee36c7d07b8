"""Rows per second and peak memory of `run_annotation` at 1x, 4x and 16x a base prompt count.

    python -m bench scale [--quick] [-- [--base N]]

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
import sys
import tempfile
import time

from common import THREADS, Harness, model_paths, peak_extra_bytes
from registry import Target, benchmark

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


@benchmark("scale", measures="`run_annotation` (sample, verify, GDPO + MRTPO credit, write) at 1x, 4x and 16x a "
           "base prompt count, each in a fresh process after loading the models: credit rows/s and peak extra RSS; the "
           "time ratios against the rows ratios.", targets=(Target("at_most_linear", "==", True),))
def run(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench scale --")
    parser.add_argument("--base", type=int, default=3 if h.quick else 6, help="prompts at 1x (a multiple of the task count)")
    base = parser.parse_args(h.argv).base
    factors = (1, 2) if h.quick else FACTORS
    h.repeats = 1
    runs = {f: h.run_child(__file__, ["--child", str(base * f)], timeout=1800) for f in factors}
    figures = {"base_prompts": base}
    for f in factors:
        credits, seconds = runs[f]["totals"]["credits"], runs[f]["seconds"]
        figures |= {f"credit_rows_{f}x": credits, f"seconds_{f}x": round(seconds, 2),
                    f"rows_per_s_{f}x": round(credits / seconds), f"peak_extra_mib_{f}x": round(runs[f]["extra"] / 2**20, 1)}
    ratios = {f: runs[f]["seconds"] / runs[1]["seconds"] for f in factors[1:]}
    rows = {f: runs[f]["totals"]["credits"] / runs[1]["totals"]["credits"] for f in factors[1:]}
    for f in factors[1:]:
        figures |= {f"time_ratio_{f}x": round(ratios[f], 3), f"rows_ratio_{f}x": round(rows[f], 3)}
    # at most linear: time grows no faster than the work (credit rows), within 25%; a fixed start-up
    # cost (first batches, writer set-up) makes the small run slower per row, so growth below
    # linear is expected
    return figures | {"at_most_linear": all(ratios[f] / rows[f] <= 1.25 for f in factors[1:])}


if __name__ == "__main__":  # a child process of run(): --child PROMPTS
    child(int(sys.argv[2]))
