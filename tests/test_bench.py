"""The benchmarks' runner (`python -m bench`): the registry lists every bench/bench_*.py, a run writes one row of the
results schema, bad input gets one line.

Run in child processes: importing bench/common sets torch's thread count for the whole process."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
ROW_KEYS = ["benchmark", "commit", "date", "machine", "torch_threads", "load_avg", "repeats", "mode", "figures",
            "targets"]


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, cwd=ROOT)


def in_child(code: str) -> subprocess.CompletedProcess:
    """`code` after the runner's imports (`runner`: bench/__main__.py's names; the registry's)."""
    head = (f"import sys, json, pathlib, runpy; sys.path.insert(0, {str(BENCH)!r})\n"
            f"runner = runpy.run_path({str(BENCH / '__main__.py')!r}, run_name='runner')\n"
            "from registry import REGISTRY, Target, Unavailable, benchmark\n")
    return subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, cwd=ROOT)


def test_the_list_names_one_benchmark_per_script_with_what_it_measures():
    done = bench("--list")
    assert done.returncode == 0, done.stderr[-2000:]
    blocks = done.stdout.strip().split("\n\n")
    names = [block.splitlines()[0] for block in blocks]
    assert len(names) == len(set(names)) == len([*BENCH.glob("bench_*.py"), BENCH / "gpu_bench.py"])
    for block in blocks:
        fields = dict(line.strip().split(":", 1) for line in block.splitlines()[1:])
        assert {"measures", "targets", "results", "cited by"} <= set(fields), block
        assert fields["measures"].strip(), block


def test_every_results_file_a_benchmark_names_exists():
    """Except gpu_bench.json, which only a run on a CUDA device writes (none has been recorded)."""
    done = in_child("from registry import load_all\n"
                    "print(json.dumps(sorted({f for b in load_all().values() for f in b.results})))")
    assert done.returncode == 0, done.stderr[-2000:]
    files = set(json.loads(done.stdout)) - {"gpu_bench.json"}
    assert files and all((BENCH / "results" / f).is_file() for f in files), files


def test_a_run_appends_one_row_of_the_schema_with_its_targets_judged(tmp_path):
    done = in_child(
        "@benchmark('sums', measures='sum() over a list', targets=(Target('sum_s', '<', 60), Target('total', '==', 1),"
        " Target('absent', '>=', 1), Target('total', '>', 'sum_s')))\n"
        "def sums(h):\n"
        "    h.repeats = 3\n"
        "    seconds, _ = h.median_time(lambda: sum(range(1000)), repeats=h.repeats)\n"
        "    h.update_figures({'total': 499500}, 'sums.json')\n"
        "    return {'sum_s': seconds, 'total': sum(range(1000))}\n"
        f"runner['run'](REGISTRY['sums'], True, pathlib.Path({str(tmp_path)!r}), [])\n"
        f"runner['run'](REGISTRY['sums'], False, pathlib.Path({str(tmp_path)!r}), [])\n")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [list(row) for row in rows] == [ROW_KEYS, ROW_KEYS]
    quick, full = rows
    assert (quick["mode"], full["mode"]) == ("quick", "full")
    assert quick["benchmark"] == "sums" and quick["repeats"] == 3 and quick["figures"]["total"] == 499500
    assert len(quick["commit"].removesuffix("+dirty")) == 40
    assert set(quick["machine"]) == {"cores", "memory_gib", "cpu", "device"} and quick["machine"]["cores"] >= 1
    assert quick["torch_threads"] >= 1
    assert len(quick["load_avg"]["before"]) == len(quick["load_avg"]["after"]) == 3
    assert quick["targets"] == [{"name": "sum_s", "comparison": "<", "value": 60, "met": True},
                                {"name": "total", "comparison": "==", "value": 1, "met": False},
                                {"name": "absent", "comparison": ">=", "value": 1, "met": None},
                                {"name": "total", "comparison": ">", "value": "sum_s", "met": True}]
    assert json.loads((tmp_path / "sums.json").read_text()) == {"total": 499500}


def test_a_benchmark_that_cannot_run_here_is_skipped_without_a_row(tmp_path):
    done = in_child(
        "@benchmark('gpu_only', measures='needs a device')\n"
        "def gpu_only(h):\n"
        "    raise Unavailable('no CUDA device')\n"
        "@benchmark('needs_module', measures='needs a module', needs=('no_such_module_here',))\n"
        "def needs_module(h):\n"
        "    raise AssertionError('ran although its module is missing')\n"
        "runner['main'].__globals__['load_all'] = lambda: dict(REGISTRY)  # these two only\n"
        "print(runner['main'](['gpu_only', '--results-dir', " + repr(str(tmp_path)) + "]))\n"
        "print(runner['main'](['needs_module', '--results-dir', " + repr(str(tmp_path)) + "]))\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "gpu_only: skipped: no CUDA device" in done.stdout
    assert "needs_module: skipped: needs no_such_module_here" in done.stdout
    assert not (tmp_path / "runs.jsonl").exists()


def test_an_unknown_benchmark_is_one_line_naming_it():
    done = bench("no_such_benchmark", "--quick")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("python -m bench: error: no benchmark 'no_such_benchmark'; "
                                                    "`python -m bench --list` names them")
    assert "Traceback" not in done.stderr


def test_results_md_is_the_rendering_of_the_rows():
    done = bench("--results-md", "--check")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


def test_a_new_row_makes_results_md_stale_until_it_is_rendered_again(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for name in ("runs.jsonl", "markdown_rows.jsonl"):
        if (BENCH / "results" / name).is_file():
            (results / name).write_text((BENCH / "results" / name).read_text())
    assert bench("--results-md", "--results-dir", str(results)).returncode == 0
    assert bench("--results-md", "--check", "--results-dir", str(results)).returncode == 0
    row = {"benchmark": "writer", "commit": "0" * 40, "date": "2026-12-07T18:00:00+00:00",
           "machine": {"cores": 3, "memory_gib": 7, "cpu": "Test CPU", "device": "cpu"}, "torch_threads": 1,
           "load_avg": {"before": [0.5, 0.4, 0.3], "after": [0.7, 0.5, 0.3]}, "repeats": 5, "mode": "full",
           "figures": {"writer_over_raw": 0.61234, "nested": {"left": "out"}},
           "targets": [{"name": "writer_over_raw", "comparison": ">=", "value": 0.7, "met": False}]}
    with open(results / "runs.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    stale = bench("--results-md", "--check", "--results-dir", str(results))
    assert stale.returncode == 1 and "stale" in stale.stdout
    assert bench("--results-md", "--results-dir", str(results)).returncode == 0
    text = (tmp_path / "RESULTS.md").read_text()
    writer = text[text.index("## writer"):text.index("### Rows before the runner", text.index("## writer"))]
    assert ("| 3-core Test CPU, 7 GiB, 1 torch thread(s) | 2026-12-07 | full | 0000000000 | 0.5, 0.7 | 5 | "
            "writer_over_raw 0.6123 | writer_over_raw >= 0.7: MISSED |") in writer
    assert "nested" not in writer
