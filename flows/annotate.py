"""Prefect flow: the annotate stage as a batch job of shard tasks.

Each shard is one Prefect task (sample -> verify -> credit -> write) with retries. Its result
is persisted under `OUT/_prefect`, keyed by (run id, shard, config hash), so a re-run of the
same run skips the shards already done; the writer's shard markers are the ground truth the
task checks first (they also cover a crash between writing a shard and persisting its result).
Shards run on threads by default, or on Dask (a local cluster or an existing scheduler).
"""
from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from tqdm.auto import tqdm

from pipeline.annotate import AnnotateConfig, annotate_shard, finish_run, load_models, prepare_run
from pipeline.writer import RunWriter
from schemas.records import TaskRecord


def _shard_key(context, parameters: dict[str, Any]) -> str:
    return f"annotate-{parameters['run_id']}-{parameters['config'].digest()[:16]}-shard-{parameters['shard']}"


@task(name="annotate-shard", retries=2, retry_delay_seconds=2, cache_key_fn=_shard_key, persist_result=True)
def annotate_shard_task(records: list[TaskRecord], shard: int, config: AnnotateConfig, out: str,
                        run_id: str) -> dict[str, Any]:
    """Annotate and write one shard; returns its marker entry (rows, checksums, stats)."""
    writer = RunWriter(out)
    if writer.is_complete(shard):
        return writer.shard_entry(shard)
    tables, stats = annotate_shard(records, shard, config, load_models(config))
    return writer.write_shard(shard, tables, stats)


def task_runner(runner: str, dask_address: str | None = None, workers: int = 2):
    if runner == "threads":
        return ThreadPoolTaskRunner(max_workers=workers)
    if runner == "dask":
        from prefect_dask import DaskTaskRunner

        if dask_address:
            return DaskTaskRunner(address=dask_address)
        return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                              cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True})
    raise ValueError(f"unknown runner {runner!r}; choose threads or dask")


@flow(name="annotate", log_prints=True)
def annotate_flow(config: AnnotateConfig, out: str, run_id: str | None = None,
                  progress: bool = True) -> dict[str, Any]:
    """Annotate every shard of the prompt set not yet written under `out`; returns the manifest.

    `{date}` in `out` becomes today's date (scheduled runs write one folder per day).
    """
    logger = get_run_logger()
    out = out.replace("{date}", datetime.date.today().isoformat())
    run_id = run_id or config.digest()[:12]
    writer, shards, rejected = prepare_run(config, out, run_id)
    logger.info("run %s: %d prompts in %d shards, %d rejected records", run_id, sum(map(len, shards)),
                len(shards), len(rejected))
    # A Path (not an unsaved LocalFileSystem block) so that Dask workers resolve it too; remote
    # outputs keep Prefect's default result storage (the writer's markers are the ground truth).
    local = "://" not in out
    shard_task = annotate_shard_task.with_options(result_storage=Path(writer.root, "_prefect") if local else None)
    futures = [shard_task.submit(shard_records, s, config, out, run_id) for s, shard_records in enumerate(shards)]
    responses = 0
    with tqdm(total=len(futures), desc="shards", unit="shard", disable=not progress) as bar:
        for future in as_completed(futures):
            entry = future.result()
            responses += entry["responses"]["rows"]
            bar.set_postfix(responses=responses)
            bar.update()
            logger.info("shard %d done: %d responses, %d credit rows", entry["shard"],
                        entry["responses"]["rows"], entry["credits"]["rows"])
    return finish_run(writer, len(shards), rejected)


def run_annotate_flow(config: AnnotateConfig, out: str, run_id: str | None = None, runner: str = "threads",
                      dask_address: str | None = None, workers: int = 2, progress: bool = True) -> dict[str, Any]:
    """Run the flow with the chosen task runner (threads, or Dask local/remote)."""
    configured = annotate_flow.with_options(task_runner=task_runner(runner, dask_address, workers))
    return configured(config, out, run_id=run_id, progress=progress)
