"""A local Prefect API server for `tokencredit serve`, in a child process, with its scheduler on.

Prefect's temporary (ephemeral) server, the one a flow starts on its own when no `PREFECT_API_URL`
is set, runs only the services marked to run in ephemeral servers (the task-run recorder and the
event services), not the scheduler: a deployment's schedule is stored there but no run is ever
created from it. `prefect server start` runs every service, the scheduler included, so `serve`
starts one on a free loopback port, with its database under its own PREFECT_HOME, and stops it
when it stops; a `serve` killed outright takes it along (`tokencredit.pipeline.lifeline`).

Prefect's temporary server for a command: `annotate` (with a Prefect runner) starts it itself, first thing
(`temporary_server`): the same app that Prefect's client would start on the flow's first call (`uvicorn` on
`prefect.server.api.server:create_app`, ephemeral mode, its database in PREFECT_HOME), but in a child process that
starts while the command loads torch and the engine, and without the ~3 s of Prefect's server modules that its
client imports to start one. PREFECT_API_URL then names it for the command and the processes it starts. Its output
is kept (the last lines), so that a server that fails says how: its exit status, its last log line, the seconds
it took (`TemporaryServer.wait`).

A flow run with no `PREFECT_API_URL` (compare, repair, values, a flow called from Python) calls
`tie_temporary_server` first, as does each worker process of a local Dask cluster (`flows.cluster`): Prefect
stops its temporary server at exit, which a process killed with SIGKILL never reaches; tied, the server ends
with the process that started it all the same.
"""
from __future__ import annotations

import collections
import contextlib
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tokencredit.pipeline import lifeline

# `prefect server start` imports its whole server, runs its migrations and builds its UI's settings
# before it answers: ~20 s on an idle 2-core machine, several times that on a busy one.
START_TIMEOUT_S = 300
_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(Error|Exception)\b.*: ")  # a traceback's last line: "pkg.SomeError: why"
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


class TemporaryServer:
    """Prefect's temporary API server in a child process that ends with this one (`lifeline.tie`, as Prefect's own
    in `tie_temporary_server`); `wait` until it answers, `stop` it. Its output is read on a thread: the last lines
    are kept, and echoed to stderr when `echo` (a --verbose command)."""

    KEPT_LINES = 20

    def __init__(self, echo: bool = False):
        self.started = time.monotonic()
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        spec = importlib.util.find_spec("prefect")  # where Prefect is, without importing it
        app_dir = os.path.dirname(os.path.dirname(spec.origin))
        # Prefect's own temporary server: its UI off, the ephemeral server's services (SubprocessASGIServer)
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", app_dir, "--factory", "prefect.server.api.server:create_app",
             "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "error", "--lifespan", "on"], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        lifeline.tie(self.process.pid)
        self.lines: collections.deque[str] = collections.deque(maxlen=self.KEPT_LINES)
        self._reader = threading.Thread(target=self._read, args=(echo,), name="prefect-server-output", daemon=True)
        self._reader.start()

    def _read(self, echo: bool) -> None:
        for line in self.process.stdout:
            if line.strip():
                self.lines.append(line.rstrip())
            if echo:
                sys.stderr.write(line)

    def wait(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once the server answers; RuntimeError saying what happened if it exits first (its status and last
        log line) or does not answer within `timeout_s`, with the seconds it took either way."""
        deadline = self.started + timeout_s
        while not healthy(self.api_url):
            if self.process.poll() is not None:
                self._reader.join(5)  # its last lines
                raise RuntimeError(f"Prefect's temporary API server exited with status {self.process.returncode} "
                                   f"after {time.monotonic() - self.started:.0f} s, before it answered: "
                                   f"{self.what_it_said()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Prefect's temporary API server did not answer at {self.api_url} within "
                                   f"{timeout_s:.0f} s (a busy machine?); {self.what_it_said()}")
            time.sleep(0.1)

    def what_it_said(self) -> str:
        """Its last exception line (a traceback's last line names the cause; uvicorn's own last line after a
        failed start says only that it failed) and its last line."""
        last = self.lines[-1] if self.lines else "(no output)"
        errors = [line for line in self.lines if _EXCEPTION.match(line)]
        return f"{errors[-1]} (its last line: {last})" if errors and errors[-1] != last else f"its last line: {last}"

    def stop(self) -> None:
        stop(self.process)


@contextlib.contextmanager
def temporary_server(echo: bool = False) -> Iterator[TemporaryServer | None]:
    """Prefect's temporary server for the block, unless PREFECT_API_URL names a server (or Prefect may not start
    one): started now, named by PREFECT_API_URL for this process and its children until the block ends, then
    stopped. Yields it (None when none was started); a flow's first call waits for it with `wait`."""
    from prefect.context import refresh_global_settings_context
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

    if PREFECT_API_URL.value() or not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        yield None
        return
    server = TemporaryServer(echo)
    os.environ["PREFECT_API_URL"] = server.api_url
    refresh_global_settings_context()  # Prefect read its settings when it was imported
    try:
        yield server
    finally:
        _drain_prefect()
        del os.environ["PREFECT_API_URL"]
        refresh_global_settings_context()
        server.stop()


def _drain_prefect(timeout_s: float = 5) -> None:
    """Send what Prefect's log and event workers still hold to the server before it stops (at exit they would find
    it gone: an 'Error logging to API' line each); nothing where no flow ran (their modules are not imported)."""
    for module, worker in (("prefect.logging.handlers", "APILogWorker"), ("prefect.events.worker", "EventsWorker")):
        if module in sys.modules:
            getattr(sys.modules[module], worker).drain_all(timeout=timeout_s)


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
