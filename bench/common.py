"""Shared helpers of the benchmarks: median timing, peak memory (RSS), machine line, RESULTS.md upsert,
figures in bench/results/*.json.

Run a benchmark from the repository root: `python bench/bench_<name>.py [--quick]`.
Memory is read from the kernel (VmRSS / VmHWM of /proc/self/status) because torch and Arrow
allocate outside Python's allocator, where `tracemalloc` does not look.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
SPEED_JSON = ROOT / "bench" / "results" / "speed.json"
RESULTS_TITLE = "# Benchmark results\n\nOne section per benchmark; a row per machine and mode (full or --quick).\n"
COLUMNS = ("machine", "date", "mode", "sizes", "figures", "targets")

if str(ROOT) not in sys.path:  # `python bench/x.py` puts bench/ on the path, not the repository
    sys.path.insert(0, str(ROOT))

# One torch thread by default: on this shared 2-core machine, 2 OpenMP threads next to another busy
# process stall each other (a 2.5 s annotation run took 21-55 s), so 1 thread gives stable, comparable
# ratios. BENCH_THREADS=2 on an idle machine. Child processes inherit the variable.
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
import torch  # noqa: E402 - after OMP_NUM_THREADS

torch.set_num_threads(THREADS)


# --- timing ---------------------------------------------------------------------------------------


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> tuple[float, list[float]]:
    """(median seconds, all timings) of `fn()` over `repeats` calls after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def interleaved_times(fns: dict[str, Callable[[], object]], repeats: int = 5, warmup: int = 1,
                      setup: dict[str, Callable[[], object]] | None = None) -> dict[str, float]:
    """Median seconds of each function, timed in turns (a, b, a, b, ...) so that load from other
    processes on the shared CPU falls on both sides of a ratio alike. `setup`: per name, what to run
    untimed before each call of that function (a state it must start from)."""
    setup = setup or {}
    for _ in range(warmup):
        for name, fn in fns.items():
            setup.get(name, lambda: None)()
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            setup.get(name, lambda: None)()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


# --- memory ---------------------------------------------------------------------------------------


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    raise RuntimeError(f"/proc/self/status has no {field}; peak memory needs Linux")


def rss_bytes() -> int:
    return _status_bytes("VmRSS")


def reset_peak() -> None:
    """Set the process's peak RSS (VmHWM) back to its current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def peak_extra_bytes(fn: Callable[[], object]) -> tuple[int, object]:
    """(peak RSS during `fn()` minus RSS before it, fn's result)."""
    before = rss_bytes()
    reset_peak()
    result = fn()
    return max(0, _status_bytes("VmHWM") - before), result


def run_child(script: str | Path, args: Sequence[str], timeout: float = 900) -> dict:
    """Run `python script *args` in a fresh process; it prints one JSON object as its last line."""
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


# --- reporting ------------------------------------------------------------------------------------


def machine() -> str:
    """e.g. '2-core CPU, 24 GiB, x86_64, torch 2.13.0+cpu, 1 torch thread(s)' (CUDA device first if any)."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cpu = f"{os.cpu_count()}-core CPU, {round(mem / 2**30)} GiB, {platform.processor() or platform.machine()}"
    if torch.cuda.is_available():
        cpu = f"{torch.cuda.get_device_name()} + {cpu}"
    return f"{cpu}, torch {torch.__version__}, {torch.get_num_threads()} torch thread(s)"


def _escape(cell: str) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")


def _sections(text: str) -> list[list[str]]:
    """The file's lines split before each '## ' heading (the first block is the title)."""
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.startswith("## "):
            blocks.append([])
        blocks[-1].append(line)
    return blocks


def _upsert_block(block: list[str], heading: str, intro: str, row: list[str]) -> list[str]:
    header = "| " + " | ".join(COLUMNS) + " |"
    rows = [line for line in block if line.startswith("| ") and line != header and not line.startswith("|--")]
    key = row[0], row[2]  # machine, mode
    rows = [r for r in rows if tuple(c.strip() for c in r.strip("|").split(" | ")[:3:2]) != key]
    rows.append("| " + " | ".join(row) + " |")
    return [heading, "", intro, "", header, "|" + "---|" * len(COLUMNS), *rows, ""]


def upsert_result(section: str, intro: str, mode: str, sizes: str, figures: str, targets: str,
                  path: Path = RESULTS) -> None:
    """Write this machine's row (same machine and mode replaced) into `## {section}` of RESULTS.md.

    Other sections are left byte for byte; the file is locked while it is rewritten.
    """
    row = [_escape(c) for c in (machine(), datetime.date.today().isoformat(), mode, sizes, figures, targets)]
    heading = f"## {section}"
    path.touch()
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        blocks = _sections(f.read() or RESULTS_TITLE)
        found = [i for i, b in enumerate(blocks) if b and b[0].strip() == heading]
        if found:
            blocks[found[0]] = _upsert_block(blocks[found[0]], heading, intro, row)
        else:
            if blocks[-1] and blocks[-1][-1].strip():
                blocks[-1].append("")
            blocks.append(_upsert_block([], heading, intro, row))
        f.seek(0)
        f.truncate()
        f.write("\n".join(line for b in blocks for line in b).rstrip("\n") + "\n")


def update_figures(values: dict, path: Path = SPEED_JSON) -> dict:
    """Set `values`' keys in the JSON object at `path` (created if missing), keeping every other key:
    several benchmarks write one file. Locked while it is rewritten; returns the whole object."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        figures = json.loads(f.read() or "{}")
        figures.update(values)
        f.seek(0)
        f.truncate()
        f.write(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return figures


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


# --- models ---------------------------------------------------------------------------------------


def model_paths() -> tuple[str | None, str | None, str]:
    """(policy path, reward-model path, description) for `AnnotateConfig(model=, reward_model=)`:
    the shipped tiny models (None means them); fails clearly when they are missing."""
    from tokencredit.pipeline.models.loading import DEFAULT_POLICY, DEFAULT_REWARD_MODEL

    for folder in (DEFAULT_POLICY, DEFAULT_REWARD_MODEL):
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} is missing: build it with `python -m tokencredit.pipeline.models.tiny all`")
    return None, None, "shipped tiny policy + reward model"
