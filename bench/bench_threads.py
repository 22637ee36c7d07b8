"""Annotation with 2 torch threads while another process keeps a core busy: OpenMP's default wait
policy (threads spin while they wait for each other) against OMP_WAIT_POLICY=PASSIVE, which
`import tokencredit.pipeline` sets unless the user did.

    python bench/bench_threads.py [--quick]

Each run is a fresh process (OpenMP reads the variable when torch loads it) that loads the shipped
tiny models, then times `run_annotation` (GDPO + MRTPO, cpu_threads 2) while a busy loop runs beside
it; one thread is timed too, for reference. Medians of interleaved runs. Both 2-thread settings must
write the same dataset (the wait policy must not move a bit): their checksums are compared.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SETTINGS = {"spinning": ("default", 2), "passive": ("PASSIVE", 2), "one thread": ("PASSIVE", 1)}


def child(policy: str, threads: int, limit: int) -> None:
    """Annotate in this process; prints {"seconds", "checksum"} as its last line."""
    from tokencredit import pipeline  # noqa: F401 - sets OMP_WAIT_POLICY=PASSIVE unless it is set

    if policy == "default":  # what OpenMP does without tokencredit's setting
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = policy
    from tokencredit.pipeline.annotate import AnnotateConfig, load_models, run_annotation

    config = AnnotateConfig(limit=limit, cpu_threads=threads)
    load_models(config)
    out = tempfile.mkdtemp(prefix="bench_threads_", dir="/tmp")
    try:
        start = time.perf_counter()
        manifest = run_annotation(config, out, progress=False)
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({"seconds": seconds, "checksum": manifest["dataset_checksum"]}))


def beside_a_busy_loop(policy: str, threads: int, limit: int) -> dict:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run([sys.executable, __file__, "--child", policy, str(threads), str(limit)],
                              capture_output=True, text=True, env=env, timeout=1800)
    finally:
        busy.kill()
        busy.wait()
    if done.returncode != 0:
        raise RuntimeError(f"annotation run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer prompts and repeats")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], int(args.child[1]), int(args.child[2]))

    from common import upsert_result, verdict

    limit, repeats = (2, 1) if args.quick else (4, 3)
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for _ in range(repeats):
        for name, (policy, threads) in SETTINGS.items():
            runs[name].append(beside_a_busy_loop(policy, threads, limit))
            print(f"{name}: {runs[name][-1]['seconds']:.1f} s", flush=True)
    median = {name: statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
    spans = {name: f"{min(r['seconds'] for r in rs):.1f}-{max(r['seconds'] for r in rs):.1f} s"
             for name, rs in runs.items()}
    checksums = {name: {r["checksum"] for r in rs} for name, rs in runs.items()}
    same = len(checksums["spinning"] | checksums["passive"]) == 1
    print(f"medians: {median}; same dataset with both wait policies: {same}")
    upsert_result(
        "Thread waiting under load (bench_threads.py)",
        "`run_annotation` with 2 torch threads while a busy loop holds one of the 2 cores (the machine was also "
        "shared with other jobs), OpenMP's default wait policy (spinning) against OMP_WAIT_POLICY=PASSIVE (set by "
        "`import tokencredit.pipeline`), one thread for reference; fresh process per run, medians of interleaved runs.",
        "quick" if args.quick else "full",
        f"{3 * limit} demo prompts x 4 samples (shipped tiny policy, GDPO + MRTPO); {repeats} reps, median",
        "; ".join(f"{name} {median[name]:.1f} s ({spans[name]})" for name in SETTINGS)
        + f"; dataset checksum spinning == passive: {same}",
        f"same dataset with both wait policies: {verdict(same)}")


if __name__ == "__main__":
    main()
