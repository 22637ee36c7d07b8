"""Prefect's temporary API server on a busy machine: default `tokencredit annotate` runs (the Prefect flow,
threads runner, no PREFECT_API_URL) with two busy loops beside them; counts the runs that failed to start.

Each run is tiny (`--limit 1 --n 2`): what is measured is whether Prefect starts, not annotation. The
start timeout is the CLI's default unless `--timeout S` sets PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS
(`--timeout 20`, Prefect's own default, shows what the CLI's default prevents).

    python bench/bench_prefect_start.py            # 20 runs
    python bench/bench_prefect_start.py --quick    # 3 runs
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, upsert_result, verdict

BUSY_LOOPS = 2
START_FAILURE = "temporary API server did not start"


def busy_loop(seconds: float) -> subprocess.Popen:
    """A CPU-bound child that stops by itself after `seconds` (and is stopped earlier by the caller)."""
    code = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def annotate_once(out: Path, timeout: int | None) -> tuple[int, float, str]:
    """(exit status, seconds, stderr) of one default annotate run into `out`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")}
    if timeout is not None:
        env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = str(timeout)
    env["PYTHONPATH"] = str(ROOT)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", "annotate", "--out", str(out), "--limit", "1",
                           "--n", "2"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=1200)
    return done.returncode, time.perf_counter() - start, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 runs instead of 20")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--timeout", type=int, default=None,
                        help="set Prefect's start timeout (default: leave it to the CLI)")
    args = parser.parse_args()
    runs = args.runs or (3 if args.quick else 20)
    loops = [busy_loop(seconds=runs * 600) for _ in range(BUSY_LOOPS)]
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench_prefect_", dir="/tmp") as tmp:
            for i in range(runs):
                rc, seconds, stderr = annotate_once(Path(tmp) / f"run-{i}", args.timeout)
                kind = "ok" if rc == 0 else "start" if START_FAILURE in stderr else "other"
                results.append((kind, seconds))
                print(f"run {i + 1}/{runs}: {kind} in {seconds:.0f} s"
                      + ("" if rc == 0 else f": {stderr.strip().splitlines()[-1][:300]}"), flush=True)
    finally:
        for loop in loops:
            loop.send_signal(signal.SIGTERM)
            loop.wait()
    start_failures = sum(k == "start" for k, _ in results)
    other = sum(k == "other" for k, _ in results)
    times = [s for _, s in results]
    timeout = f"{args.timeout} s (set)" if args.timeout is not None else "the CLI's default"
    mode = ("quick" if args.quick else "full") + ("" if args.timeout is None else f", timeout {args.timeout} s")
    sizes = f"{runs} runs of `tokencredit annotate --limit 1 --n 2`, {BUSY_LOOPS} busy loops, start timeout {timeout}"
    figures = (f"start failures {start_failures}/{runs}, other failures {other}; wall per run median "
               f"{statistics.median(times):.0f} s, max {max(times):.0f} s")
    print(figures)
    upsert_result("Prefect start under load (bench_prefect_start.py)",
                  "Default annotate runs (Prefect flow, temporary API server) next to busy loops on this shared "
                  "machine; a start failure is Prefect's 'Timed out while attempting to connect to ephemeral "
                  "Prefect API server'.", mode, sizes, figures,
                  f"0 start failures: {verdict(start_failures == 0)}" if args.timeout is None
                  else "none: the comparison with Prefect's own start timeout")


if __name__ == "__main__":
    main()
