"""Scheduled annotation: the annotate flow as a Prefect deployment on a cron schedule."""
from __future__ import annotations

from tokencredit.pipeline.annotate import AnnotateConfig

from tokencredit.flows.annotate import annotate_flow


def annotate_deployment(config: AnnotateConfig, out: str, cron: str, name: str = "nightly-annotate"):
    """A deployment that `prefect.serve` runs on `cron`; each run writes `out/<YYYY-MM-DD>`.

    A dated folder per run keeps every night's dataset (the same folder would be skipped as
    complete, since the config is the same); the flow fills in `{date}` when it starts.
    """
    return annotate_flow.to_deployment(name=name, cron=cron,
                                       parameters={"config": config, "out": f"{out.rstrip('/')}/{{date}}"})
