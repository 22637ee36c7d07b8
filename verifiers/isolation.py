"""Plugin verifier calls in worker processes: a call that hangs, runs out of memory, exits the
interpreter or crashes it costs its response, never the run, and nothing a plugin starts outlives
its batch. (The built-in verifiers run in the annotate process: `tokencredit.pipeline.annotate.verify_samples`.)

    with VerifierPool(timeout_s=5.0, memory_bytes=2_000_000_000) as pool:
        results = pool.score_all([(record, response), ...], refs)  # list[RewardScore] or VerifierFailed each

A worker is `python -m tokencredit.verifiers.isolation`, serving one call at a time over a pipe.
It runs in a session (process group) of its own, as a child subreaper (a daemon that a verifier
starts, even one that forks twice, stays its descendant), under a hard memory limit the verifier
cannot lift (RLIMIT_DATA: its heap and private mappings, not the shared libraries it maps, so a
verifier that imports torch still fits; each process it starts inherits it): an allocation past it
raises MemoryError there. The caller waits at most `timeout_s` for each reply, whole (a reply begun and
never finished too), and meanwhile measures the worker's whole process tree (`tree_memory`: shared mappings
and child processes too); a worker past either bound, gone (`os._exit`, a segfault), or whose reply is no
verifier result (a plugin that writes into the reply pipe: a reply is unpickled with only the classes a reply
holds, so it runs no code here) is killed with every process under it, and the next call gets a fresh one,
as does the call after one that left threads running. Python
code that holds the GIL (a catastrophic regex) stops nothing but its own worker. What a worker's
verifiers print reaches the caller's stderr, OUTPUT_PER_CALL bytes a call; the rest is counted and dropped.

Idle workers are kept for the next batch (a start costs about 0.5 s of imports, not counted in
any call's time); when a batch ends (`close`), its worker first ends everything its verifiers
started but its idle SQL sandbox workers (`verifiers/sandbox.py`), which end with it. Each worker
forks a guard process that kills the worker's tree as soon as its caller is gone (killed, even with
SIGKILL), whatever the worker is doing. Plugins are imported in workers too, never in the caller
(`resolve`, `check_loadable`): an import that exits, crashes or hangs is one PluginError naming it.
`verify` is `verifiers.verify` with the plugins in a worker, for the TRL and verl reward functions.
"""
from __future__ import annotations

import atexit
import ctypes
import io
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
IMPORT_TIMEOUT_S = 60.0  # a plugin's import (torch, say), in a worker; not counted in any call's time
_MAX_IDLE = 8
_HEADER = struct.Struct("<Q")
# Taken before any plugin is imported: a plugin that replaces `pickle.dumps` in its worker changes nothing here
_dumps, _loads = pickle.dumps, pickle.loads
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_FIRST_NAP_S, _LAST_NAP_S = 0.0005, 0.02  # between looks for a worker's reply
_MEASURE_EVERY_S = 0.05  # between measurements of a worker's process tree while a call runs
_MEASURE_AFTER_S = 0.001  # and after a reply awaited this long (~0.1 ms a process: not after each fast call)
OUTPUT_PER_CALL = 64_000  # bytes of a verifier's stdout/stderr shown per call; the rest is counted and dropped


class VerifierFailed(Exception):
    """A verifier call failed; str(e) is the reason, as the response's status gives it."""


def timeout_reason(seconds: float) -> str:
    """A verifier call past its time bound, as the response's status gives it (in this process or a worker)."""
    return f"timeout: the verifiers ran past {seconds:g} s on this response (--verifier-timeout)"


class _Gone(Exception):
    """The worker process ended (or its pipe broke) during a call."""


class _Garbled(Exception):
    """The worker sent a reply that is no answer to the call (a plugin wrote into the reply pipe or changed
    how the worker pickles); str(e) says what was wrong with it."""


class _OverMemory(Exception):
    """The worker's process tree held more than its bound; str(e) says how much, in how many processes."""


def check_memory_bound(memory_bytes: int) -> None:
    """ValueError (one line) when the hard data limit this process runs under (`ulimit -d`, which a worker
    inherits and cannot raise) is below `memory_bytes`: the bound could not be set as asked."""
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    if hard != resource.RLIM_INFINITY and hard < memory_bytes:
        raise ValueError(f"--verifier-memory {memory_bytes / 1e6:g} MB is above the hard data limit of this "
                         f"process, {hard / 1e6:g} MB (ulimit -Hd {hard // 1024}): lower --verifier-memory to at "
                         f"most that, or raise the hard limit")


def tree_memory(pid: int) -> tuple[int, int]:
    """(bytes, processes) of `pid` and every live process under it: each one's resident anonymous and
    shared-memory pages and its swap (RssAnon + RssShmem + VmSwap: what it allocated, shared mappings included;
    not the files and libraries it maps). Pages two processes share (a fork's, one shared mapping) count in
    each: the sum errs high, never low. The kernel keeps these counts: reading them costs ~0.1 ms a process."""
    total, pids = 0, [pid, *descendants(pid)]
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as status:
                total += sum(int(line.split()[1]) * 1024 for line in status
                             if line.startswith(("RssAnon:", "RssShmem:", "VmSwap:")))
        except (OSError, ValueError, IndexError):  # ended while we looked
            continue
    return total, len(pids)


class _Worker:
    """One worker process, its pipes, and the thread that forwards what its verifiers print."""

    def __init__(self, memory_bytes: int):
        check_memory_bound(memory_bytes)
        self.memory_bytes = memory_bytes
        # where and with what environment the worker started: a plugin imports from the caller's folder and reads
        # its environment, so an idle worker serves only a caller that still has both (see `_take`)
        self.started_in = (os.getcwd(), dict(os.environ))
        self.loaded: set = set()  # the plugin refs imported there
        self._next_measure = 0.0
        # The worker's guard process waits for end-of-file on `alive`: only this process holds the other end
        alive, self._alive = os.pipe()
        try:
            # Unbuffered pipes: a reply read ahead into a buffer would be invisible to select()
            token = f"[tokencredit: end of call {os.urandom(8).hex()}]"
            self.proc = subprocess.Popen([sys.executable, "-m", __name__, str(memory_bytes), str(alive), token],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         start_new_session=True, bufsize=0, pass_fds=(alive,))
        except BaseException:
            os.close(self._alive)
            raise
        finally:
            os.close(alive)
        self.output = _Output(self.proc.stderr, token.encode())
        try:
            _send(self.proc.stdin, list(sys.path))  # plugins import as they would in this process
            if self.reply(_START_TIMEOUT_S) != ("ready",):
                raise _Gone
        except (_Gone, _Garbled, TimeoutError, OSError):
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

    def reply(self, seconds: float, measure: bool = False):
        """The worker's next reply, whole within `seconds` (TimeoutError past them: a reply begun and never
        finished too); _Gone if the worker ended, _Garbled if the bytes are no reply, and with `measure`
        _OverMemory when its process tree holds more than its bound (looked at every _MEASURE_EVERY_S)."""
        deadline = time.monotonic() + seconds
        header = self._read(_HEADER.size, deadline, measure)
        payload = self._read(_HEADER.unpack(header)[0], deadline)
        try:
            return _SafeUnpickler(io.BytesIO(payload)).load()
        except Exception as error:  # noqa: BLE001 - whatever the bytes make the unpickler raise
            raise _Garbled(f"{type(error).__name__}: {error}") from None

    def _read(self, n: int, deadline: float, measure: bool = False) -> bytes:
        """`n` bytes from the reply pipe, each part awaited until `deadline` (TimeoutError past it)."""
        chunks = []
        while n:
            if not self._answers_within(deadline - time.monotonic(), measure):
                raise TimeoutError
            chunk = self.proc.stdout.read(n)
            if not chunk:
                raise _Gone
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _answers_within(self, seconds: float, measure: bool = False) -> bool:
        # Polled, with a growing nap, rather than woken by each reply: a wake-up per reply makes the
        # two processes take turns on a busy core, and most calls take well under a millisecond.
        start = time.monotonic()
        deadline, nap = start + seconds, _FIRST_NAP_S
        fd = self.proc.stdout.fileno()
        while True:
            if select.select([fd], [], [], 0)[0]:
                # also when the reply is there, so that the call that grew the tree is the one blamed; not after a
                # reply that was waiting already (a call that short cannot have allocated much)
                if measure and time.monotonic() - start >= _MEASURE_AFTER_S:
                    self._measure(force=True)
                return True
            if measure:
                self._measure()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(nap, left))
            nap = min(nap * 2, _LAST_NAP_S)

    def _measure(self, force: bool = False) -> None:
        if not force and time.monotonic() < self._next_measure:
            return
        held, processes = tree_memory(self.proc.pid)
        self._next_measure = time.monotonic() + _MEASURE_EVERY_S
        if held > self.memory_bytes:
            raise _OverMemory(f"{held / 1e6:.0f} MB in {processes} process{'es' if processes > 1 else ''}")

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
        if self._alive is not None:
            os.close(self._alive)
            self._alive = None


class _Output:
    """A worker's stdout and stderr, forwarded to this process's stderr by a thread: at most OUTPUT_PER_CALL
    bytes a call, the rest counted, dropped, and said in one line (a verifier that prints megabytes a call
    must not fill a job's log). The worker ends each call's output with `token`, so that the count is per call
    however far this thread lags behind the replies."""

    def __init__(self, stream, token: bytes):
        self.token, self.shown, self.dropped = token, 0, 0
        threading.Thread(target=self._forward, args=(stream,), name="verifier-output", daemon=True).start()

    def _forward(self, stream) -> None:
        pending, keep = b"", len(self.token) - 1  # a token may arrive split between two reads
        with stream:
            while chunk := stream.read(1 << 16):
                pending += chunk
                while (at := pending.find(self.token)) >= 0:
                    self._show(pending[:at])
                    self._end_call()
                    pending = pending[at + len(self.token):]
                cut = max(len(pending) - keep, 0)
                self._show(pending[:cut])
                pending = pending[cut:]
        self._show(pending)
        self._end_call()

    def _show(self, data: bytes) -> None:
        room = max(OUTPUT_PER_CALL - self.shown, 0)
        self.shown += min(room, len(data))
        self.dropped += max(len(data) - room, 0)
        if room and data:
            _to_stderr(data[:room])

    def _end_call(self) -> None:
        if self.dropped:
            _to_stderr(f"\n[a plugin verifier's output: {self.dropped:,} more bytes of one call dropped; "
                       f"{OUTPUT_PER_CALL // 1000} KB a call are shown]\n".encode())
        self.shown = self.dropped = 0


def _to_stderr(data: bytes) -> None:
    try:
        if hasattr(sys.stderr, "buffer"):
            sys.stderr.buffer.write(data)
        else:  # a stream of text only (a test's capture)
            sys.stderr.write(data.decode(errors="replace"))
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: the output has nowhere to go
        pass


def memory_reason(memory_bytes: int, detail: str) -> str:
    """A verifier call past its memory bound, as the response's status gives it."""
    return (f"memory: the verifiers needed more than {memory_bytes / 1e6:g} MB on this response "
            f"(--verifier-memory); {detail}")


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
        """The results of `items` up to and including the first one that ends the worker (or leaves it
        threads that could touch the next response)."""
        worker = self._worker = self._worker or _take(self.memory_bytes)
        self._load(worker, refs)
        results = []
        try:
            worker.send(("verify", list(items), refs))  # one pickle: a record shared by n responses goes once
            for _ in items:
                kind, value, leftover = _verdict(worker.reply(self.timeout_s, measure=True))
                if kind == "memory":
                    self._recycle()  # an allocation failed somewhere: its state is not to be trusted
                    return results + [VerifierFailed(memory_reason(self.memory_bytes, value))]
                results.append(value if kind == "ok" else VerifierFailed(value))
                if leftover:  # the call left threads running: the next response gets a fresh worker
                    self._recycle()
                    return results
        except TimeoutError:
            self._recycle()
            results.append(VerifierFailed(timeout_reason(self.timeout_s)))
        except _OverMemory as held:
            self._recycle()
            results.append(VerifierFailed(memory_reason(self.memory_bytes, f"its processes held {held}")))
        except _Gone:
            how = worker.ended_how()
            self._recycle()
            results.append(VerifierFailed(f"the verifier process {how} on this response"))
        except _Garbled as what:
            self._recycle()
            results.append(VerifierFailed(f"the verifier process sent a reply that is no verifier result ({what}) "
                                          f"on this response"))
        return results

    def _load(self, worker: _Worker, plugin_refs) -> None:
        """Import the plugins in the worker, one at a time, before any call's clock runs: an import (torch, say)
        may take longer than a call may. An import that ends the worker or runs past IMPORT_TIMEOUT_S stops the
        run: every call would fail the same way. PluginError names the plugin."""
        for ref in plugin_refs:
            if ref in worker.loaded:
                continue
            try:
                worker.ask(("load", (ref,)), IMPORT_TIMEOUT_S)
            except (_Gone, _Garbled, TimeoutError) as error:
                how = (f"ran past {IMPORT_TIMEOUT_S:g} s" if isinstance(error, TimeoutError)
                       else f"garbled the verifier process's reply ({error})" if isinstance(error, _Garbled)
                       else f"ended the verifier process, which {worker.ended_how()}")
                self._recycle()
                raise plugins.PluginError(f"verifier {ref.target}: importing it {how}") from None
            worker.loaded.add(ref)

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
        except (TimeoutError, _Gone, _Garbled):
            reply = None
        if reply != ("reaped", None):  # gone, stuck, or still answering a batch left behind (an interrupt)
            worker.kill()
            return
        _give_back(worker)


def verify(record: TaskRecord, response: str, plugin_refs: Sequence[plugins.PluginRef], timeout_s: float,
           memory_bytes: int) -> list[RewardScore]:
    """`verifiers.verify(record, response, plugin_refs)` with each importable plugin run in a worker process under
    `timeout_s` and `memory_bytes`, as annotate runs it (a verifier object, `plugins.of_object`, has no import
    path and runs in this process). A plugin that fails in its worker, or runs past a bound, raises VerifierFailed
    saying why (its str is what annotate stores as the response's status after "verifier_error: ")."""
    from tokencredit import verifiers

    scores = verifiers.builtin_scores(record, response)
    with VerifierPool(timeout_s, memory_bytes) as pool:
        for ref in verifiers.applying_plugins(record, plugin_refs):
            if isinstance(ref, plugins.ObjectRef):
                scores += plugins.score(ref, record, response)
                continue
            found = pool.score_all([(record, response)], (ref,))[0]
            if isinstance(found, VerifierFailed):
                raise found  # says why, as the response's status in annotate
            scores += found
    return verifiers.checked(record, response, scores)


def resolve(specs: Sequence[str], memory_bytes: int) -> tuple[plugins.PluginRef, ...]:
    """`plugins.resolve(specs)` in a worker process under `memory_bytes` and IMPORT_TIMEOUT_S per plugin: an
    import that exits, crashes, hangs or starts a daemon costs a PluginError naming the plugin, never this
    process, and what it started ends with the worker."""
    return tuple(_in_worker(memory_bytes, [(spec, ("resolve", spec)) for spec in specs]))


def check_loadable(refs: Sequence[plugins.PluginRef], memory_bytes: int) -> None:
    """PluginError naming the first of `refs` that cannot be imported with its recorded source, imported in a
    worker process as `resolve` imports them."""
    for error in _in_worker(memory_bytes, [(ref.target, ("load", (ref,))) for ref in refs]):
        if error is not None:
            raise plugins.PluginError(error)


def _in_worker(memory_bytes: int, requests: Sequence[tuple[str, tuple]]) -> list:
    """The replies' values to `requests` (each labelled by its plugin), asked of one fresh worker, killed after
    them with everything under it."""
    if not requests:
        return []
    worker, values = _Worker(memory_bytes), []
    try:
        for label, request in requests:
            try:
                kind, value = worker.ask(request, IMPORT_TIMEOUT_S)
            except TimeoutError:
                raise plugins.PluginError(f"verifier {label}: importing it ran past {IMPORT_TIMEOUT_S:g} s") from None
            except _Gone:
                raise plugins.PluginError(f"verifier {label}: importing it ended the process, which "
                                          f"{worker.ended_how()}") from None
            except _Garbled as error:
                raise plugins.PluginError(f"verifier {label}: importing it garbled the process's reply ({error})"
                                          ) from None
            if kind == "error":
                raise plugins.PluginError(value)
            values.append(value)
        return values
    finally:
        worker.kill()


_idle: list[_Worker] = []
_idle_lock = threading.Lock()


def _take(memory_bytes: int) -> _Worker:
    """An idle worker started here (this folder and environment) under `memory_bytes`, else a new one; idle
    workers started elsewhere, or gone, are ended."""
    here = (os.getcwd(), dict(os.environ))
    with _idle_lock:
        stale = [w for w in _idle if w.started_in != here or w.proc.poll() is not None]
        _idle[:] = [w for w in _idle if w not in stale]
        i = next((i for i, w in enumerate(_idle) if w.memory_bytes == memory_bytes), None)
        worker = _idle.pop(i) if i is not None else None
    for w in stale:
        w.kill()
    return worker or _Worker(memory_bytes)


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
        found = descendants(pid, spare)
        if not found:
            return
        for child in found:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def descendants(pid: int, spare: set[int] = frozenset()) -> list[int]:
    """The live (not zombie) processes under `pid`, but `spare` and their own."""
    found, todo = [], [pid]
    while todo:
        below = [child for child in _children(todo.pop()) if child not in spare and not is_gone(child)]
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


def is_gone(pid: int) -> bool:
    """No such process, or a zombie (dead, waiting for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # the name in () may hold spaces
    except OSError:
        return True  # gone: as good as a zombie


def _send(stream, obj) -> None:
    payload = _dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = memoryview(_HEADER.pack(len(payload)) + payload)
    while data:  # an unbuffered pipe may take part of it
        data = data[stream.write(data):]
    stream.flush()


def _receive(stream):
    """The next object on `stream`; None at its end."""
    header = _read_exactly(stream, _HEADER.size)
    data = header and _read_exactly(stream, _HEADER.unpack(header)[0])
    return None if data is None else _loads(data)


class _SafeUnpickler(pickle.Unpickler):
    """A worker's reply, unpickled: plain values and the classes a reply holds, nothing else, so that bytes a
    plugin writes into the reply pipe cannot run code in this process."""

    CLASSES = {("tokencredit.schemas.records", "RewardScore"), ("tokencredit.verifiers.plugins", "PluginRef")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.CLASSES:
            raise pickle.UnpicklingError(f"{module}.{name} is no part of a reply")
        return super().find_class(module, name)


def _verdict(reply) -> tuple[str, object, bool]:
    """A verify call's reply, (kind, value, leftover); _Garbled saying what is wrong when it is none."""
    if not (isinstance(reply, tuple) and len(reply) == 3 and isinstance(reply[2], bool)):
        raise _Garbled(f"a {type(reply).__name__}, not (kind, value, leftover)")
    kind, value, _ = reply
    if kind == "ok" and not (isinstance(value, list) and all(isinstance(s, RewardScore) for s in value)):
        raise _Garbled(f"'ok' with a {type(value).__name__}, not a list of rewards")
    if kind in ("error", "memory") and not isinstance(value, str):
        raise _Garbled(f"{kind!r} with a {type(value).__name__}, not a message")
    if kind not in ("ok", "error", "memory"):
        raise _Garbled(f"the kind {kind!r}")
    return reply


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

def _serve(memory_bytes: int, alive: int, token: str) -> None:
    global _guard
    # The replies get a pipe of their own: a verifier's print() goes to stderr (the caller forwards it,
    # capped), never into them.
    requests, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    sys.path[:] = _receive(requests)
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # The hard limit too: a verifier cannot lift it, and the processes it starts inherit it (the SQL
    # sandbox's workers lower theirs); `_Worker._measure` bounds the tree's sum, shared mappings included.
    resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    _guard = _start_guard(alive, requests, replies)
    _send(replies, ("ready",))
    threads = threading.active_count()
    def reply(message) -> None:  # the output so far is that call's: the caller counts it up to `token`
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a verifier closed it
                pass
        os.write(2, token.encode())
        _send(replies, message)

    while (request := _receive(requests)) is not None:
        if request[0] == "reap":
            _reap()
            _send(replies, ("reaped", None))
        elif request[0] == "load":
            reply(("loaded", _load(request[1])))
            threads = threading.active_count()  # what an import starts is the plugin's own, for every call
        elif request[0] == "resolve":
            reply(_resolve(request[1]))
        else:
            _, items, refs = request
            for record, response in items:
                kind, value = _verify(record, response, refs)
                leftover = threading.active_count() > threads  # a thread this call started, still running
                reply((kind, value, leftover))
                if kind == "memory" or leftover:
                    break  # the caller ends this process
    _reap(keep_sql=False)
    _kill(_guard)


_guard = 0  # the guard process's id, in the worker


def _start_guard(alive: int, *keep_closed) -> int:
    """Fork the worker's guard: a process that waits for end-of-file on `alive`, whose other end only the
    caller holds, and then kills the worker and everything under it. It notices a caller killed with
    SIGKILL at once, and ends a worker whose verifier holds the GIL (a thread of the worker could not run)."""
    worker = os.getpid()
    pid = os.fork()
    if pid:
        os.close(alive)
        return pid
    try:
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(quiet, fd)
        for stream in keep_closed:  # the replies' pipe must see end-of-file when the worker ends
            os.close(stream.fileno())
        while os.read(alive, 1):
            pass
        kill_descendants(worker, spare={os.getpid()})
        _kill(worker)
    finally:
        os._exit(0)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _load(refs) -> str | None:
    """Import each plugin; why the first that cannot be imported cannot (PluginError's line), else None."""
    for ref in refs:
        try:
            plugins.load(ref)
        except Exception as error:  # noqa: BLE001 - a plugin's import may raise anything
            return _import_failure(ref.target, error)
    return None


def _resolve(spec: str) -> tuple[str, object]:
    try:
        return "resolved", plugins.resolve([spec])[0]
    except Exception as error:  # noqa: BLE001 - a plugin's import may raise anything
        return "error", _import_failure(spec, error)


def _import_failure(target: str, error: Exception) -> str:
    if isinstance(error, plugins.PluginError):
        return str(error).encode("utf-8", "backslashreplace").decode()
    return f"verifier {target}: importing it raised {describe(error)}"


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
    notes = "; ".join(map(str, getattr(error, "__notes__", ())))
    text = f"{type(error).__name__}: {error}" + (f" ({notes})" if notes else "")
    return text.encode("utf-8", "backslashreplace").decode()  # a lone surrogate in a message: stored escaped


def _reap(keep_sql: bool = True) -> None:
    """End every process under this one but (with `keep_sql`) the idle SQL workers, kept for the
    next batch as the SQL verifier keeps them in any process (starting one costs more than a query)."""
    if not keep_sql:
        sandbox.close_workers()
    kill_descendants(os.getpid(), spare={_guard, *(sandbox.idle_worker_pids() if keep_sql else ())})
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:  # the killed children, and orphans that came here
            pass
    except ChildProcessError:
        pass


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
