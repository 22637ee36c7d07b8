"""Every registered benchmark runs in its --quick mode (tiny sizes, a temporary results folder), so that no benchmark
rots between its full runs, which stay manual. A benchmark that cannot run here (vllm missing, reference checkers not
unpacked, SmolLM2 not pulled, no CUDA device) is skipped with the runner's reason. The benchmarks that start vLLM
engines are marked slow.

Each runs as `python -m bench NAME --quick` in a child process: importing bench/common sets torch's thread count."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# they start vLLM engines (minutes on the shared CPU; gpu's CPU check too where vllm imports), like tests/test_vllm.py
ENGINE = {"engine", "engine_choice", "peer", "gpu"}
OWN_TEST = {"peer": "tests/test_bench_peer.py"}  # run --quick there, with every key of its row checked


def registered() -> list[str]:
    """The names of bench/bench_*.py's and gpu_bench.py's `@benchmark("NAME", ...)`."""
    return sorted(name for path in [*BENCH.glob("bench_*.py"), BENCH / "gpu_bench.py"]
                  for name in re.findall(r'^@benchmark\("(\w+)"', path.read_text(), re.MULTILINE))


def marks(name: str) -> list:
    if name not in ENGINE:
        return []
    return [pytest.mark.vllm, pytest.mark.slow]  # without vllm the runner skips them (gpu runs its torch part)


def results_state() -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (BENCH / "results").iterdir()}


def test_the_smoke_list_is_the_registry():
    done = subprocess.run([sys.executable, "-m", "bench", "--list"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = sorted(block.splitlines()[0] for block in done.stdout.strip().split("\n\n"))
    assert listed == registered()


@pytest.mark.parametrize("name", [pytest.param(n, marks=marks(n)) for n in registered() if n not in OWN_TEST])
def test_the_quick_run_writes_its_row_and_nothing_in_bench_results(name, tmp_path):
    before = results_state()
    done = subprocess.run([sys.executable, "-m", "bench", name, "--quick", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert results_state() == before
    if f"{name}: skipped: " in done.stdout:
        pytest.skip(done.stdout.split(f"{name}: skipped: ")[1].strip())
    rows = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert row["benchmark"] == name and row["mode"] == "quick" and row["figures"]
    assert all(t["met"] in (True, False, None) for t in row["targets"])
