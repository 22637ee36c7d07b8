"""A local Dask cluster whose workers each own one device: one GPU each, or a disjoint set of CPU cores each.

    cluster = pinned_cluster(n_workers=2, device="cpu", cores=1)   # worker 0 on core 0, worker 1 on core 1

vLLM runs data-parallel this way: each worker starts its own engine on its own device, and the shards of a run
are spread over the workers. Each worker's nanny sets its environment before the worker process starts
(`pipeline.devices`); this module, loaded in the worker as a Dask preload, pins the process to its cores.
"""
from __future__ import annotations

import logging
import os

from tokencredit.pipeline.devices import CPUS_ENV, cpu_list, own_cpus, pin_this_process


def visible_gpus() -> list[str]:
    """The GPU ids this process may hand out: CUDA_VISIBLE_DEVICES's, else every device torch sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu for gpu in visible.split(",") if gpu.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def worker_environments(n_workers: int, device: str, cores: int) -> list[dict[str, str]] | None:
    """The environment of each of `n_workers` workers: its own GPU, or its own `cores` CPU cores.

    None on CPU when the cores this process may use cannot give every worker `cores` of its own (the workers then
    share them, as threads do). ValueError, naming --workers, when CUDA has fewer GPUs than workers."""
    if str(device).split(":")[0] == "cuda":
        gpus = visible_gpus()
        if n_workers > len(gpus):
            raise ValueError(f"--workers {n_workers}: each worker takes a GPU of its own, and {len(gpus)} are visible")
        return [{"CUDA_VISIBLE_DEVICES": gpu} for gpu in gpus[:n_workers]]
    available = own_cpus()
    if n_workers * cores > len(available):
        return None
    return [{CPUS_ENV: cpu_list(available[i * cores:(i + 1) * cores])} for i in range(n_workers)]


def prefect_api_environment() -> dict[str, str]:
    """PREFECT_API_URL of the server this process talks to, for the workers to report their task runs there: the
    configured one, or the temporary server Prefect started in this process (a worker without it would start a
    temporary server of its own, all of them on one database file)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    temporary = SubprocessASGIServer._instances.get(None)
    if not url and temporary is not None and temporary.running:
        url = temporary.api_url
    return {"PREFECT_API_URL": url} if url else {}


def pinned_cluster(n_workers: int, device: str = "cpu", cores: int = 1, asynchronous: bool = False, **kwargs):
    """A local Dask cluster on loopback of `n_workers` one-thread worker processes, each pinned by
    `worker_environments` (unpinned where they cannot all have `cores` cores of their own). `kwargs`: SpecCluster's."""
    from distributed import Nanny, Scheduler, SpecCluster

    environments = worker_environments(n_workers, device, cores) or [{}] * n_workers
    api = prefect_api_environment()
    quiet = kwargs.setdefault("silence_logs", logging.WARNING)  # as LocalCluster: Dask's INFO lines are not the user's
    options = {"nthreads": 1, "host": "127.0.0.1", "preload": [__name__], "silence_logs": quiet}
    workers = {i: {"cls": Nanny, "options": {**options, "env": {**env, **api}}} for i, env in enumerate(environments)}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard": False, "dashboard_address": ":0"}}
    return SpecCluster(workers=workers, scheduler=scheduler, asynchronous=asynchronous, **kwargs)


def task_runner(runner: str, dask_address: str | None = None, workers: int = 2, device: str = "cpu",
                cores: int = 1):
    """Prefect's task runner for a flow's shards: threads of this process, or Dask. A local Dask cluster's workers
    each own a device (`pinned_cluster`: one GPU, or `cores` CPU cores of their own) and start their own engine
    there; an existing scheduler's workers are as their owner started them."""
    from prefect.task_runners import ThreadPoolTaskRunner

    if runner == "threads":
        return ThreadPoolTaskRunner(max_workers=workers)
    if runner == "dask":
        from prefect_dask import DaskTaskRunner

        if dask_address:
            return DaskTaskRunner(address=dask_address)
        return DaskTaskRunner(cluster_class=pinned_cluster,
                              cluster_kwargs={"n_workers": workers, "device": device, "cores": cores})
    raise ValueError(f"unknown runner {runner!r}; choose threads or dask")


def dask_setup(worker) -> None:
    """Dask's preload hook, run in each worker process as it starts: pinned, and a temporary Prefect server it may
    still start (no API was set for it) ends with it."""
    from tokencredit.flows.prefect_server import tie_temporary_server

    pin_this_process()
    tie_temporary_server()
