"""The `values` flow: value curves of a run's responses (`tokencredit.pipeline.values`), one Prefect task per
shard of responses. Each shard writes its parts and then its marker, so a killed run resumes where it stopped.
Shards run on threads (one policy copy per process, loaded once)."""
from __future__ import annotations

import functools
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from tokencredit.pipeline.progress import Progress
from tokencredit.pipeline.values import ValuesConfig, ValuesJob, finish_values, prepare_values


@functools.lru_cache(maxsize=2)
def _models(model: str | None, device: str):
    from tokencredit.pipeline.sample.transformers_backend import load_sampler  # torch only where a model loads

    return load_sampler(model, device)


@task(name="values-shard", cache_policy=NONE)
def values_shard_task(job: ValuesJob, shard: int, records: dict, refs: tuple, device: str) -> dict[str, Any]:
    """Measure and write one shard; returns its marker (rows, checksums, counts)."""
    return job.run_shard(shard, records, refs, _models(job.model, device))


@flow(name="values", log_prints=True)
def values_flow(run: str, out: str, config: ValuesConfig = ValuesConfig(), device: str = "cpu",
                progress: bool = True) -> dict[str, Any]:
    """Measure every selected pair of `run` not yet done under `out`; returns the summary (OUT/values.json)."""
    from tokencredit.pipeline.dataset.export import run_records

    logger = get_run_logger()
    job = prepare_values(run, out, config)
    records, _, refs = run_records(run)
    logger.info("values of %s: %d responses in %d shards", run, sum(map(len, job.shards)), len(job.shards))
    futures = [values_shard_task.submit(job, s, records, refs, device) for s in range(len(job.shards))]
    markers = []
    with Progress("values", total=sum(map(len, job.shards)), unit="response", enabled=progress) as bar:
        for future in as_completed(futures):
            markers.append(future.result())
            bar.update(len(job.shards[markers[-1]["shard"]]), tokens=markers[-1]["counts"]["continuation_tokens"])
    return finish_values(job, markers)


def run_values_flow(run: str, out: str, config: ValuesConfig, device: str = "cpu", workers: int = 1,
                    progress: bool = True) -> dict[str, Any]:
    """The flow on a thread pool of `workers` shards at a time; the inputs are checked before Prefect starts
    (a DuckDB query of the run: the flow reads it again)."""
    prepare_values(run, out, config)
    configured = values_flow.with_options(task_runner=ThreadPoolTaskRunner(max_workers=workers))
    return configured(run, out, config, device=device, progress=progress)
