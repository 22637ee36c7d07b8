"""`tokencredit --help` and `tokencredit annotate --help` wall time in a fresh process (median of 5), against
the time to import torch and transformers, which the command line no longer does at start.

    python bench/bench_cli_start.py [--quick]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from common import ROOT, upsert_result, verdict

TARGET_S = 2.0


def wall(args: list[str], repeats: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of 5")
    repeats = 3 if parser.parse_args().quick else 5
    help_s = wall(["-m", "tokencredit.flows.cli", "--help"], repeats)
    annotate_s = wall(["-m", "tokencredit.flows.cli", "annotate", "--help"], repeats)
    imports_s = wall(["-c", "import torch, transformers; transformers.DynamicCache"], repeats)
    figures = (f"`--help` {help_s:.2f} s, `annotate --help` {annotate_s:.2f} s; importing torch + transformers "
               f"alone {imports_s:.2f} s")
    print(figures)
    upsert_result("Command line start (bench_cli_start.py)",
                  "Wall time of the help commands in a fresh Python process (median), next to the imports the "
                  "command line leaves to the commands that need them.",
                  "quick" if repeats == 3 else "full", f"{repeats} runs each, fresh process", figures,
                  f"< {TARGET_S:g} s: {verdict(max(help_s, annotate_s) < TARGET_S)}")


if __name__ == "__main__":
    main()
