"""`tokencredit --help` and `tokencredit annotate --help` wall time in a fresh process (median of 5), against
the time to import torch and transformers, which the command line no longer does at start.

    python -m bench cli_start [--quick]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from common import ROOT, Harness
from registry import Target, benchmark

TARGET_S = 2.0


def wall(args: list[str], repeats: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@benchmark("cli_start", measures="Wall time of `tokencredit --help` and `tokencredit annotate --help` in a fresh "
           "Python process (median), next to importing torch + transformers, which the command line leaves to the "
           "commands that need them.", targets=(Target("slowest_help_s", "<", TARGET_S),))
def run(h: Harness) -> dict:
    h.repeats = 1 if h.quick else 5
    help_s = wall(["-m", "tokencredit.flows.cli", "--help"], h.repeats)
    annotate_s = wall(["-m", "tokencredit.flows.cli", "annotate", "--help"], h.repeats)
    figures = {"help_s": round(help_s, 3), "annotate_help_s": round(annotate_s, 3),
               "slowest_help_s": round(max(help_s, annotate_s), 3)}
    if not h.quick:  # the comparison only: the seconds the commands do not spend
        imports = ["-c", "import torch, transformers; transformers.DynamicCache"]
        figures["imports_s"] = round(wall(imports, h.repeats), 3)
    return figures
