"""The Figure 6 queries (`analysis.TOP_SHARE_SQL`, `analysis.PART_SHARE_SQL`) over a 20-million-row credits table.

    python -m bench analysis [--quick]

The table: one `analysis.synthetic_run` shard (realistic distances, parts, gating) replicated by
DuckDB `COPY ... TO parquet` with a copy suffix on response_id until it holds >= 20M rows (--quick: a 256-response
shard, twice), under a temporary run directory in /tmp. Seconds per query are medians over repeats on one
connection after a warm-up. Target: the top-3-share query under 10 s on 2 cores.
"""
from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path

from common import Harness
from registry import Target, benchmark

TARGET_S = 10.0
BASE_RESPONSES, TOKENS, REWARDS = 4096, 64, 3


def build_run(out: Path, rows: int, base_responses: int = BASE_RESPONSES) -> int:
    """Write a run directory with >= `rows` credit rows under `out`; returns the exact count."""
    import duckdb
    import pyarrow.parquet as pq

    from tokencredit.pipeline.dataset.analysis import synthetic_run
    from tokencredit.pipeline.dataset.writer import RunWriter

    base = synthetic_run(out / "base", base_responses, TOKENS, REWARDS, shard_responses=base_responses)
    con = duckdb.connect()
    source = f"read_parquet('{base}/credits/part-*.parquet')"
    per_copy = con.execute(f"SELECT count(*) FROM {source}").fetchall()[0][0]
    copies = math.ceil(rows / per_copy)
    writer = RunWriter(str(out / "run"))  # a complete run: readers take its manifest's files
    writer.start("bench-analysis", {"rows": rows}, "bench-analysis", "bench", n_shards=copies)
    responses = pq.read_table(base / "responses")
    for c in range(copies):
        credits = con.execute(f"SELECT * REPLACE (response_id || '~{c}' AS response_id) FROM {source}").to_arrow_table()
        writer.write_shard(c, {"responses": responses if c == 0 else responses.schema.empty_table(),
                               "credits": credits}, {})
    return writer.finish(copies, {})["totals"]["credits"]


@benchmark("analysis", measures="`analysis.top_share` and `analysis.part_share` over a replicated `synthetic_run` "
           "credits table of 20M rows (Parquet in /tmp); seconds per query, median after a warm-up.",
           targets=(Target("top_share_s", "<", TARGET_S),))
def run(h: Harness) -> dict:
    from tokencredit.pipeline.dataset import analysis
    from tokencredit.pipeline.dataset.query import connect

    rows, base, h.repeats = (80_000, 256, 1) if h.quick else (20_000_000, BASE_RESPONSES, 3)
    tmp = Path(tempfile.mkdtemp(prefix="bench_analysis_", dir="/tmp"))
    try:
        n = build_run(tmp, rows, base)
        con = connect(tmp / "run")
        threads = con.execute("SELECT current_setting('threads')").fetchall()[0][0]
        seconds = {name: h.median_time(lambda fn=fn: fn(con), repeats=h.repeats)[0]
                   for name, fn in (("top_share", analysis.top_share), ("part_share", analysis.part_share))}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"credit_rows": n, "duckdb_threads": threads, "top_share_s": round(seconds["top_share"], 3),
            "part_share_s": round(seconds["part_share"], 3)}
