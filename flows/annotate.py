"""Prefect flow: the annotate stage as a batch job of window tasks.

Each window of consecutive shards (`annotate.windows_of`: as many as fill the vllm engine's batch, one shard with
transformers) is one Prefect task: its shards sampled in one engine call, then each verified, credited and written.
A task is retried only after errors a second try can cure (a lost connection, a timeout, an I/O error of a remote
store). A re-run of the same run skips the shards already written: a window whose shards all have their
completion marker returns their entries. The markers, not Prefect's result cache, are the record of what is done: a cache
would outlive a shard that a resume found changed and unmarked, and on a remote `out` it would
sit on each worker's disk. Shards run on threads by default, or on Dask (a local cluster or an
existing scheduler, whose workers may run on other machines).
"""
from __future__ import annotations

import datetime
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.futures import as_completed
from tqdm.auto import tqdm

from tokencredit.flows.cluster import task_runner
from tokencredit.flows.prefect_server import tie_temporary_server
from tokencredit.pipeline.annotate import (AnnotateConfig, annotate_window, check_first_shard, finish_run, load_models,
                                           prepare_run, read_responses, shard_bar, windows_of)
from tokencredit.pipeline.dataset.writer import RunWriter
from tokencredit.schemas.records import TaskRecord


# Errors that say something about the input, the model or the code: a retry would fail the same way.
DETERMINISTIC = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def is_transient(task, task_run, state) -> bool:
    """Prefect's retry condition: retry a shard only after a connection, timeout or I/O error."""
    error = state.data if isinstance(state.data, BaseException) else None
    return isinstance(error, (ConnectionError, TimeoutError, OSError)) and not isinstance(error, DETERMINISTIC)


@task(name="annotate-window", retries=2, retry_delay_seconds=2, retry_condition_fn=is_transient,
      cache_policy=NONE)
def annotate_window_task(shards: dict[int, list[TaskRecord]], config: AnnotateConfig, out: str,
                         run_id: str) -> list[dict[str, Any]]:
    """Annotate and write the shards of one window (`annotate_window`: sampled in one engine call); returns the
    marker entry (rows, checksums, stats) of each."""
    writer = RunWriter(out)
    window = sorted(shards)
    if all(map(writer.is_complete, window)):
        return [writer.shard_entry(s) for s in window]
    return annotate_window(shards, window, config, load_models(config), writer)


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
        windows = windows_of(len(shards), config)
        logger.info("run %s: %d prompts in %d shards (%d engine windows), %d rejected records", run_id,
                    sum(map(len, shards)), len(shards), len(windows), len(rejected))
        todo = [s for s in range(len(shards)) if not writer.is_complete(s)]
        futures = [annotate_window_task.submit({s: shards[s] for s in window}, config, out, run_id)
                   for window in windows]
        responses, checked = 0, False
        with tqdm(total=len(shards), desc="shards", unit="shard", disable=not shard_bar(progress)) as bar:
            for future in as_completed(futures):
                entries = future.result()
                written = [e for e in entries if e["shard"] in todo]
                if written and not checked:  # only the first window annotated now is checked
                    checked = True
                    _check_first_shard(writer, written[0], out, futures)
                for entry in entries:
                    responses += entry["responses"]["rows"]
                    bar.set_postfix(responses=responses)
                    bar.update()
                    logger.info("shard %d done: %d responses, %d credit rows", entry["shard"],
                                entry["responses"]["rows"], entry["credits"]["rows"])
        return finish_run(writer, len(shards), rejected)
    finally:
        writer.unlock()


def _check_first_shard(writer: RunWriter, entry: dict[str, Any], out: str, futures) -> None:
    """`check_first_shard` on the shard just written; when it fails, the windows not started yet never start."""
    try:
        check_first_shard(read_responses(writer, entry), entry["shard"], out)
    except RuntimeError:
        for future in futures:
            future.wrapped_future.cancel()
        raise


def run_annotate_flow(config: AnnotateConfig, out: str, run_id: str | None = None, runner: str = "threads",
                      dask_address: str | None = None, workers: int | None = None, progress: bool = True,
                      restart: bool = False) -> dict[str, Any]:
    """Run the flow with the chosen task runner (threads, or Dask local/remote). `workers`: windows at a time, on
    threads or Dask workers (None: 1; with the vllm backend every window of a process takes the engine in turn)."""
    tie_temporary_server()
    workers = workers or 1
    cores = config.cpu_threads if config.device == "cpu" else 1
    configured = annotate_flow.with_options(task_runner=task_runner(runner, dask_address, workers, config.device,
                                                                    cores))
    return configured(config, out, run_id=run_id, progress=progress, restart=restart)
