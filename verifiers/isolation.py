"""Plugin verifier calls in worker processes: a call that hangs, runs out of memory, exits the
interpreter or crashes it costs its response, never the run, and nothing a plugin starts outlives
its batch. (The built-in verifiers run in the annotate process: `tokencredit.pipeline.annotate.verify_samples`.)

    with VerifierPool(timeout_s=5.0, memory_bytes=2_000_000_000) as pool:
        results = pool.score_all([(record, response), ...], refs)  # list[RewardScore] or VerifierFailed each

A worker is `python -m tokencredit.verifiers.isolation`, serving one call at a time over a pipe.
It runs in a session (process group) of its own, as a child subreaper (a daemon that a verifier
starts, even one that forks twice, stays its descendant), under a memory limit (RLIMIT_DATA:
its heap and private mappings, not the shared libraries it maps, so a verifier that imports torch
still fits): an allocation past it raises MemoryError there. The caller waits at most `timeout_s`
for each reply; a worker past it, or out of memory, or gone (`os._exit`, a segfault) is killed
with every process under it, and the next call gets a fresh one. Python code that holds the GIL
(a catastrophic regex) stops nothing but its own worker.

Idle workers are kept for the next batch (a start costs about 0.5 s of imports, not counted in
any call's time); when a batch ends (`close`), its worker first ends everything its verifiers
started but its idle SQL sandbox workers (`verifiers/sandbox.py`), which end with it. A worker whose
caller is gone (the annotate process was killed) ends everything under it and exits.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from tokencredit.schemas.records import RewardScore, TaskRecord

from tokencredit.verifiers import plugin_scores, plugins, sandbox

_START_TIMEOUT_S = 60.0  # an interpreter's start on a loaded machine; not counted in any call's time
_MAX_IDLE = 8
_HEADER = struct.Struct("<Q")
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_PARENT_POLL_S = 1.0
_FIRST_NAP_S, _LAST_NAP_S = 0.0005, 0.02  # between looks for a worker's reply


class VerifierFailed(Exception):
    """A verifier call failed; str(e) is the reason, as the response's status gives it."""


def timeout_reason(seconds: float) -> str:
    """A verifier call past its time bound, as the response's status gives it (in this process or a worker)."""
    return f"timeout: the verifiers ran past {seconds:g} s on this response (--verifier-timeout)"


class _Gone(Exception):
    """The worker process ended (or its pipe broke) during a call."""


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, memory_bytes: int):
        self.memory_bytes = memory_bytes
        self.loaded: set = set()  # the plugin refs imported there
        # Unbuffered pipes: a reply read ahead into a buffer would be invisible to select()
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, str(memory_bytes)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, start_new_session=True, bufsize=0)
        try:
            _send(self.proc.stdin, list(sys.path))  # plugins import as they would in this process
            if not self._answers_within(_START_TIMEOUT_S) or _receive(self.proc.stdout) != ("ready",):
                raise _Gone
        except (_Gone, OSError):
            self.kill()
            raise VerifierFailed(f"the verifier worker process did not start within {_START_TIMEOUT_S:g} s") from None

    def ask(self, request: tuple, seconds: float):
        """The worker's reply to `request`; TimeoutError past `seconds`, _Gone if the worker ended."""
        self.send(request)
        return self.reply(seconds)

    def send(self, request: tuple) -> None:
        try:
            _send(self.proc.stdin, request)  # a 2 MB response fills the pipe: the worker reads as we write
        except OSError:
            raise _Gone from None

    def reply(self, seconds: float):
        """The worker's next reply; TimeoutError past `seconds`, _Gone if the worker ended."""
        if not self._answers_within(seconds):
            raise TimeoutError
        reply = _receive(self.proc.stdout)
        if reply is None:
            raise _Gone
        return reply

    def _answers_within(self, seconds: float) -> bool:
        # Polled, with a growing nap, rather than woken by each reply: a wake-up per reply makes the
        # two processes take turns on a busy core, and most calls take well under a millisecond.
        deadline, nap = time.monotonic() + seconds, _FIRST_NAP_S
        fd = self.proc.stdout.fileno()
        while not select.select([fd], [], [], 0)[0]:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(nap, left))
            nap = min(nap * 2, _LAST_NAP_S)
        return True

    def ended_how(self) -> str:
        code = self.proc.wait()
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with status {code} (os._exit or a crash)"

    def kill(self) -> None:
        """End the worker and every process under it."""
        kill_descendants(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its group: anything that left its tree but not its group
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


class VerifierPool:
    """Plugin verifier calls of one batch, one at a time, in a worker process (see the module docstring)."""

    def __init__(self, timeout_s: float, memory_bytes: int):
        self.timeout_s, self.memory_bytes = timeout_s, memory_bytes
        self._worker: _Worker | None = None

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def score_all(self, items: Sequence[tuple[TaskRecord, str]], plugin_refs) -> list[list[RewardScore] | VerifierFailed]:
        """`verifiers.plugin_scores(record, response, plugin_refs)` of each (record, response), in order,
        in the worker, or the VerifierFailed that says why not. The items go in one request and the
        replies stream back (a pipe round trip per call would cost more than most calls), each
        awaited for at most `timeout_s` after the one before it; past a failure that ends the
        worker, the items left go to a fresh one."""
        results: list[list[RewardScore] | VerifierFailed] = []
        while len(results) < len(items):
            results += self._run(items[len(results):], tuple(plugin_refs))
        return results

    def _run(self, items: Sequence[tuple[TaskRecord, str]], refs: tuple) -> list[list[RewardScore] | VerifierFailed]:
        """The results of `items` up to and including the first one that ends the worker."""
        worker = self._worker = self._worker or _take(self.memory_bytes)
        results = []
        try:
            self._load(worker, refs)
            worker.send(("verify", list(items), refs))  # one pickle: a record shared by n responses goes once
            for _ in items:
                kind, value = worker.reply(self.timeout_s)
                if kind == "memory":
                    self._recycle()  # an allocation failed somewhere: its state is not to be trusted
                    return results + [VerifierFailed(f"memory: the verifiers needed more than "
                                                     f"{self.memory_bytes / 1e6:g} MB on this response "
                                                     f"(--verifier-memory); {value}")]
                results.append(value if kind == "ok" else VerifierFailed(value))
        except TimeoutError:
            self._recycle()
            results.append(VerifierFailed(timeout_reason(self.timeout_s)))
        except _Gone:
            how = worker.ended_how()
            self._recycle()
            results.append(VerifierFailed(f"the verifier process {how} on this response"))
        return results

    def _load(self, worker: _Worker, plugin_refs) -> None:
        """Import the plugins in the worker before any call's clock runs: an import (torch, say) may
        take longer than a call may."""
        missing = [ref for ref in plugin_refs if ref not in worker.loaded]
        if missing:
            worker.ask(("load", tuple(missing)), _START_TIMEOUT_S)
            worker.loaded.update(missing)

    def _recycle(self) -> None:
        self._worker.kill()
        self._worker = None

    def close(self) -> None:
        """End what the batch's verifiers started and keep the worker for the next batch."""
        worker, self._worker = self._worker, None
        if worker is None:
            return
        try:
            reply = worker.ask(("reap",), _START_TIMEOUT_S)
        except (TimeoutError, _Gone):
            reply = None
        if reply != ("reaped", None):  # gone, stuck, or still answering a batch left behind (an interrupt)
            worker.kill()
            return
        _give_back(worker)


_idle: list[_Worker] = []
_idle_lock = threading.Lock()


def _take(memory_bytes: int) -> _Worker:
    with _idle_lock:
        for i, worker in enumerate(_idle):
            if worker.memory_bytes == memory_bytes and worker.proc.poll() is None:
                return _idle.pop(i)
    return _Worker(memory_bytes)


def _give_back(worker: _Worker) -> None:
    with _idle_lock:
        if len(_idle) < _MAX_IDLE:
            _idle.append(worker)
            return
    worker.kill()


@atexit.register
def close_workers() -> None:
    """End the idle workers and what is under them (a busy one ends itself when it sees this process gone)."""
    with _idle_lock:
        workers, _idle[:] = list(_idle), []
    for worker in workers:
        worker.kill()


def kill_descendants(pid: int, spare: set[int] = frozenset()) -> None:
    """SIGKILL every live process under `pid` but those in `spare` (and what is under them), looking
    again until none is left (one may fork meanwhile)."""
    for _ in range(20):
        found = _descendants(pid, spare)
        if not found:
            return
        for child in found:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _descendants(pid: int, spare: set[int] = frozenset()) -> list[int]:
    """The live (not zombie) processes under `pid`, but `spare` and their own."""
    found, todo = [], [pid]
    while todo:
        below = [child for child in _children(todo.pop()) if child not in spare and not _is_zombie(child)]
        found += below
        todo += below
    return found


def _children(pid: int) -> list[int]:
    """From /proc/PID/task/TID/children (Linux 4.2+): a few small files, where scanning /proc reads them all."""
    children = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as listed:
                children += map(int, listed.read().split())
    except OSError:  # ended while we looked
        pass
    return children


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # the name in () may hold spaces
    except OSError:
        return True  # gone: as good as a zombie


def _send(stream, obj) -> None:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = memoryview(_HEADER.pack(len(payload)) + payload)
    while data:  # an unbuffered pipe may take part of it
        data = data[stream.write(data):]
    stream.flush()


def _receive(stream):
    """The next object on `stream`; None at its end."""
    header = _read_exactly(stream, _HEADER.size)
    data = header and _read_exactly(stream, _HEADER.unpack(header)[0])
    return None if data is None else pickle.loads(data)


def _read_exactly(stream, n: int) -> bytes | None:
    """`n` bytes and not one more (what follows stays in the pipe, for select() to see); None at its end."""
    chunks = []
    while n:
        chunk = stream.read(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# ---------------------------------------------------------------- the worker process

def _serve(memory_bytes: int) -> None:
    # The replies get a pipe of their own: a verifier's print() goes to stderr, never into them.
    requests, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    sys.path[:] = _receive(requests)
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # the soft limit only: the SQL sandbox's workers (our children) set their own, lower, limits
    resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    _send(replies, ("ready",))
    while (request := _receive(requests)) is not None:
        if request[0] == "reap":
            _reap()
            _send(replies, ("reaped", None))
        elif request[0] == "load":
            _send(replies, ("loaded", _load(request[1])))
        else:
            _, items, refs = request
            for record, response in items:
                reply = _verify(record, response, refs)
                _send(replies, reply)
                if reply[0] == "memory":
                    break  # the caller ends this process
    _reap(keep_sql=False)


def _load(refs) -> None:
    for ref in refs:
        try:
            plugins.load(ref)
        except Exception:  # noqa: BLE001 - the call that follows fails the same way, and says so
            pass


def _verify(record: TaskRecord, response: str, refs) -> tuple[str, object]:
    try:
        return "ok", plugin_scores(record, response, refs)
    except MemoryError as error:
        return "memory", describe(error)
    except BaseException as error:  # noqa: BLE001 - the verifier's failure (SystemExit too) is the response's status
        return "error", describe(error)


def describe(error: BaseException) -> str:
    """A verifier's failure as a response's status gives it: 'Type: message (raised by verifier
    TARGET)' (the note `plugins.score` adds says whose), or 'SystemExit(3)' for an exception that is
    no error but an exit or an interrupt."""
    if not isinstance(error, Exception):
        return f"{type(error).__name__}({', '.join(map(repr, error.args))})"
    notes = "; ".join(getattr(error, "__notes__", ()))
    return f"{type(error).__name__}: {error}" + (f" ({notes})" if notes else "")


def _reap(keep_sql: bool = True) -> None:
    """End every process under this one but (with `keep_sql`) the idle SQL workers, kept for the
    next batch as the SQL verifier keeps them in any process (starting one costs more than a query)."""
    if not keep_sql:
        sandbox.close_workers()
    kill_descendants(os.getpid(), spare=sandbox.idle_worker_pids() if keep_sql else set())
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:  # the killed children, and orphans that came here
            pass
    except ChildProcessError:
        pass


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    _reap(keep_sql=False)
    os._exit(1)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
