"""A bound on the time one DuckDB query takes (`tokencredit query --timeout`): DuckDB has none of its own, and a
recursive CTE without an end (`WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) ...`) ran until
the process was killed.

A watchdog thread waits out the limit, then cancels the query through the connection's `interrupt`, again every
POLL_S seconds until the block ends (an interrupt that lands between two statements is lost).
`refusal` turns the error of a cancelled query into one line naming the limit.
"""
from __future__ import annotations

import threading

POLL_S = 0.05


class TimeBound:
    """`with TimeBound(con, seconds, name):` cancels the block's queries on `con` once it has run `seconds`;
    `name` is how the refusal names the limit (the option and its value)."""

    def __init__(self, con, seconds: float, name: str):
        self.con, self.seconds, self.name = con, seconds, name
        self.expired = False
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, daemon=True, name="query-time-watchdog")

    def __enter__(self) -> TimeBound:
        self._watchdog.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._watchdog.join()

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S if self.expired else self.seconds):
            self.expired = True
            self.con.interrupt()

    def refusal(self, error: BaseException) -> str | None:
        """One line for an error this bound caused (None for any other error)."""
        import duckdb

        if self.expired and isinstance(error, duckdb.InterruptException):
            return f"the query was cancelled at {self.name} (its time limit); pass a larger --timeout to let it run"
        return None
