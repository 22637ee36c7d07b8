"""A local Prefect API server for `tokencredit serve`, in a child process, with its scheduler on.

Prefect's temporary (ephemeral) server, the one a flow starts on its own when no `PREFECT_API_URL`
is set, runs only the services marked to run in ephemeral servers (the task-run recorder and the
event services), not the scheduler: a deployment's schedule is stored there but no run is ever
created from it. `prefect server start` runs every service, the scheduler included, so `serve`
starts one on a free loopback port, with its database under its own PREFECT_HOME, and stops it
when it stops; a `serve` killed outright takes it along (`tokencredit.pipeline.lifeline`).

A command that runs a flow with no `PREFECT_API_URL` (annotate, compare, repair, values) calls
`tie_temporary_server` first, as does each worker process of a local Dask cluster (`flows.cluster`): Prefect
stops its temporary server at exit, which a process killed with SIGKILL never reaches; tied, the server ends
with the process that started it all the same.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tokencredit.pipeline import lifeline

# `prefect server start` imports its whole server, runs its migrations and builds its UI's settings
# before it answers: ~20 s on an idle 2-core machine, several times that on a busy one.
START_TIMEOUT_S = 300
STOP_TIMEOUT_S = 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def wait_healthy(api_url: str, timeout_s: float = START_TIMEOUT_S, server: subprocess.Popen | None = None,
                 log_path: Path | None = None, stopped=lambda: False) -> bool:
    """Poll the server's health until it answers (True) or `stopped()` (False). RuntimeError if `server`
    exits first, or after `timeout_s`, with the last line of its log."""
    deadline = time.monotonic() + timeout_s
    while not healthy(api_url):
        if stopped():
            return False
        if server is not None and server.poll() is not None:
            raise RuntimeError(f"the local Prefect server exited with status {server.returncode} before it "
                               f"answered: {_last_line(log_path)} (its log: {log_path})")
        if time.monotonic() > deadline:
            where = f"; its log: {log_path}" if log_path else ""
            raise RuntimeError(f"the Prefect server at {api_url} did not answer within {timeout_s:.0f} s (a busy "
                               f"machine?){where}")
        time.sleep(0.5)
    return True


@dataclass
class LocalServer:
    api_url: str
    process: subprocess.Popen
    log_path: Path

    def wait(self, timeout_s: float = START_TIMEOUT_S, stopped=lambda: False) -> bool:
        return wait_healthy(self.api_url, timeout_s, self.process, self.log_path, stopped)


@contextlib.contextmanager
def local_server(home: Path, port: int | None = None) -> Iterator[LocalServer]:
    """Start `prefect server start` on 127.0.0.1:`port` (a free one by default) with PREFECT_HOME `home`
    (its SQLite database and log, `home/server.log`); yields at once (`LocalServer.wait` waits until it
    answers), and stops it (SIGTERM, then SIGKILL after STOP_TIMEOUT_S) on leaving."""
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1")
    log_path = home / "server.log"
    with open(log_path, "w") as log:
        # its own session: a Ctrl-C at the terminal reaches `serve`, which stops the server last; a `serve` killed
        # outright (kill -9) takes it along (`lifeline`)
        server = subprocess.Popen(lifeline.command("prefect", "server", "start", "--host", "127.0.0.1", "--port",
                                                   str(port)), env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        yield LocalServer(f"http://127.0.0.1:{port}/api", server, log_path)
    finally:
        stop(server)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def tie_temporary_server() -> None:
    """Whatever temporary server Prefect's client starts in this process from now on ends when this process does,
    however it ends (`lifeline.tie`). Nothing when PREFECT_API_URL names a server, or once one has started."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return
    from prefect.server.api.server import SubprocessASGIServer

    class TiedServer(SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen:
            process = super()._run_uvicorn_command()
            lifeline.tie(process.pid)
            return process

    if None not in SubprocessASGIServer._instances:
        TiedServer()  # registers itself under no port: the server the client starts (as prefect.testing's harness)


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"
