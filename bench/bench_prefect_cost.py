"""Prefect's fixed cost per annotate run: the Prefect flow against `run_annotation` on one tiny run.

    python bench/bench_prefect_cost.py [--quick]

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

import argparse
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

from common import ROOT, upsert_result, verdict

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


def timed_run(mode: str, api: str, server: psutil.Process) -> dict:
    env = {**os.environ, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS":
           os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(START_TIMEOUT_S))}
    for name in ("PREFECT_API_URL", *LEAN):  # Prefect's defaults unless the mode sets them
        env.pop(name, None)
    if mode == "long-lived server":
        env["PREFECT_API_URL"] = api
    if mode == "lean temporary server":
        env.update(LEAN)
    before, server_before = resource.getrusage(resource.RUSAGE_CHILDREN), tree_cpu(server)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run of each")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)

    repeats = 1 if args.quick else 3
    home = tempfile.mkdtemp(prefix="bench_prefect_home_")
    server, api = start_server(home)
    try:
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for _ in range(repeats):
            for mode in MODES:
                runs[mode].append(timed_run(mode, api, psutil.Process(server.pid)))
                print(f"{mode}: {runs[mode][-1]['wall']:.1f} s wall, {runs[mode][-1]['cpu']:.1f} CPU s", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
        shutil.rmtree(home, ignore_errors=True)
    median = {mode: {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu")} for mode, rs in runs.items()}
    extra = {mode: {k: median[mode][k] - median["plain"][k] for k in ("wall", "cpu")} for mode in MODES[1:]}
    same = len({r["checksum"] for rs in runs.values() for r in rs}) == 1
    print(f"fixed cost over plain: {extra}; same dataset: {same}")
    upsert_result(
        "Prefect's fixed cost per run (bench_prefect_cost.py)",
        "A tiny `tokencredit annotate`-sized run in a fresh process: `run_annotation` (plain) against the Prefect flow "
        "(threads runner) with Prefect's temporary API server (the default: no PREFECT_API_URL), the same with "
        "Prefect's lightening settings (no telemetry, no logs to the API, no task-run recorder, event persister or "
        "triggers), and against a long-lived `prefect server start` (PREFECT_API_URL; its CPU during the run "
        "counted). CPU includes child processes. Medians of interleaved runs; the machine was shared with other jobs.",
        "quick" if args.quick else "full",
        f"3 demo prompts x 4 samples, GDPO, one shard, shipped tiny models; {repeats} reps, median",
        f"plain {median['plain']['wall']:.1f} s wall, {median['plain']['cpu']:.1f} CPU s; "
        + "; ".join(f"{mode} +{extra[mode]['wall']:.1f} s wall, +{extra[mode]['cpu']:.1f} CPU s" for mode in MODES[1:])
        + f"; same dataset in all runs: {same}",
        f"same dataset with and without Prefect: {verdict(same)}")


if __name__ == "__main__":
    main()
