"""The benchmarks' registry: each `bench/bench_NAME.py` registers one function with `@benchmark`.

    @benchmark("writer", measures="RunWriter against raw Parquet ...", results=("speed.json",),
               targets=(Target("writer_over_raw", ">=", 0.7),))
    def run(h: Harness) -> dict: ...            # the figures, a flat dict of JSON values

`python -m bench NAME` runs it and appends its row (bench/common.write_row) to the results folder's runs.jsonl; a
target is met when the figure it names compares to its value as stated (a missing figure: not measured).
"""
from __future__ import annotations

import importlib
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
MODULES = ("bench_*.py", "gpu_bench.py")  # the files that register a benchmark
SHARED = ("speed.json",)  # results files several benchmarks set keys of
COMPARISONS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq}


class Unavailable(RuntimeError):
    """Raised by a benchmark that cannot run here (no CUDA device, reference checkers not unpacked): the runner
    reports it as skipped and writes no row."""


@dataclass(frozen=True)
class Target:
    """`figure comparison value`, e.g. Target("mrtpo_over_gdpo", "<=", 1.15); a str value names another figure
    (Target("decode_flops_over_gemm_peak", ">=", "decode_flops_over_gemm_peak_peer"))."""
    figure: str
    comparison: str
    value: float | bool | str

    def __post_init__(self):
        if self.comparison not in COMPARISONS:
            raise ValueError(f"target {self.figure}: comparison {self.comparison!r} is not one of {sorted(COMPARISONS)}")

    def met(self, figures: dict) -> bool | None:
        """None where the run has no such figure (a variant that does not measure it)."""
        found = figures.get(self.figure)
        bound = figures.get(self.value) if isinstance(self.value, str) else self.value
        return None if found is None or bound is None else bool(COMPARISONS[self.comparison](found, bound))

    def __str__(self) -> str:
        return f"{self.figure} {self.comparison} {self.value}"


@dataclass(frozen=True)
class Benchmark:
    name: str
    measures: str
    run: Callable
    module: str
    results: tuple[str, ...] = ()
    targets: tuple[Target, ...] = ()
    needs: tuple[str, ...] = ()  # importable modules it cannot run without (e.g. "vllm"); missing: skipped

    def citations(self) -> list[str]:
        """The doc pages (docs/**.md; a template counts as the page it renders) that name its module, `bench NAME`, or
        one of its results files; a file several benchmarks write (speed.json) counts with one of its target figures."""
        own = (f"{self.module}.py", f"bench {self.name}")
        pages = set()
        for path in (ROOT / "docs").rglob("*.md*"):
            text = path.read_text()
            files = [f for f in self.results if f in text]
            shared = all(f in SHARED for f in files)
            if any(n in text for n in own) or files and (not shared or any(t.figure in text for t in self.targets)):
                pages.add(str(path.relative_to(ROOT)).replace("templates/", "").removesuffix(".j2"))
        return sorted(pages)


REGISTRY: dict[str, Benchmark] = {}


def benchmark(name: str, measures: str, results: tuple[str, ...] = (), targets: tuple[Target, ...] = (),
              needs: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Register the decorated `run(h: Harness) -> dict` under `name` (a second registration of a name is an error)."""
    def register(run: Callable) -> Callable:
        if name in REGISTRY and REGISTRY[name].module != run.__module__:
            raise ValueError(f"benchmark {name!r} is registered twice ({REGISTRY[name].module}, {run.__module__})")
        REGISTRY[name] = Benchmark(name, " ".join(measures.split()), run, run.__module__, tuple(results),
                                   tuple(targets), tuple(needs))
        return run
    return register


def load_all() -> dict[str, Benchmark]:
    """Import every module of MODULES (each registers itself); name -> Benchmark, sorted by name."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the scripts import their helpers as `common`
    for path in sorted(p for pattern in MODULES for p in BENCH.glob(pattern)):
        importlib.import_module(path.stem)
    return dict(sorted(REGISTRY.items()))
