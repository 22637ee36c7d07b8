"""Where a run's time goes: seconds per stage of each shard (`Stages`) and the run's own wall times (`run_seconds`).

A shard's stage times go into its stats under `seconds` (sample, verify, credit_gdpo, credit_mrtpo, credit_mc,
credit_p2t, write) and the manifest sums them over the shards. They are each shard's own wall time in a stage:
shards that run at once (threads, or requests that share one engine) each count the time they waited, so the sums
can exceed the run's wall time. The run's wall times are the manifest's `run_seconds`, measured from the run's
start (a command's process start, else the call that prepared the run): `startup` (to the first sampling request),
`engine_start` (starting the vllm engine, its import included unless the command imported it while the inputs
were checked; for the transformers backend, loading the policy),
`sampling` (from the first shard's sampling to the last one's end: the engine's span, idle gaps included), `total`
(to the manifest), and `marks`,
the moment of each event this process marked (`mark`) since that start. Under a Dask runner the models load and
sample in the workers: their marks are not this process's, and those figures are null.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

SECONDS = "seconds"  # the stats key of a shard's stage times
STAGES = ("sample", "verify", "credit_gdpo", "credit_mrtpo", "credit_mc", "credit_p2t", "credit_rows", "write")
MODELS_LOADING, ENGINE_STARTED, MODELS_LOADED = "models_loading", "engine_started", "models_loaded"
FIRST_SAMPLE, SAMPLED = "sample", "sampled"  # a shard's sampling starts, ends
RUN_OPENED = "run_opened"  # the run's folder is locked and its manifest started (in a flow: the flow has started)

_LOCK = threading.Lock()
_MARKS: dict[str, list[float]] = {}  # event -> epoch seconds it happened, in this process
_RUNS: dict[str, float] = {}  # run folder -> epoch seconds it started
_COMMAND: list[float | None] = [None]  # the start of the command this process runs, until a run claims it


class Stages:
    """Seconds per stage, summed over the times a stage runs: `with stages("sample"): ...`; `seconds` the dict."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - begin, 3)


def process_start() -> float:
    """Epoch seconds at which this process started (Linux: from /proc, to 10 ms); elsewhere now."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks since boot
        with open("/proc/uptime") as uptime:
            since_boot = float(uptime.read().split()[0])
        return time.time() - since_boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def command_started() -> None:
    """A command of the CLI runs in this process: its first run counts its time from the process's start."""
    _COMMAND[0] = process_start()


def mark(event: str) -> None:
    """`event` happens now (the run's figures take each event's first moment after the run started)."""
    with _LOCK:
        _MARKS.setdefault(event, []).append(time.time())


def begin_run(out: str) -> None:
    """The run writing `out` starts: at the command's start if this is the command's first run, else now."""
    with _LOCK:
        start, _COMMAND[0] = _COMMAND[0] or time.time(), None
        if not _RUNS:  # no run in progress: earlier events belong to runs that ended
            for moments in _MARKS.values():
                moments[:] = [t for t in moments if t >= start]
        _RUNS[out] = start


def run_seconds(out: str) -> dict:
    """The run's wall times (the module docstring) now that it ends; null where an event did not happen here."""
    now = time.time()
    with _LOCK:
        start = _RUNS.pop(out, None)
        if start is None:
            return {}
        seen = {event: [t - start for t in moments if t >= start] for event, moments in _MARKS.items()}
    first = {event: min(moments) for event, moments in seen.items() if moments}

    def span(begin: str | None, end: str, last: bool = False) -> float | None:
        """From `begin`'s first moment (None: the start) to `end`'s first moment, or its last."""
        a = 0.0 if begin is None else first.get(begin)
        b = max(seen[end]) if last and seen.get(end) else first.get(end)
        return None if a is None or b is None else round(b - a, 3)
    engine = ENGINE_STARTED if ENGINE_STARTED in first else MODELS_LOADED
    return {"startup": span(None, FIRST_SAMPLE), "engine_start": span(MODELS_LOADING, engine),
            "sampling": span(FIRST_SAMPLE, SAMPLED, last=True), "total": round(now - start, 3),
            "marks": {event: round(t, 3) for event, t in sorted(first.items(), key=lambda m: m[1])}}


def describe(run: dict, stages: dict[str, float]) -> str:
    """One line of a run's times: its wall times, then each stage's seconds summed over its shards."""
    wall = [f"{name.replace('_', ' ')} {run[name]:.1f} s" for name in ("startup", "engine_start", "sampling", "total")
            if run.get(name) is not None]
    order = sorted(stages, key=lambda name: (STAGES.index(name) if name in STAGES else len(STAGES), name))
    summed = [f"{name} {stages[name]:.1f} s" for name in order]
    return "; ".join(part for part in (", ".join(wall), "shards: " + ", ".join(summed) if summed else "") if part)
