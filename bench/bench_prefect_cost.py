"""Prefect's fixed cost per annotate run: the Prefect flow against `run_annotation` on one tiny run.

    python -m bench prefect_cost [--quick]

Each run is a fresh process, as a user's `tokencredit annotate` is: load the shipped tiny models, then
annotate 3 demo prompts (one per task) x 4 samples with GDPO credit in one shard,
- plain: `run_annotation`, no Prefect;
- temporary server: the flow (threads runner) with no PREFECT_API_URL, so Prefect starts its temporary
  API server for the run (what a run pays by default);
- lean temporary server: the same with the settings Prefect offers to lighten it (LEAN: no telemetry,
  no logs sent to the API, no server services that record task runs, persist events or run triggers);
- long-lived server: the flow against a `prefect server start` started once before the timing
  (PREFECT_API_URL), with its own PREFECT_HOME.
CPU seconds are the run's process and its children (the temporary server) plus, for the long-lived
server, the CPU that server spent during the run. Medians of interleaved runs; the fixed cost is a
flow's figure minus plain's. All runs must write the same dataset.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil

from common import ROOT, Harness
from registry import Target, benchmark

MODES = ("plain", "temporary server", "lean temporary server", "long-lived server")
LEAN = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_TO_API_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "false", "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false"}
START_TIMEOUT_S = 300  # a temporary server on a busy 2-core machine can take minutes to answer


def child(mode: str) -> None:
    """Annotate in this process; prints {"checksum"} as its last line."""
    from tokencredit.pipeline.annotate import AnnotateConfig, load_models, run_annotation
    from tokencredit.pipeline.credit.assign import CreditConfig

    config = AnnotateConfig(limit=1, cpu_threads=1, credit=CreditConfig(kinds=("gdpo",)))
    load_models(config)
    out = tempfile.mkdtemp(prefix="bench_prefect_", dir="/tmp")
    try:
        if mode == "plain":
            manifest = run_annotation(config, out, progress=False)
        else:
            from tokencredit.flows.annotate import run_annotate_flow

            manifest = run_annotate_flow(config, out, progress=False)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({"checksum": manifest["dataset_checksum"]}))


def tree_cpu(process: psutil.Process) -> float:
    """CPU seconds of a process and its live descendants."""
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def start_server(home: str) -> tuple[subprocess.Popen, str]:
    """`prefect server start` on a free port with its own PREFECT_HOME; -> (process, API URL)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PREFECT_HOME": home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + START_TIMEOUT_S
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{api}/health", timeout=5) as response:
                if response.status == 200:
                    return server, api
        except OSError:
            time.sleep(1)
    server.kill()
    raise RuntimeError(f"prefect server start did not answer within {START_TIMEOUT_S} s")


def timed_run(mode: str, api: str, server: psutil.Process | None) -> dict:
    """Wall and CPU seconds of one child run in `mode` (`server`: the long-lived server, its CPU counted)."""
    env = {**os.environ, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS":
           os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(START_TIMEOUT_S))}
    for name in ("PREFECT_API_URL", *LEAN):  # Prefect's defaults unless the mode sets them
        env.pop(name, None)
    if mode == "long-lived server":
        env["PREFECT_API_URL"] = api
    if mode == "lean temporary server":
        env.update(LEAN)
    before, server_before = resource.getrusage(resource.RUSAGE_CHILDREN), tree_cpu(server) if server else 0.0
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", mode], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=1800)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{done.stderr[-3000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if mode == "long-lived server":
        cpu += tree_cpu(server) - server_before
    return {"wall": wall, "cpu": cpu, **json.loads(done.stdout.strip().splitlines()[-1])}


@benchmark("prefect_cost", measures="A tiny `tokencredit annotate`-sized run in a fresh process: `run_annotation` "
           "(plain) against the Prefect flow (threads runner) with Prefect's temporary API server (the default), the "
           "same with Prefect's lightening settings, and against a long-lived `prefect server start` (its CPU during "
           "the run counted): the extra wall and CPU seconds (children included), medians of interleaved runs.",
           targets=(Target("same_dataset", "==", True),))
def run(h: Harness) -> dict:
    h.repeats = 1 if h.quick else 3
    modes = MODES[:2] if h.quick else MODES  # quick: the default path only, no long-lived server to start
    home = tempfile.mkdtemp(prefix="bench_prefect_home_")
    server, api = start_server(home) if "long-lived server" in modes else (None, "")
    try:
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        for _ in range(h.repeats):
            for mode in modes:
                runs[mode].append(timed_run(mode, api, server and psutil.Process(server.pid)))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
        shutil.rmtree(home, ignore_errors=True)
    median = {mode: {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu")} for mode, rs in runs.items()}
    figures = {"plain_wall_s": round(median["plain"]["wall"], 2), "plain_cpu_s": round(median["plain"]["cpu"], 2)}
    for mode in modes[1:]:
        figures |= {f"{mode.replace(' ', '_')}_extra_{k}_s": round(median[mode][k] - median["plain"][k], 2) for k in ("wall", "cpu")}
    return figures | {"same_dataset": len({r["checksum"] for rs in runs.values() for r in rs}) == 1}


if __name__ == "__main__":  # a child process of timed_run(): --child MODE
    child(sys.argv[2])
