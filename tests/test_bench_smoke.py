"""Every registered benchmark runs in its --quick mode (tiny sizes, a temporary results folder), so that no benchmark
rots between its full runs, which stay manual. A benchmark that cannot run here (vllm missing, reference checkers not
unpacked, SmolLM2 not pulled, no CUDA device) is skipped with the runner's reason. The benchmarks that start vLLM
engines are marked slow.

They run as `python -m bench NAME ... --quick` in child processes (importing bench/common sets torch's thread count):
those that start no engine all in one, in turn, so that the imports and the tiny models load once; an engine's alone."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# they start vLLM engines (minutes on the shared CPU), like tests/test_vllm.py; gpu's CPU check starts none
ENGINE = {"engine", "peer"}
OWN_TEST = {"peer": "tests/test_bench_peer.py"}  # run --quick there, with every key of its row checked


def registered() -> list[str]:
    """The names of bench/bench_*.py's and gpu_bench.py's `@benchmark("NAME", ...)`."""
    return sorted(name for path in [*BENCH.glob("bench_*.py"), BENCH / "gpu_bench.py"]
                  for name in re.findall(r'^@benchmark\("(\w+)"', path.read_text(), re.MULTILINE))


SHARED = [n for n in registered() if n not in ENGINE | set(OWN_TEST)]  # in one process


def marks(name: str) -> list:
    if name not in ENGINE:
        return []
    return [pytest.mark.vllm, pytest.mark.slow]  # without vllm the runner skips them


def results_state() -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (BENCH / "results").iterdir()}


def test_the_smoke_list_is_the_registry():
    done = subprocess.run([sys.executable, "-m", "bench", "--list"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = sorted(block.splitlines()[0] for block in done.stdout.strip().split("\n\n"))
    assert listed == registered()


def quick_run(names: list[str], folder: Path) -> tuple[subprocess.CompletedProcess, bool]:
    """`python -m bench NAMES --quick` into `folder`; (the run, whether bench/results stayed as it was)."""
    before = results_state()
    done = subprocess.run([sys.executable, "-m", "bench", *names, "--quick", "--results-dir", str(folder)],
                          capture_output=True, text=True, cwd=ROOT, timeout=1800)
    return done, results_state() == before


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quick")
    return (*quick_run(SHARED, folder), folder)


@pytest.mark.parametrize("name", [pytest.param(n, marks=marks(n)) for n in registered() if n not in OWN_TEST])
def test_the_quick_run_writes_its_row_and_nothing_in_bench_results(name, request, tmp_path):
    done, untouched, folder = (request.getfixturevalue("shared_run") if name in SHARED
                               else (*quick_run([name], tmp_path), tmp_path))
    assert f"{name}: failed:" not in done.stdout, done.stdout[done.stdout.index(f"{name}: failed:"):][:4000]
    assert untouched
    if f"{name}: skipped: " in done.stdout:
        pytest.skip(done.stdout.split(f"{name}: skipped: ")[1].splitlines()[0].strip())
    runs = folder / "runs.jsonl"
    rows = [json.loads(line) for line in runs.read_text().splitlines()] if runs.is_file() else []
    rows = [row for row in rows if row["benchmark"] == name]
    assert len(rows) == 1, done.stdout[-2000:] + done.stderr[-3000:]
    row = rows[0]
    assert row["mode"] == "quick" and row["figures"]
    assert all(t["met"] in (True, False, None) for t in row["targets"])
