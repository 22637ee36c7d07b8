"""Prefect flow: prefix repair (`tokencredit.pipeline.repair`) as shard tasks, like the annotate flow.

Each shard of failures (a response and one reward it failed) is one Prefect task (resample -> verify -> keep the repairs ->
write its part and marker); a re-run skips the shards whose marker matches their part file, so a killed run
resumes where it stopped. Shards run on threads (one policy copy per process, loaded once).
"""
from __future__ import annotations

import functools
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from tokencredit.pipeline.progress import Progress
from tokencredit.pipeline.repair import RepairConfig, RepairJob, finish_repair, prepare_repair


@functools.lru_cache(maxsize=2)
def _models(model: str | None, device: str):
    from tokencredit.pipeline.sample.transformers_backend import load_sampler  # torch only where a model loads

    return load_sampler(model, device)


@task(name="repair-shard", cache_policy=NONE)
def repair_shard_task(job: RepairJob, shard: int, records: dict, refs: tuple, device: str) -> dict[str, Any]:
    """Repair and write one shard; returns its marker (rows, checksum, per-reward counts)."""
    return job.run_shard(shard, records, refs, _models(job.model, device))


@flow(name="repair", log_prints=True)
def repair_flow(run: str, out: str, config: RepairConfig = RepairConfig(), device: str = "cpu",
                progress: bool = True) -> dict[str, Any]:
    """Repair every failure of `run` not yet done under `out`; returns the summary (OUT/repair.json)."""
    from tokencredit.pipeline.dataset.export import run_records

    logger = get_run_logger()
    job = prepare_repair(run, out, config)
    records, _, refs = run_records(run)
    logger.info("repair of %s: %d failures in %d shards", run, sum(map(len, job.shards)), len(job.shards))
    futures = [repair_shard_task.submit(job, s, records, refs, device) for s in range(len(job.shards))]
    markers = []
    with Progress("repair", total=sum(map(len, job.shards)), unit="failure", enabled=progress) as bar:
        for future in as_completed(futures):
            markers.append(future.result())
            bar.update(len(job.shards[markers[-1]["shard"]]))
    return finish_repair(job, markers)


def run_repair_flow(run: str, out: str, config: RepairConfig, device: str = "cpu", workers: int = 1,
                    progress: bool = True) -> dict[str, Any]:
    """The flow on a thread pool of `workers` shards at a time."""
    configured = repair_flow.with_options(task_runner=ThreadPoolTaskRunner(max_workers=workers))
    return configured(run, out, config, device=device, progress=progress)
