"""Which device a process owns: the CPU cores it may run on, or the GPU it sees.

A pinned Dask worker (flows/cluster.py) learns its device from its environment, set by its nanny before the
process starts: `CUDA_VISIBLE_DEVICES` (one GPU), or `TOKENCREDIT_WORKER_CPUS`, which `pin_this_process` turns into
the process's CPU affinity. The vllm engine binds its OpenMP threads to the cores the process may use
(`vllm_backend.engine_options`), so an engine started there stays on its worker's cores.
"""
from __future__ import annotations

import os

CPUS_ENV = "TOKENCREDIT_WORKER_CPUS"


def cpu_list(cpus) -> str:
    """Core ids -> the comma list of ranges that Linux and vLLM's VLLM_CPU_OMP_THREADS_BIND read ('0-3,6')."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]."""
    cpus = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def own_cpus() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0))


def worker_cores() -> int | None:
    """How many cores a pinned Dask worker owns (its engine's threads); None outside one."""
    cpus = os.environ.get(CPUS_ENV)
    return len(parse_cpu_list(cpus)) if cpus else None


def pin_this_process() -> list[int]:
    """Restrict this process to the cores its nanny gave it (TOKENCREDIT_WORKER_CPUS); returns its cores."""
    cpus = os.environ.get(CPUS_ENV)
    if cpus:
        os.sched_setaffinity(0, parse_cpu_list(cpus))
    return own_cpus()


def worker_identity(engine_starts: int) -> dict:
    """Which process computed a shard, on which cores or GPU, and how many vllm engines it has started (written in
    the shard's marker: a worker that kept its engine across shards reports 1)."""
    return {"pid": os.getpid(), "cpus": cpu_list(own_cpus()), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "engine_starts": engine_starts}
