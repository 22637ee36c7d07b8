"""Prefect flow for folders derived from a run (`repair`, `values`): one Prefect task per window of shards
(`DerivedJob.windows`: one shard, or with the engine as many of repair's as fill its batch), like the annotate
flow. Each shard writes its parts and then its marker, so a re-run skips the shards whose marker
matches their files and a killed run resumes where it stopped. Shards run on threads (one policy copy per
process, loaded once) or on a local Dask cluster of one-core workers, each with its own engine."""
from __future__ import annotations

import functools
import threading
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.futures import as_completed

from tokencredit.flows.cluster import task_runner
from tokencredit.flows.prefect_server import tie_temporary_server
from tokencredit.pipeline.dataset.derived import DerivedKind
from tokencredit.pipeline.progress import Progress
from tokencredit.pipeline.repair import REPAIR
from tokencredit.pipeline.values import VALUES_KIND

KINDS = {kind.name: kind for kind in (REPAIR, VALUES_KIND)}


_MODELS_LOCK = threading.Lock()  # shards on threads ask at once: one load


def _models(model: str | None, device: str, backend: str = "transformers"):
    from tokencredit.pipeline.sample import is_stopped

    with _MODELS_LOCK:
        models = _load_models(model, device, backend)
        if is_stopped(models[0]):  # e.g. an in-process `run_derived` since started the engine again
            _load_models.cache_clear()
            models = _load_models(model, device, backend)
        return models


@functools.lru_cache(maxsize=2)
def _load_models(model: str | None, device: str, backend: str = "transformers"):
    from tokencredit.pipeline.sample import load_sampler  # torch (or the engine) only where a model loads

    return load_sampler(backend, model, device)


@task(name="derived-window", cache_policy=NONE)
def window_task(job, window: list[int], records: dict, refs: tuple, device: str, backend: str) -> list[dict[str, Any]]:
    """Fill and write the shards of one window (`DerivedJob.run_window`); returns their markers (rows, checksums,
    counts). The policy loads only when a shard of it is not done."""
    store = job.store(job.out, job.run, job.config)
    done = [store.done(s) for s in window]
    if all(marker is not None for marker in done):
        return done
    return job.run_window(window, records, refs, _models(job.model, device, backend), backend)


@flow(name="derived", log_prints=True)
def derived_flow(kind: str, run: str, out: str, config, device: str = "cpu", progress: bool = True,
                 backend: str = "transformers") -> dict[str, Any]:
    """Every shard of `KINDS[kind]` not yet done under `out`, a window of shards per task; returns the summary
    (OUT/<kind>.json)."""
    from tokencredit.pipeline.dataset.export import run_records
    from tokencredit.pipeline.sample.choice import resolved_backend

    derived = KINDS[kind]
    job = derived.prepare(run, out, config)
    records, _, refs = run_records(run)
    backend = resolved_backend(backend, device)
    windows = job.windows(backend, device)
    get_run_logger().info("%s of %s: %d %ss in %d shards (%d windows)", kind, run, sum(map(len, job.shards)),
                          derived.unit, len(job.shards), len(windows))
    named = window_task.with_options(name=f"{kind}-window")
    futures = [named.submit(job, window, records, refs, device, backend) for window in windows]
    markers = []
    with Progress(kind, total=sum(map(len, job.shards)), unit=derived.unit, enabled=progress) as bar:
        for future in as_completed(futures):
            for marker in future.result():
                markers.append(marker)
                bar.update(len(job.shards[marker["shard"]]), tokens=derived.tokens(marker))
    return derived.finish(job, markers)


def run_derived_flow(kind: DerivedKind, run: str, out: str, config, device: str = "cpu", workers: int = 1,
                     progress: bool = True, backend: str = "transformers", runner: str = "threads") -> dict[str, Any]:
    """The flow (named after `kind`), `workers` windows at a time on threads, or on `workers` Dask workers of one
    core (or GPU) each, whose engines then compute the same floats whatever their number; the inputs are checked
    before Prefect starts (the flow reads the run again)."""
    from tokencredit.pipeline.sample.choice import resolved_backend

    job = kind.prepare(run, out, config)
    job.store(out, run, config).claim_sampler(resolved_backend(backend, device), device)
    tie_temporary_server()
    configured = derived_flow.with_options(name=kind.name, task_runner=task_runner(runner, None, workers, device, 1))
    return configured(kind.name, run, out, config, device=device, progress=progress, backend=backend)
