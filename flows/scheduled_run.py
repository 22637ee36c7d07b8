"""One scheduled run of `tokencredit serve`: the Prefect flows `scheduled-annotate` and `scheduled-rounds` (serve
--rounds) and their deployment.

Each run writes its own dataset (or its rounds, in the layout of `tokencredit rounds`), OUT/<folder>, the folder
named from a template by the run's scheduled time (`tokencredit.flows.schedule.folder_name`), and records what
happened in OUT/<folder>/schedule.json (`tokencredit.flows.runs`): `complete`, `failed` with the error's line (the
flow run ends Failed; the next run fires as scheduled), or `stopped` (serve was stopped).

Overlap: one run at a time, a run that comes due while the previous one is still writing is skipped,
never queued (a queue behind runs slower than the schedule would only grow). The deployment's
concurrency limit (1, CANCEL_NEW) makes the server cancel it before a process starts for it; a lock on
OUT stops a run of another serve of the same OUT (recorded in OUT/_skipped/, its state `Skipped`).
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import zoneinfo
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Completed

from tokencredit.flows import runs
from tokencredit.flows.annotate import annotate_flow
from tokencredit.flows.rounds import run_rounds
from tokencredit.flows.schedule import check_folder, folder_name
from tokencredit.pipeline import lifeline
from tokencredit.pipeline.annotate import AnnotateConfig
from tokencredit.pipeline.dataset.writer import filesystem
from tokencredit.pipeline.rounds import RoundsConfig

RUNNER_PID = "TOKENCREDIT_SERVE_RUNNER_PID"  # in the environment of serve's runner and of the runs it starts


def _lock_path(out: str) -> Path:
    """The file that runs of one --out take in turn: OUT/.serve.lock for a local OUT, else one under
    $TOKENCREDIT_HOME (the runs of one `serve` are processes of one machine)."""
    fs, root = filesystem(out)
    if "://" not in out:
        Path(root).mkdir(parents=True, exist_ok=True)
        return Path(root) / ".serve.lock"
    from tokencredit.pipeline.models.registry import home

    return home() / "serve-locks" / f"{hashlib.sha256(out.encode()).hexdigest()[:16]}.lock"


@contextlib.contextmanager
def overlap_lock(out: str, folder: str) -> Iterator[dict[str, Any] | None]:
    """Yields None holding the lock of `out`'s runs, or the holder's {folder, since, pid} when a run
    is still writing (the kernel releases the lock of a killed run)."""
    import fcntl

    path = _lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            text = handle.read()
            yield json.loads(text) if text.strip() else {"folder": "?", "since": "?"}
            return
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"folder": folder, "since": runs.now(), "pid": os.getpid()}))
        handle.flush()
        try:
            yield None
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def check_verifiers(manifest: dict[str, Any]) -> None:
    """RuntimeError when every response of the run is a verifier_error (as `annotate` refuses it)."""
    stats = manifest["stats"]
    if stats.get("responses") and stats.get("verifier_failures") == stats["responses"]:
        raise RuntimeError(f"every one of {stats['responses']} responses is a verifier_error; see the status column")


@flow(name="scheduled-annotate", log_prints=True)
def scheduled_annotate(config: AnnotateConfig, out: str, folder: str = "{datetime}",
                       timezone: str | None = None) -> dict[str, Any]:
    """One scheduled run: annotate into OUT/<folder filled in from the scheduled time>, unless the
    previous run is still writing (then skipped: its state Skipped). Records the run in its schedule.json."""
    def annotate(target: str) -> tuple[dict[str, Any], str]:
        manifest = annotate_flow(config, target, progress=False)
        check_verifiers(manifest)
        return manifest, f"{manifest['totals']['responses']} responses"

    return _scheduled(out, folder, timezone, annotate, {})


@flow(name="scheduled-rounds", log_prints=True)
def scheduled_rounds(settings: dict[str, Any], rounds: int, out: str, folder: str = "{datetime}",
                     timezone: str | None = None) -> list[dict[str, Any]]:
    """One scheduled rounds job: `rounds` rounds of the RoundsConfig whose `settings()` these are
    (`tokencredit.flows.rounds.run_rounds`) into OUT/<folder>, in rounds' own layout, resumed where that folder
    holds them already; skipped and recorded as `scheduled_annotate`'s runs. Each round's dev result."""
    config = RoundsConfig.from_settings(settings, rounds)

    def run(target: str) -> tuple[list[dict[str, Any]], str]:
        results = run_rounds(config, Path(target))
        return results, f"{rounds} rounds, dev reward {results[0]['reward']:.4f} -> {results[-1]['reward']:.4f}"

    return _scheduled(out, folder, timezone, run, {"rounds": rounds})


def _scheduled(out: str, folder: str, timezone: str | None, job: Callable[[str], tuple[Any, str]],
               facts: dict[str, Any]) -> Any:
    """The run of a scheduled flow: `job(OUT/<folder>)` -> (its result, a line saying what it wrote), unless the
    previous run is still writing (then Completed named Skipped), its record written as it starts (with `facts`)
    and as it ends: complete, failed or stopped."""
    from prefect.runtime import flow_run

    if os.environ.get(RUNNER_PID) == str(os.getppid()):  # a process that serve's runner started for this run
        lifeline.end_with(os.getppid())  # a runner killed outright takes its runs along
    logger = get_run_logger()
    when = flow_run.get_scheduled_start_time()
    when = datetime.datetime.fromisoformat(str(when)).astimezone(zoneinfo.ZoneInfo(timezone) if timezone else None)
    name = folder_name(folder, when)
    info = {"flow_run_id": str(flow_run.get_id()), "flow_run_name": flow_run.get_name(), **facts}
    with overlap_lock(out, name) as holder:
        if holder is not None:
            reason = f"skipped: the run writing {holder['folder']} (since {holder['since']}) is still running"
            logger.warning("%s: %s", name, reason)
            if holder["folder"] != name:
                runs.skip_record(out, name, reason, info)
            return Completed(name="Skipped", message=reason)
        record = runs.start_record(out, name, info)
        target = f"{out.rstrip('/')}/{name}"
        try:
            result, wrote = job(target)
        except Exception as error:
            runs.end_record(out, record, "failed", _one_line(error))
            raise
        except BaseException as error:  # a stop: Prefect's TerminationSignal, KeyboardInterrupt
            runs.end_record(out, record, "stopped", f"stopped ({type(error).__name__}); what it wrote is kept")
            raise
        runs.end_record(out, record, "complete")
        logger.info("%s: complete, %s", target, wrote)
        return result


def deployment(config: AnnotateConfig | RoundsConfig, out: str, schedule, folder: str = "{datetime}",
               timezone: str | None = None, name: str = "nightly-annotate"):
    """The deployment a runner serves: `scheduled_annotate` of an AnnotateConfig, `scheduled_rounds` of a
    RoundsConfig, on `schedule`, loaded by module path (so that its runs start from any working directory)."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.deployments.runner import EntrypointType

    parameters = {"out": out, "folder": check_folder(folder), "timezone": timezone}
    if isinstance(config, RoundsConfig):
        served, parameters = scheduled_rounds, {"settings": config.settings(), "rounds": config.rounds, **parameters}
    else:
        served, parameters = scheduled_annotate, {"config": config, **parameters}
    # one run at a time: a run that comes due while one is still running is cancelled by the server
    # before a process starts for it (its state says why)
    one_at_a_time = ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)
    return served.to_deployment(name=name, schedules=[schedule], entrypoint_type=EntrypointType.MODULE_PATH,
                                concurrency_limit=one_at_a_time, parameters=parameters)
