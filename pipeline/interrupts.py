"""SIGINT and SIGTERM that leave a run exact: stop at once, write nothing half-done, resume where it stopped.

    with interruptible("annotate"):     # the CLI wraps each long command in it (a `compare` stage too)
        run_stages()

The first SIGINT or SIGTERM (Ctrl-C, a scheduler's cancel, `kill`) is handled on a thread of its own, so a
main thread busy in a forward pass or waiting on a pool answers it at once:
  1. from then on no file is committed: `hold()`, which every atomic write of a run or derived folder and
     every training checkpoint calls first, blocks the thread that calls it until the process ends, so a
     result computed while the workers were being killed (a verifier call cut short, k=1 of 2
     continuations) is never written;
  2. one line, "tokencredit CMD: interrupted; rerun the same command to resume", goes to stderr, which
     is then closed to the log lines of dying threads;
  3. every process under this one (threads and Dask workers, plugin verifier workers and what they
     started, SQL sandboxes, Prefect's temporary server) is frozen with SIGSTOP, parents first, so that
     none sees its children die and acts on it, then killed with SIGKILL;
  4. the process exits with 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM.
A second signal during those steps exits at once. What was written before the signal is whole (files are
written under temporary names, a shard's marker last), so rerunning the same command resumes exactly as
after a crash, and the resumed run's files equal an uninterrupted run's. Shards running on a remote Dask
scheduler's workers (`--dask-address`) are not this process's to kill: they finish and write whole shards.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_KILL_WAIT_S = 5.0  # for the killed processes to be gone before this one exits

_stopping = threading.Event()


def stopping() -> bool:
    """True once an interrupt is being handled (the process is about to exit)."""
    return _stopping.is_set()


def hold() -> None:
    """Before committing a file: when an interrupt is being handled, block until the process exits (it
    does within seconds), so that nothing computed during the interrupt is written; else return at once."""
    while _stopping.is_set():
        time.sleep(3600)


def message(command: str) -> str:
    return f"tokencredit {command}: interrupted; rerun the same command to resume"


@contextmanager
def interruptible(command: str) -> Iterator[None]:
    """SIGINT and SIGTERM handled as the module docstring says while the block runs; the handlers before
    it are restored after it. Only the main thread can set signal handlers: elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = {signum: signal.signal(signum, _noted) for signum in SIGNALS}
    previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read, command), name="interrupts", daemon=True).start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        os.close(write)  # the watcher reads end-of-file and returns
        # (`read` is closed by the watcher)


def _noted(signum, frame) -> None:
    """The Python-level handler does nothing: the C-level one wrote the signal's number to the wakeup pipe,
    which `_watch` reads (KeyboardInterrupt would unwind the main thread into Prefect's crash handling)."""


def _watch(read: int, command: str) -> None:
    try:
        first = os.read(read, 1)
        if not first:
            return
        code = 128 + first[0]
        _stopping.set()
        # an event loop that the signal cut short drops its sockets with "Exception ignored in ...": noise before
        # the one line, like everything dying threads print after it (`_stop`)
        sys.unraisablehook = lambda unraisable: None
        threading.Thread(target=_stop, args=(command, code), name="interrupts-stop", daemon=True).start()
        if os.read(read, 1):  # a second signal: end now
            os._exit(code)
    finally:
        os.close(read)


def _stop(command: str, code: int) -> None:
    line = ("\n" if _mid_line() else "") + message(command) + "\n"
    stderr, quiet = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # what dying threads and servers log from now on is noise: the line is the last word
    os.dup2(quiet, 2)
    try:  # to the file descriptor itself: sys.stderr's lock may be held by a thread that never lets go
        os.write(stderr, line.encode())
    except OSError:
        pass
    try:
        stop_descendants(os.getpid())
    finally:
        os._exit(code)


def _mid_line() -> bool:
    """Whether a progress bar may be half-drawn on a terminal's line (the message then starts a line of its own)."""
    try:
        return os.isatty(2)
    except OSError:
        return False


def stop_descendants(pid: int, deadline_s: float = _KILL_WAIT_S) -> None:
    """Freeze every process under `pid` (SIGSTOP, parents first, looking again until no new one appears),
    then SIGKILL them all and wait up to `deadline_s` for them to be gone."""
    from tokencredit.verifiers.isolation import descendants, is_gone

    frozen: list[int] = []
    for _ in range(20):
        found = [p for p in descendants(pid) if p not in frozen]
        if not found:
            break
        for child in found:
            _signal(child, signal.SIGSTOP)
        frozen += found
    for child in frozen:
        _signal(child, signal.SIGKILL)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and not all(is_gone(p) for p in frozen):
        time.sleep(0.02)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
