"""Progress of the long loops (sampling, replay, P2T): a bar on a terminal, a log line every few seconds
otherwise (a Dask worker's log, a CI job, `nohup`), both with tokens per second.

    with Progress("replay", total=n_tokens, unit="token") as progress:
        for block in blocks:
            ...
            progress.update(len(block), tokens=tokens_in_block)
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

LOG_EVERY_S = 5.0


class Progress:
    """Counts `unit`s (out of `total` when known) and tokens; draws a tqdm bar when `stream` is a
    terminal, else prints '<desc>: 12/40 responses, 1,234 tokens, 310 tokens/s' at most every
    `every` seconds and once at the end (unless the last line already had the final count). `enabled=False` prints nothing."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "it", *, enabled: bool = True,
                 stream: TextIO | None = None, every: float = LOG_EVERY_S):
        self.desc, self.total, self.unit, self.every = desc, total, unit, every
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.done = self.tokens = self.logged = 0  # logged: `done` when the last line was printed
        self.start = self.last_log = time.monotonic()
        self.bar = None
        if enabled and self.stream.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream)

    def update(self, n: int = 1, tokens: int | None = None) -> None:
        """`n` more units done; `tokens` processed with them (default: n, when the unit is a token)."""
        self.done += n
        self.tokens += n if tokens is None and self.unit == "token" else (tokens or 0)
        if self.bar is not None:
            self.bar.update(n)
            if self.unit != "token":
                self.bar.set_postfix_str(f"{self.rate():,.0f} tokens/s", refresh=False)
        elif self.enabled and time.monotonic() - self.last_log >= self.every:
            self._log()

    def rate(self) -> float:
        return self.tokens / max(time.monotonic() - self.start, 1e-9)

    def line(self) -> str:
        of = f"/{self.total:,}" if self.total is not None else ""
        tokens = "" if self.unit == "token" else f", {self.tokens:,} tokens"
        return (f"{self.desc}: {self.done:,}{of} {self.unit}s{tokens}, {self.rate():,.0f} tokens/s, "
                f"{time.monotonic() - self.start:.0f} s")

    def _log(self) -> None:
        print(self.line(), file=self.stream, flush=True)
        self.last_log, self.logged = time.monotonic(), self.done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.done != self.logged:  # the final count, unless the last line already said it
            self._log()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
