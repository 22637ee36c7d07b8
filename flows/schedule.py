"""`tokencredit serve`: annotation on a schedule, served by a Prefect runner against a Prefect server.

`serve` needs a Prefect server whose scheduler service runs: the one named by PREFECT_API_URL, else one
it starts itself (`tokencredit.flows.prefect_server`). A runner process (`tokencredit.flows.runner`)
registers the deployment (`tokencredit.flows.scheduled_run`) with its schedule (`--cron` with
`--timezone`, or `--every 10m`); the server creates its runs and the runner starts each when it comes
due, in a child process. This module parses the schedule and the folder template and supervises both
processes; it imports neither Prefect's flow machinery nor torch, so that it starts and stops quickly.

Stop: SIGINT or SIGTERM reaches this process (the runner has a session of its own, so a Ctrl-C at the
terminal does not reach it or its runs). It asks the runner to stop (SIGTERM): Prefect cancels the runs
in progress, each recording `stopped` if it ends in time; after the runner exits, or STOP_S, what is
left of its session is killed (a run killed there reads as incomplete: its record says running and its
process is gone), the server is stopped, and one line says so. A `serve` killed outright (kill -9) takes the
server, the runner and its runs along (`tokencredit.pipeline.lifeline`): each run it left reads as incomplete.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import sys
import time
import zoneinfo
from pathlib import Path
from typing import Any

PLACEHOLDERS = {"date": "%Y-%m-%d", "datetime": "%Y-%m-%dT%H-%M-%S"}
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_EVERY = re.compile(r"(\d+)([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


EVERY_MAX = datetime.timedelta(days=366)  # a schedule's times are datetimes: a longer interval soon overflows them


def parse_every(text: str) -> datetime.timedelta:
    """'10s', '10m', '1h', '1d', or a sum such as '1h30m' -> timedelta from 1s to EVERY_MAX; ValueError naming
    --every otherwise."""
    compact = text.replace(" ", "").lower()
    parts = _EVERY.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(f"--every {text!r}: expected a duration such as 30s, 10m, 1h, 1d or 1h30m")
    seconds = sum(int(n) * _SECONDS[u] for n, u in parts)  # Python ints: no overflow before the bound
    if seconds < 1:
        raise ValueError(f"--every {text!r}: the interval must be at least 1s")
    if seconds > EVERY_MAX.total_seconds():
        raise ValueError(f"--every {text!r}: the interval must be at most {EVERY_MAX.days}d")
    return datetime.timedelta(seconds=seconds)


def check_folder(template: str) -> str:
    """The folder template, or ValueError: one folder level, placeholders {date} and {datetime} only, at
    least one of them (a fixed name would be one run written once, then found complete by every later run)."""
    names = _PLACEHOLDER.findall(template)
    unknown = [n for n in names if n not in PLACEHOLDERS]
    if unknown or not names or "/" in template or template.startswith((".", "_")):
        raise ValueError(f"--folder {template!r}: expected one folder name with {{date}} and/or {{datetime}} "
                         f"(the run's scheduled time), not starting with '.' or '_', e.g. 'nightly-{{date}}'")
    return template


def folder_name(template: str, when: datetime.datetime) -> str:
    """The template with {date} and {datetime} filled in from `when` (the run's scheduled time)."""
    return _PLACEHOLDER.sub(lambda m: when.strftime(PLACEHOLDERS[m.group(1)]), template)


def check_timezone(name: str | None) -> str | None:
    if name is not None:
        try:
            zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"--timezone {name!r}: not an IANA time zone such as Europe/Paris or UTC") from None
    return name


def make_schedule(cron: str | None, every: str | None, timezone: str | None):
    """A Prefect schedule from --cron or --every (exactly one), in `timezone` (default: this machine's)."""
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.schedules import Cron, Interval

    if (cron is None) == (every is None):
        raise ValueError("serve needs one schedule: --cron \"0 3 * * *\" or --every 10m")
    timezone = check_timezone(timezone) or _local_timezone()
    if cron is not None:
        try:
            CronSchedule(cron=cron, timezone=timezone)
        except ValueError as error:
            raise ValueError(f"--cron {cron!r}: not a valid cron expression "
                             f"(minute hour day-of-month month day-of-week, e.g. \"0 3 * * *\")") from error
        return Cron(cron, timezone=timezone)
    return Interval(parse_every(every), timezone=timezone)


def _local_timezone() -> str:
    """This machine's IANA zone (cron times are read in it), UTC when it has none by name."""
    key = getattr(datetime.datetime.now().astimezone().tzinfo, "key", None)
    if key:
        return key
    try:
        link = os.readlink("/etc/localtime")
        return link.split("zoneinfo/", 1)[1] if "zoneinfo/" in link else "UTC"
    except OSError:
        return os.environ.get("TZ") or "UTC"


# --- serving ---------------------------------------------------------------------------------

def state_home(name: str, out: str) -> Path:
    """Where serve keeps its own Prefect server's database and log: $TOKENCREDIT_HOME/serve/<name>/<sha256 of --out,
    16 hex digits>. One per output folder: a serve of another --out (or another user's) never finds this one's
    scheduled runs, nor counts them as missed. `name`: checked where it is parsed (names.check_name)."""
    import hashlib

    from tokencredit.pipeline.models.registry import home

    return home() / "serve" / name / hashlib.sha256(out.encode()).hexdigest()[:16]


def serve(deployment_args: dict[str, Any], schedule_text: str, poll_s: float) -> int:
    """Serve the deployment until SIGINT or SIGTERM; returns 130 or 143 after one line saying so (or the
    runner's own exit status if it stops by itself, after its one-line error).

    The server: PREFECT_API_URL's, else a local one started here and stopped last. The Prefect runner runs
    in a child process of its own session, and the runs in its children: a Ctrl-C at the terminal reaches
    this process alone, which asks the runner to stop (SIGTERM: it ends the runs in progress, each records
    `stopped`), waits for it, then stops the server."""
    import pickle
    import subprocess
    import tempfile

    from tokencredit.flows.prefect_server import local_server, stop
    from tokencredit.pipeline import lifeline

    api_url = os.environ.get("PREFECT_API_URL")
    stopped: list[int] = []
    runner: list[subprocess.Popen] = []

    def on_signal(signum, frame):
        stopped.append(signum)
        if runner and runner[0].poll() is None:
            runner[0].send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    status = 0
    home = state_home(deployment_args["name"], deployment_args["out"])
    try:
        with contextlib.nullcontext() if api_url else local_server(home) as server, \
                tempfile.NamedTemporaryFile(suffix=".pickle") as args_file:
            api = api_url or server.api_url
            pickle.dump({**deployment_args, "schedule_text": schedule_text, "poll_s": poll_s}, args_file)
            args_file.flush()
            # started beside the server: its imports (torch) take as long as the server's start
            runner.append(subprocess.Popen(lifeline.command("tokencredit.flows.runner", args_file.name),
                                           env={**os.environ, "PREFECT_API_URL": api}, start_new_session=True))
            if stopped:  # a signal before the runner existed
                runner[0].send_signal(signal.SIGTERM)
            if server is None or server.wait(stopped=lambda: bool(stopped)):
                origin = "PREFECT_API_URL" if api_url else f"started by serve, its data in {home}"
                print(f"Prefect API: {api} ({origin}); its UI: {api.rstrip('/').removesuffix('/api')}", flush=True)
            status = _wait(runner[0], stopped)
    finally:
        if runner:
            stop(runner[0])
        for s, handler in previous.items():
            signal.signal(s, handler)
    if not stopped:
        return status or 1
    # a newline first: a run cut off mid progress bar leaves the terminal's line unfinished
    print(f"\ntokencredit serve: stopped on {signal.Signals(stopped[0]).name}; what ran: tokencredit runs "
          f"{deployment_args['out']}", file=sys.stderr, flush=True)
    return 128 + stopped[0]


STOP_S = 10  # for the runner to exit after SIGTERM (it gives its runs 3 s)


def _wait(runner, stopped: list[int]) -> int:
    """The runner's exit status. Once a stop is asked: SIGKILL to the runner's session (its runs and their
    workers) when the runner has exited, or after STOP_S."""
    import subprocess

    deadline = None
    while True:
        try:
            status = runner.wait(1)
        except subprocess.TimeoutExpired:
            if stopped and deadline is None:
                deadline = time.monotonic() + STOP_S
            if deadline is None or time.monotonic() < deadline:
                continue
            status = None
        if stopped:
            _kill_session(runner.pid)
        return runner.wait() if status is None else status


def _kill_session(pgid: int, timeout_s: float = STOP_S) -> None:
    """SIGKILL the runner's process group (its runs and their workers) and wait until it is gone: once serve
    has exited, no run of it is still writing, and each reads as stopped or incomplete."""
    deadline = time.monotonic() + timeout_s
    try:
        os.killpg(pgid, signal.SIGKILL)
        while time.monotonic() < deadline:
            time.sleep(0.1)
            os.killpg(pgid, 0)  # ProcessLookupError once the last one is reaped
    except ProcessLookupError:
        pass
