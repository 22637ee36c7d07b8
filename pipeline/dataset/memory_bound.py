"""A bound on the memory one DuckDB query takes in this process (`tokencredit query --memory-limit`).

DuckDB's own `memory_limit` covers its buffer-managed memory (what a sort or a join spills), not every allocation:
a list or a string built in one vector (`SELECT len(list(range(1000000000)))`, `repeat(x, 100000000)`) grew past
19 GB under a 1 GB limit. So, for a limit of L bytes:

- DuckDB is told DUCKDB_SHARE * L, so that what spills does so before the process reaches L;
- a watchdog thread reads the process's resident memory every POLL_S seconds and cancels the query through the
  connection's `interrupt` while it has grown past L + ALLOWANCE since the query started;
- the process's address space (RLIMIT_AS, soft) is capped at what it held when the query started plus
  ADDRESS_FACTOR * L + ADDRESS_SLACK, so that one allocation larger than that fails at once instead of being
  allocated between two reads of the watchdog. Address space runs ahead of resident memory (allocators reserve
  more than they touch: a 64 MB sort took 85 MB resident and 140 MB of address space), hence the factor.

The previous soft limit is put back when the query ends, so the bound is the query's, not the process's. The
watchdog and the cap need Linux (/proc/self/statm); elsewhere DuckDB's own limit alone holds.
`refusal` turns the error of a cancelled or refused allocation into one line naming the limit that was hit.
"""
from __future__ import annotations

import os
import resource
import threading

DUCKDB_SHARE = 0.75
ALLOWANCE = 64 << 20  # DuckDB's allocations beside its buffers: 20-30 MB past its limit at 64-192 MB
ADDRESS_FACTOR, ADDRESS_SLACK = 2, 512 << 20
POLL_S = 0.01
DEFAULT_SHARE = 0.8  # of the memory available when the query starts, without --memory-limit
_PAGE = os.sysconf("SC_PAGE_SIZE")


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo (4 GiB where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return 4 << 30


def default_limit() -> int:
    return int(DEFAULT_SHARE * available_bytes())


def _statm() -> tuple[int, int]:
    """(address space, resident memory) of this process, in bytes."""
    with open("/proc/self/statm") as f:
        size, resident = f.read().split()[:2]
    return int(size) * _PAGE, int(resident) * _PAGE


class MemoryBound:
    """`with MemoryBound(con, limit, name):` runs the block's queries on `con` under the bound of `limit` bytes
    (module docstring); `name` is how the refusal names the limit (the option and its value)."""

    def __init__(self, con, limit: int, name: str):
        self.con, self.limit, self.name = con, limit, name
        self.cancelled = False
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, daemon=True, name="query-memory-watchdog")

    def __enter__(self) -> MemoryBound:
        self._active = os.path.exists("/proc/self/statm")  # Linux; elsewhere DuckDB's own limit alone holds
        if not self._active:
            return self
        size, self._resident = _statm()
        self._previous = resource.getrlimit(resource.RLIMIT_AS)
        soft, hard = size + ADDRESS_FACTOR * self.limit + ADDRESS_SLACK, self._previous[1]
        self._watchdog.start()  # before the cap: a thread's stack is address space too
        resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
        return self

    def __exit__(self, *exc) -> None:
        if not self._active:
            return
        resource.setrlimit(resource.RLIMIT_AS, self._previous)
        self._stop.set()
        self._watchdog.join()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            if _statm()[1] - self._resident > self.limit + ALLOWANCE:
                self.cancelled = True
                self.con.interrupt()  # again at each read while over: an interrupt between two statements is lost

    def refusal(self, error: BaseException) -> str | None:
        """One line for an error this bound caused (None for any other error)."""
        import duckdb

        if self.cancelled and isinstance(error, duckdb.InterruptException):
            return (f"the query was cancelled: this process's memory grew past {self.name} (resident memory, read "
                    f"every {POLL_S * 1000:g} ms)")
        if isinstance(error, MemoryError) or (isinstance(error, duckdb.OutOfMemoryException)
                                              and "bad allocation" in str(error)):
            return (f"the query was refused an allocation past {self.name} (this process's address-space limit, "
                    f"{ADDRESS_FACTOR} x the limit + {ADDRESS_SLACK >> 20} MiB above what it held)")
        if isinstance(error, duckdb.OutOfMemoryException):
            return (f"the query needed more than DuckDB's memory limit ({DUCKDB_SHARE:g} of {self.name}) for what "
                    f"it cannot spill to disk")
        return None
