"""Prefect flows: `train` (the training stage as one task) and `pipeline` (annotate -> train)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task

from tokencredit.pipeline.annotate import AnnotateConfig
from tokencredit.pipeline.train.trainer import TrainConfig, train

from tokencredit.flows.annotate import annotate_flow


@task(name="train", retries=1, retry_delay_seconds=5)
def train_task(config: TrainConfig) -> str:
    """Train from a run directory; resumes from the latest checkpoint after a failure."""
    return str(train(config))


@flow(name="train", log_prints=True)
def train_flow(config: TrainConfig) -> str:
    return train_task(config)


@flow(name="pipeline", log_prints=True)
def pipeline_flow(annotate: AnnotateConfig, train_config: TrainConfig, run_id: str | None = None) -> dict[str, Any]:
    """Annotate a prompt set into `train_config.data`, then train from it."""
    manifest = annotate_flow(annotate, train_config.data, run_id=run_id)
    checkpoint = train_task(train_config)
    return {"dataset_checksum": manifest["dataset_checksum"], "checkpoint": str(Path(checkpoint))}
