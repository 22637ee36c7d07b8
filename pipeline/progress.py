"""Progress of the long loops (sampling, replay, P2T): a bar on a terminal, a log line every few seconds
otherwise (a Dask worker's log, a CI job, `nohup`), both with tokens per second.

    with Progress("replay", total=n_tokens, unit="token") as progress:
        for block in blocks:
            ...
            progress.update(len(block), tokens=tokens_in_block)

A phase without a count (loading a model, starting Prefect or an engine, training set-up) is a Phase: announced
before it starts, then a line every few seconds while it lasts, so that no run is silent for long.

    with Phase("loading the policy smollm2-135m-instruct"):
        model = load_policy(...)
"""
from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

LOG_EVERY_S = 5.0


_last_line = [time.monotonic()]  # when any Progress or Phase of this process last printed


class _Beat:
    """A daemon thread that calls `say()` whenever `every` seconds pass without a line of this process's progress
    (a phase inside another, or a Progress within a Phase, keeps the outer one quiet while it speaks); `heard()`
    says a line was just printed (by `say` or by the caller), so that the next one is due `every` seconds later."""

    def __init__(self, every: float, say, name: str):
        self.every, self.say = every, say
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)

    def heard(self) -> None:
        self.last = _last_line[0] = time.monotonic()

    def _due(self) -> float:
        return max(self.last, _last_line[0]) + self.every

    def _run(self) -> None:
        while not self._stop.wait(max(self._due() - time.monotonic(), 0.05)):
            if time.monotonic() >= self._due():
                self.say()
                self.heard()

    def start(self) -> None:
        self.heard()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


class Progress:
    """Counts `unit`s (out of `total` when known) and tokens; draws a tqdm bar when `stream` is a
    terminal, else prints '<desc>: 12/40 responses, 1,234 tokens, 310 tokens/s, 9 s' every `every` seconds
    (also while one unit takes longer) and once at the end (unless the last line already had the final count).
    `enabled=False` prints nothing. Close it (or use it as a context manager): its log lines stop then."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "it", *, enabled: bool = True,
                 stream: TextIO | None = None, every: float = LOG_EVERY_S):
        self.desc, self.total, self.unit, self.every = desc, total, unit, every
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.done = self.tokens = self.logged = 0  # logged: `done` when the last line was printed
        self.start = time.monotonic()
        self.bar = self.beat = None
        self.lock = threading.Lock()  # the beat's thread and the caller's both print
        if enabled and self.stream.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream)
        elif enabled:
            self.beat = _Beat(every, self._log, name=f"progress: {desc}")
            self.beat.start()

    def update(self, n: int = 1, tokens: int | None = None) -> None:
        """`n` more units done; `tokens` processed with them (default: n, when the unit is a token)."""
        self.done += n
        self.tokens += n if tokens is None and self.unit == "token" else (tokens or 0)
        if self.bar is not None:
            self.bar.update(n)
            if self.unit != "token":
                self.bar.set_postfix_str(f"{self.rate():,.0f} tokens/s", refresh=False)
        elif self.beat is not None and time.monotonic() - self.beat.last >= self.every:
            self._log()

    def rate(self) -> float:
        return self.tokens / max(time.monotonic() - self.start, 1e-9)

    def line(self) -> str:
        of = f"/{self.total:,}" if self.total is not None else ""
        tokens = "" if self.unit == "token" else f", {self.tokens:,} tokens"
        return (f"{self.desc}: {self.done:,}{of} {self.unit}s{tokens}, {self.rate():,.0f} tokens/s, "
                f"{time.monotonic() - self.start:.0f} s")

    def _log(self) -> None:
        with self.lock:
            print(self.line(), file=self.stream, flush=True)
            self.logged = self.done
            self.beat.heard()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.beat is not None:
            self.beat.stop()
            if self.done != self.logged:  # the final count, unless the last line already said it
                self._log()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Phase:
    """Prints '<what> ...' before a phase starts and '<what>: <s> s' every `every` seconds while it lasts (since
    its start or since the caller's last `mark()`, which says a line of its own was printed); `enabled=False`
    prints nothing. Lines go to `stream` (stderr), on a terminal as in a log."""

    def __init__(self, what: str, *, enabled: bool = True, stream: TextIO | None = None,
                 every: float = LOG_EVERY_S):
        self.what, self.enabled = what, enabled
        self.stream = stream or sys.stderr
        self.start = time.monotonic()
        self.beat = _Beat(every, self._say, name=f"phase: {what}")

    def mark(self) -> None:
        self.beat.heard()

    def _say(self) -> None:
        self._line(f"{self.what}: {time.monotonic() - self.start:.0f} s")

    def _line(self, text: str) -> None:
        # one write: `print` writes the newline apart, and a phase on another thread (the models loading beside
        # Prefect's flow) would land between the two
        self.stream.write(text + "\n")
        self.stream.flush()

    def __enter__(self) -> Phase:
        if self.enabled:
            self._line(f"{self.what} ...")
            self.start = time.monotonic()
            self.beat.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.beat.stop()
