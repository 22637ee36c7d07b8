"""Stages that longer commands (compare's pools, rounds' runs) share, importing Prefect only for a Prefect runner:
with runner 'none' a stage runs in this process, and the command never starts Prefect."""
from __future__ import annotations

from typing import Any

from tokencredit.pipeline.config import AnnotateConfig


def annotate_into(config: AnnotateConfig, out: str, runner: str = "threads") -> dict[str, Any]:
    """`config`'s annotate run in `out`, resumed by shard: in this process with runner 'none', else as the annotate
    flow on `runner` (threads, dask). The run's manifest."""
    if runner == "none":
        from tokencredit.pipeline.annotate import run_annotation

        return run_annotation(config, out, progress=False)
    from tokencredit.flows.annotate import run_annotate_flow

    return run_annotate_flow(config, out, runner=runner)
