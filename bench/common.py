"""Shared helpers of the benchmarks: median timing, peak memory (RSS), the machine, the row of a run (`write_row`),
figures in bench/results/*.json, and the `Harness` a registered benchmark receives.

Run a benchmark from the repository root: `python -m bench NAME [--quick]` (bench/__main__.py).
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
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
SPEED_JSON = RESULTS_DIR / "speed.json"
RUNS = "runs.jsonl"  # every run's row, in a results folder
MARKDOWN_ROWS = "markdown_rows.jsonl"  # the rows of the RESULTS.md each script assembled by hand, before the runner

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


# --- child processes ------------------------------------------------------------------------------


def run_command(args: Sequence[str], timeout: float | None = None, env: dict | None = None) -> str:
    """Run `args` from the repository root with `env` added to this process's; its stdout. A failure raises
    RuntimeError with the end of its stderr."""
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))[:300]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def run_child(script: str | Path, args: Sequence[str], timeout: float = 900, env: dict | None = None) -> dict:
    """Run `python script *args` in a fresh process; it prints one JSON object as its last line."""
    return json.loads(run_command([sys.executable, script, *args], timeout, env).strip().splitlines()[-1])


def annotate_wall(out: Path, options: Sequence[str], timeout: float | None = None, env: dict | None = None) -> dict:
    """`tokencredit annotate --out OUT --runner none *options` as a fresh command: {wall_s (start included),
    load_avg: [before, after], responses, backend, dtype (the last three from its manifest)}."""
    before, begin = load_avg(), time.perf_counter()
    run_command([sys.executable, "-m", "tokencredit.flows.cli", "annotate", "--out", out, "--runner", "none",
                 *options], timeout, {"DO_NOT_TRACK": "1", **(env or {})})
    wall, manifest = time.perf_counter() - begin, json.loads((Path(out) / "manifest.json").read_text())
    return {"wall_s": wall, "load_avg": [before, load_avg()], "responses": manifest["totals"]["responses"],
            "backend": manifest["config"]["backend"], "dtype": manifest["config"]["dtype"]}


# --- figures --------------------------------------------------------------------------------------


def load_avg() -> float:
    """The 1-minute load average, beside a figure: a ratio is only as steady as the load it was measured under."""
    return round(os.getloadavg()[0], 2)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b to 3 decimals; None where either is missing."""
    return None if a is None or not b else round(a / b, 3)


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


# --- reporting ------------------------------------------------------------------------------------


def machine_info() -> dict:
    """{cores, memory_gib, cpu (the model name of /proc/cpuinfo), device ('cpu' or the CUDA device's name)}."""
    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo") as info:
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"cores": os.cpu_count(), "memory_gib": round(memory / 2**30), "cpu": cpu, "device": device}


def commit() -> str:
    """HEAD's hash, with '+dirty' when tracked files differ from it ('unknown' outside a git checkout)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    return head.stdout.strip() + ("+dirty" if dirty else "")


@dataclass
class Harness:
    """What a registered benchmark receives: its mode, where its results go, its own options, the shared helpers.

    `quick`: a short run whose figures are no verdict; `results_dir`: bench/results, or a temporary folder for a
    quick run; `argv`: the options after `--` on the runner's command line, for the benchmark's own parser;
    `repeats`: the benchmark sets it to the timed repeats behind its figures (recorded in the row).
    """
    quick: bool
    results_dir: Path
    argv: list[str] = field(default_factory=list)
    repeats: int | None = None
    peak_extra_bytes = staticmethod(peak_extra_bytes)
    run_child = staticmethod(run_child)

    def median_time(self, fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> tuple[float, list[float]]:
        """`median_time`; a quick run makes no warm-up call."""
        return median_time(fn, repeats, 0 if self.quick else warmup)

    def interleaved_times(self, fns: dict[str, Callable[[], object]], repeats: int = 5, warmup: int = 1,
                          setup: dict[str, Callable[[], object]] | None = None) -> dict[str, float]:
        """`interleaved_times`; a quick run makes no warm-up call."""
        return interleaved_times(fns, repeats, 0 if self.quick else warmup, setup)

    @property
    def mode(self) -> str:
        return "quick" if self.quick else "full"

    def results(self, file: str) -> Path:
        """The path of a results file, e.g. results("repair.json")."""
        self.results_dir.mkdir(parents=True, exist_ok=True)
        return self.results_dir / file

    def update_figures(self, values: dict, file: str = "speed.json") -> dict:
        return update_figures(values, self.results(file))


def write_row(path: Path, name: str, h: Harness, load_before: tuple[float, ...], figures: dict,
              targets: list[dict]) -> dict:
    """Append one run's row (the schema bench/RESULTS.md is rendered from) to the JSON-lines file at `path`.

    Row: benchmark, commit, date (UTC, ISO), machine (machine_info), torch_threads, load_avg ({before, after}: the
    1, 5 and 15 minute load averages), repeats, mode, figures, targets ([{name, comparison, value, met}])."""
    row = {"benchmark": name, "commit": commit(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": machine_info(), "torch_threads": torch.get_num_threads(),
           "load_avg": {"before": list(load_before), "after": list(os.getloadavg())}, "repeats": h.repeats,
           "mode": h.mode, "figures": figures, "targets": targets}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(row) + "\n")
    return row


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


# --- models ---------------------------------------------------------------------------------------


@torch.inference_mode()
def padded_forward(model, seqs: list[list[int]], batch_size: int, pad: int = 0, longest_first: bool = False) -> None:
    """model(ids, attention_mask) on the model's device over length-sorted, right-padded batches of `seqs` (token
    ids): the plain forward a credit's cost is measured against."""
    seqs = sorted(seqs, key=len, reverse=longest_first)
    for start in range(0, len(seqs), batch_size):
        batch = seqs[start:start + batch_size]
        ids = torch.full((len(batch), max(map(len, batch))), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, s in enumerate(batch):
            ids[b, :len(s)], mask[b, :len(s)] = torch.tensor(s), 1
        model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device))


def demo_records(count: int) -> list:
    """`count` demo task records spread over the tasks present (every len // count-th)."""
    from tokencredit.pipeline.annotate import AnnotateConfig, load_prompt_set

    records, _ = load_prompt_set(AnnotateConfig(limit=None))
    return records[:: max(1, len(records) // count)][:count]


def model_paths() -> tuple[str | None, str | None, str]:
    """(policy path, reward-model path, description) for `AnnotateConfig(model=, reward_model=)`:
    the shipped tiny models (None means them); fails clearly when they are missing."""
    from tokencredit.pipeline.models.loading import DEFAULT_POLICY, DEFAULT_REWARD_MODEL

    for folder in (DEFAULT_POLICY, DEFAULT_REWARD_MODEL):
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} is missing: build it with `python -m tokencredit.pipeline.models.tiny all`")
    return None, None, "shipped tiny policy + reward model"
