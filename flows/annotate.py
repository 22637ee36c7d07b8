"""Prefect flow: the annotate stage as a batch job of shard tasks.

Each shard is one Prefect task (sample -> verify -> credit -> write), retried only after errors a
second try can cure (a lost connection, a timeout, an I/O error of a remote store). A re-run of
the same run skips the shards already written: the task returns a shard's completion marker when
it exists. The markers, not Prefect's result cache, are the record of what is done: a cache
would outlive a shard that a resume found changed and unmarked, and on a remote `out` it would
sit on each worker's disk. Shards run on threads by default, or on Dask (a local cluster or an
existing scheduler, whose workers may run on other machines).
"""
from __future__ import annotations

import datetime
from typing import Any

import pyarrow.parquet as pq
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.futures import as_completed
from tqdm.auto import tqdm

from tokencredit.flows.cluster import task_runner
from tokencredit.flows.prefect_server import tie_temporary_server
from tokencredit.pipeline.annotate import (AnnotateConfig, annotate_shard, check_first_shard, code_version, finish_run,
                                           load_models, prepare_run, shard_bar)
from tokencredit.pipeline.dataset.writer import RunWriter
from tokencredit.pipeline.devices import worker_identity
from tokencredit.pipeline.sample import engine_starts
from tokencredit.schemas.records import TaskRecord


# Errors that say something about the input, the model or the code: a retry would fail the same way.
DETERMINISTIC = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(task, task_run, state) -> bool:
    """Prefect's retry condition: retry a shard only after a connection, timeout or I/O error."""
    error = state.data if isinstance(state.data, BaseException) else None
    return isinstance(error, (ConnectionError, TimeoutError, OSError)) and not isinstance(error, DETERMINISTIC)


@task(name="annotate-shard", retries=2, retry_delay_seconds=2, retry_condition_fn=is_transient,
      cache_policy=NONE)
def annotate_shard_task(records: list[TaskRecord], shard: int, config: AnnotateConfig, out: str,
                        run_id: str) -> dict[str, Any]:
    """Annotate and write one shard; returns its marker entry (rows, checksums, stats)."""
    writer = RunWriter(out)
    if writer.is_complete(shard):
        return writer.shard_entry(shard)
    tables, stats = annotate_shard(records, shard, config, load_models(config))
    return writer.write_shard(shard, tables, stats, code_version=code_version(), worker=worker_identity(engine_starts()))


@flow(name="annotate", log_prints=True)
def annotate_flow(config: AnnotateConfig, out: str, run_id: str | None = None,
                  progress: bool = True, restart: bool = False) -> dict[str, Any]:
    """Annotate every shard of the prompt set not yet written under `out`; returns the manifest.

    `{date}` in `out` becomes today's date (scheduled runs write one folder per day). `restart`:
    delete the run `out` holds first (a run of another config or of changed inputs).
    """
    logger = get_run_logger()
    out = out.replace("{date}", datetime.date.today().isoformat())
    run_id = run_id or config.digest()[:12]
    writer, shards, rejected = prepare_run(config, out, run_id, restart)  # holds the lock on `out`
    try:
        logger.info("run %s: %d prompts in %d shards, %d rejected records", run_id, sum(map(len, shards)),
                    len(shards), len(rejected))
        todo = [s for s in range(len(shards)) if not writer.is_complete(s)]
        futures = [annotate_shard_task.submit(shard_records, s, config, out, run_id)
                   for s, shard_records in enumerate(shards)]
        responses = 0
        with tqdm(total=len(futures), desc="shards", unit="shard", disable=not shard_bar(progress)) as bar:
            for future in as_completed(futures):
                entry = future.result()
                if entry["shard"] in todo:
                    todo = []  # only the first shard annotated now is checked
                    _check_first_shard(writer, entry, out, futures)
                responses += entry["responses"]["rows"]
                bar.set_postfix(responses=responses)
                bar.update()
                logger.info("shard %d done: %d responses, %d credit rows", entry["shard"],
                            entry["responses"]["rows"], entry["credits"]["rows"])
        return finish_run(writer, len(shards), rejected)
    finally:
        writer.unlock()


def _check_first_shard(writer: RunWriter, entry: dict[str, Any], out: str, futures) -> None:
    """`check_first_shard` on the shard just written; when it fails, the shards not started yet never start."""
    table = pq.read_table(f"{writer.root}/{entry['responses']['path']}", filesystem=writer.fs,
                          columns=["task", "group_id", "status"])
    try:
        check_first_shard(table, entry["shard"], out)
    except RuntimeError:
        for future in futures:
            future.wrapped_future.cancel()
        raise


def run_annotate_flow(config: AnnotateConfig, out: str, run_id: str | None = None, runner: str = "threads",
                      dask_address: str | None = None, workers: int = 2, progress: bool = True,
                      restart: bool = False) -> dict[str, Any]:
    """Run the flow with the chosen task runner (threads, or Dask local/remote)."""
    tie_temporary_server()
    cores = config.cpu_threads if config.device == "cpu" else 1
    configured = annotate_flow.with_options(task_runner=task_runner(runner, dask_address, workers, config.device,
                                                                    cores))
    return configured(config, out, run_id=run_id, progress=progress, restart=restart)
