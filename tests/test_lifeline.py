"""Workers end with the process that started them, however it ends (kill -9 included): a child started through
`tokencredit.pipeline.lifeline` with what it started (in a session of its own too), and an SQL sandbox worker in
the middle of a query, and `annotate` as a whole: Prefect's temporary server, the Dask cluster, the verifier worker.
(`serve` as a whole: tests/test_serve.py; plugin verifier workers alone: tests/test_plugin_bounds.py.)"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_serve import end_all, plugin_options, processes_in
from tokencredit.verifiers.isolation import is_gone

ROOT = Path(__file__).resolve().parent.parent


def wait_until(check, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:.0f} s"
        time.sleep(0.05)
    return value


def read_pids(path: Path) -> list[int] | None:
    text = path.read_text() if path.exists() else ""
    return [int(p) for p in text.split()] if text.endswith("\n") else None


def env(*paths: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [ROOT, *paths]))}


SLEEPER = '''
import os, subprocess, sys, time

daemon = subprocess.Popen(["sleep", "1000"], start_new_session=True)  # leaves the tree's session, not the tree
with open(sys.argv[1], "a") as pids:
    pids.write(f"{os.getpid()} {daemon.pid}\\n")
time.sleep(1000)
'''

PARENT = '''
import subprocess, sys, threading, time
from tokencredit.pipeline import lifeline

# started from a thread that ends at once: the child watches the process, not the thread
thread = threading.Thread(target=subprocess.Popen, args=(lifeline.command("sleeper", sys.argv[1]),))
thread.start()
thread.join()
time.sleep(1000)
'''


def test_a_child_and_what_it_started_end_when_its_parent_is_killed_with_sigkill(tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    pid_file = tmp_path / "pids"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(pid_file)], env=env(tmp_path),
                              stderr=subprocess.PIPE)
    try:
        child, daemon = wait_until(lambda: read_pids(pid_file), "the child's start")
        assert not is_gone(child) and not is_gone(daemon)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_until(lambda: is_gone(child) and is_gone(daemon), "the end of the child and of what it started")
    finally:
        parent.kill()
        parent.wait()
    assert parent.stderr.read().decode().splitlines() == [
        f"tokencredit: process {parent.pid}, which started this one ({child}), ended; ending this one and what it "
        f"started"]


def test_a_child_whose_parent_ended_before_it_watched_ends_at_once():
    # pid 1 started no test: to the child, a parent that ended and whose pid is another's by now
    ended = subprocess.run([sys.executable, "-m", "tokencredit.pipeline.lifeline", "1", "http.server"], env=env(),
                           capture_output=True, text=True, timeout=120)
    assert ended.returncode == 1 and ended.stdout == ""
    assert re.fullmatch(r"tokencredit: process 1, which started this one \(\d+\), ended; ending this one and what "
                        r"it started\n", ended.stderr), ended.stderr


CALLER = '''
import sqlite3, sys
from pathlib import Path
from tokencredit.verifiers import sandbox

db, pid_file = sys.argv[1], Path(sys.argv[2])
sqlite3.connect(db).close()
sandbox.run_select(db, "SELECT 1")  # starts a worker, idle after it
pid_file.write_text(f"{next(iter(sandbox.idle_worker_pids()))}\\n")
endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
sandbox.run_select(db, endless, sandbox.Limits(timeout_s=3600))  # on the same worker, for an hour
'''


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_an_sql_worker_mid_query_ends_when_its_caller_is_killed_with_sigkill(tmp_path):
    pid_file = tmp_path / "pids"
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(tmp_path / "empty.db"), str(pid_file)], env=env())
    try:
        [worker] = wait_until(lambda: read_pids(pid_file), "the SQL worker's start")
        wait_until(lambda: state(worker) == "R", "the endless query's start")  # idle, it sleeps on its pipe
        caller.send_signal(signal.SIGKILL)
        caller.wait()
        wait_until(lambda: is_gone(worker), "the end of the SQL worker", timeout=60)
    finally:
        caller.kill()
        caller.wait()


@pytest.mark.slow
def test_annotate_killed_with_sigkill_takes_its_temporary_server_dask_workers_and_verifier_worker_along(tmp_path):
    """No PREFECT_API_URL: Prefect's client starts its temporary server, stopped at exit, which a process killed
    with SIGKILL never reaches; a guard ends it all the same, and Dask's workers and the verifier worker end too."""
    environment = {k: v for k, v in env().items() if not k.startswith("PREFECT_")}
    environment.update(PREFECT_HOME=str(tmp_path / "prefect"), GATE=str(tmp_path / "gate-open"),  # never opens
                       DO_NOT_TRACK="1", OMP_WAIT_POLICY="PASSIVE")
    log = tmp_path / "annotate.log"
    annotate = subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", "annotate", "--out",
                                 str(tmp_path / "run"), *plugin_options(tmp_path, "gated"), "--runner", "dask"],
                                stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=tmp_path, env=environment)
    try:
        def verifying():
            assert annotate.poll() is None, log.read_text()[-4000:]
            return (tmp_path / "gate-open.waiting").exists()

        wait_until(verifying, "the verifier's call", timeout=600)
        commands = " | ".join(processes_in(tmp_path).values())
        for what in ("prefect.server.api.server:create_app", "dask worker",
                     "tokencredit.verifiers.isolation"):
            assert what in commands, f"no {what} in {commands}"
        annotate.send_signal(signal.SIGKILL)
        annotate.wait()
        wait_until(lambda: not processes_in(tmp_path), "the end of every process annotate started")
    finally:
        annotate.kill()
        annotate.wait()
        end_all(tmp_path)
    assert "ending that one and what it started" in log.read_text()  # the temporary server's guard did
