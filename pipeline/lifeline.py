"""A child process that ends, with every process under it, when the process that started it ends, however that
one ends (kill -9 included): `serve`'s Prefect server and runner, and the runner's flow runs.

    end_with(parent_pid)    # in the child, first thing: from then on it ends when `parent_pid` does

or, for a program that is not ours to change (`prefect server start`), its command line:

    command(module, *args)  # `python -m MODULE ARGS...`, in a process that ends when this one does

or, for a child that code not ours started (Prefect's temporary server, started by its client), a guard process:

    tie(pid)                # process `pid`, a child of this one, ends when this one does

The watch is a pidfd (Linux 5.3+), readable once the parent has ended, on a thread of its own. It watches the parent
process whatever thread of it started this one: PR_SET_PDEATHSIG fires when that *thread* ends, which would end a
worker that a pool thread started. When it fires, every process under this one is frozen and killed
(`interrupts.stop_descendants`: one in a session of its own too), one line says why, and this process exits; a guard
ends its tied process so, unless that one ended first. The plugin verifier workers and the SQL sandbox's workers
watch their caller on their own (`verifiers/isolation.py`: a guard process; `verifiers/sandbox.py`: the request
pipe's end), and Dask's worker processes end with the process that started their cluster (distributed's keep-alive
pipe).
"""
from __future__ import annotations

import os
import runpy
import select
import signal
import subprocess
import sys
import threading

from tokencredit.pipeline.interrupts import stop_descendants

ORPHANED = 1  # the exit status of a process that ended because its parent did (nobody is left to read it)
TIE = "--tie"  # the guard's command line: PARENT --tie CHILD
_guards: list[subprocess.Popen] = []  # held: a guard is no garbage while this process lives


def command(module: str, *args: str) -> list[str]:
    """The command line of `python -m MODULE ARGS...` run by a process that ends when this one does."""
    return [sys.executable, "-m", __name__, str(os.getpid()), module, *args]


def tie(child: int) -> None:
    """End process `child`, a child of this one, and what it started, once this process ends, however it ends (a
    guard process watches both); a child that ends first ends the guard."""
    _guards.append(subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid()), TIE, str(child)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True))


def end_with(parent: int) -> None:
    """From now on, end this process and everything under it once process `parent` (this one's parent) ends;
    at once when it has ended already."""
    from tokencredit.verifiers import isolation  # noqa: F401 - imported now, not by a watch that must act at once

    watched = _watch_parent(parent)
    if watched is None:
        _end(parent)
    threading.Thread(target=_watch, args=(watched, parent), name="lifeline", daemon=True).start()


def _watch_parent(parent: int) -> int | None:
    """A pidfd of `parent`, this process's parent, readable once it has ended; None when it has ended already
    (this process was handed on, and the pid may be another's by now)."""
    try:
        watched = os.pidfd_open(parent)
    except ProcessLookupError:
        return None
    if os.getppid() != parent:
        os.close(watched)
        return None
    return watched


def _watch(watched: int, parent: int) -> None:
    select.select([watched], [], [])
    _end(parent)


def _end(parent: int) -> None:
    _say(f"tokencredit: process {parent}, which started this one ({os.getpid()}), ended; ending this one and what "
         f"it started\n")
    stop_descendants(os.getpid())
    os._exit(ORPHANED)


def _guard(parent: int, child: int) -> None:
    """The guard of `tie`: once `parent` ends, freeze `child`, kill what it started, then kill it; nothing when
    `child` ends first. Signals go through a pidfd: the pid of an ended child may be another's by now."""
    try:
        tied = os.pidfd_open(child)
    except ProcessLookupError:
        return
    watched = _watch_parent(parent)
    if watched is not None and tied in select.select([tied, watched], [], [])[0]:
        return
    try:
        signal.pidfd_send_signal(tied, signal.SIGSTOP)  # it starts no new process while its own are killed
    except ProcessLookupError:
        return
    _say(f"tokencredit: process {parent}, which started process {child}, ended; ending that one and what it "
         f"started\n")
    stop_descendants(child)
    try:
        signal.pidfd_send_signal(tied, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _say(line: str) -> None:
    try:
        os.write(2, line.encode())
    except OSError:
        pass


def main(argv: list[str]) -> None:
    """`python -m tokencredit.pipeline.lifeline PARENT_PID MODULE ARGS...`: `python -m MODULE ARGS...`, ended with
    PARENT_PID; `... PARENT_PID --tie PID`: the guard that ends PID with PARENT_PID."""
    if argv[1] == TIE:
        _guard(int(argv[0]), int(argv[2]))
        return
    end_with(int(argv[0]))
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
