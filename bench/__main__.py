"""The benchmarks' runner.

    python -m bench --list                          every benchmark: what it measures, targets, results, citing pages
    python -m bench NAME [--quick] [-- OPTIONS]     run one; its row goes to bench/results/runs.jsonl
    python -m bench NAME NAME ... [--quick]         run several in turn in this one process (models loaded once)
    python -m bench --results-md [--check]          render bench/RESULTS.md from the rows (--check: only compare)

A quick run (tiny sizes, no verdict) writes into a temporary folder (or --results-dir), never into bench/results.
OPTIONS after `--` go to the benchmark's own parser (`python -m bench NAME -- --help` lists them). Of several, one that
fails is reported in one line and the others still run (exit status 1).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts import their helpers as `common`

from common import RESULTS_DIR, RUNS, Harness, write_row  # noqa: E402
from registry import Benchmark, Unavailable, load_all  # noqa: E402


def describe(bench: Benchmark) -> str:
    targets = ", ".join(map(str, bench.targets)) or "none (a study: its figures are read, not checked)"
    lines = [bench.name, f"  measures: {bench.measures}", f"  targets:  {targets}",
             f"  results:  {', '.join(bench.results) or 'runs.jsonl only'}",
             f"  cited by: {', '.join(bench.citations()) or 'no doc page'}"]
    if bench.needs:
        lines.append(f"  needs:    {', '.join(bench.needs)}")
    return "\n".join(lines)


def missing(bench: Benchmark) -> list[str]:
    return [module for module in bench.needs if importlib.util.find_spec(module) is None]


def run(bench: Benchmark, quick: bool, results_dir: Path, argv: list[str]) -> dict:
    """Run `bench` and append its row to results_dir/runs.jsonl; returns the row."""
    h = Harness(quick=quick, results_dir=results_dir, argv=argv)
    before = os.getloadavg()
    figures = bench.run(h)
    targets = [{"name": t.figure, "comparison": t.comparison, "value": t.value, "met": t.met(figures)}
               for t in bench.targets]
    return write_row(h.results(RUNS), bench.name, h, before, figures, targets)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="the benchmarks to run (--list names them)")
    parser.add_argument("--list", action="store_true", help="describe every benchmark")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, written to a temporary folder")
    parser.add_argument("--results-dir", type=Path, default=None, help="where rows and figures go (default: "
                        "bench/results; --quick: a new temporary folder)")
    parser.add_argument("--results-md", action="store_true", help="render bench/RESULTS.md from the rows")
    parser.add_argument("--check", action="store_true", help="with --results-md: fail when RESULTS.md differs from "
                        "its rendering, writing nothing")
    args = parser.parse_args(own)
    benchmarks = load_all()
    if args.list:
        print("\n\n".join(describe(b) for b in benchmarks.values()))
        return 0
    if args.results_md:
        from report import write_results_md

        return write_results_md(benchmarks, args.results_dir or RESULTS_DIR, args.check)
    if not args.names:
        parser.error("name a benchmark to run; `python -m bench --list` names them")
    if unknown := [name for name in args.names if name not in benchmarks]:
        parser.error(f"no benchmark {unknown[0]!r}; `python -m bench --list` names them")
    if extra and len(args.names) > 1:
        parser.error("options after `--` go to one benchmark: name only that one")
    results_dir = args.results_dir or (Path(tempfile.mkdtemp(prefix="bench-quick-")) if args.quick else RESULTS_DIR)
    failed = [name for name in args.names if not run_one(benchmarks[name], args.quick, results_dir, extra)]
    if results_dir.resolve() == RESULTS_DIR.resolve():
        from report import write_results_md

        write_results_md(benchmarks, results_dir)
    return int(bool(failed))


def run_one(bench: Benchmark, quick: bool, results_dir: Path, extra: list[str]) -> bool:
    """Run `bench` and print its figures and missed targets, or why it was skipped or failed (False)."""
    if absent := missing(bench):
        print(f"{bench.name}: skipped: needs {', '.join(absent)}, which does not import here", flush=True)
        return True
    start = time.perf_counter()
    try:
        row = run(bench, quick, results_dir, extra)
    except Unavailable as why:
        print(f"{bench.name}: skipped: {why}", flush=True)
        return True
    except Exception:  # noqa: BLE001 - one failed benchmark must not stop the others
        print(f"{bench.name}: failed:\n{traceback.format_exc()}", flush=True)
        return False
    missed = [t["name"] for t in row["targets"] if t["met"] is False]
    print(f"{bench.name} ({row['mode']}, {time.perf_counter() - start:.1f} s): {row['figures']}\n"
          f"targets missed: {', '.join(missed) or 'none'}; row in {results_dir / 'runs.jsonl'}", flush=True)
    return True


if __name__ == "__main__":
    sys.exit(main())
