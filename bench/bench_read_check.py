"""What the read check costs `query` on a 20M-credit-row run (issue 49, item 3): target under 5% of the query.

    python -m bench read_check [--quick] [-- [--rows N]]

Every reader opens a run through `writer.run_files`, whose `_check_run` refuses a manifest whose shard list does
not match the folders (one listing each) and a part file whose size or Parquet footer is not the one its shard
wrote; a query checks the tables it reads alone (`read_tables`, from DuckDB's parse of it), so each query's check
here is that parse and the check of its tables (each of the docs' queries reads one of the run's two). A local run's
parts are stat'ed, and only those whose stat stamp changed since a reader (or the writer, as it finished the run)
verified them are read; a folder is listed only when it or the manifest changed (`stamps`). The first read after
the run is written finds the writer's stamps: it lists the markers' folder and its tables', reads the footers of its
tables' parts written in the last 2 s before the writer's check (`stamps.SETTLED_NS`) and writes the stamps; every
later read stats the parts. The run is `analysis.synthetic_run` (RunWriter, about 192 credit rows a response: 96
tokens on average, 2 rewards) in two layouts: annotate's default shards (8 prompts x 4 responses, so thousands of parts) and
large shards (4096 responses). Each query of the docs is timed through `run_query(...).fetchall()` with the check
and with it switched off (`_check_run` and the stamps swapped for no-ops), and the check alone, in turns
(`interleaved_times`), the page cache warm for all, and in the same turns the first read's check (the writer's
stamps put back before each) and the check of a run without stamps (copied elsewhere, or written before writers
stamped: every footer read), once the run is 2 s old (as a command typed after annotate finds it). The figure is the
check's seconds over the query's without it; the difference of the two query timings is recorded beside it, and the
1-minute load average before and after each query's turns (the machine is shared). Results:
bench/results/read_check.json (a row per layout and query) and bench/RESULTS.md.

On the large-shard layout, the Figure 6 queries (`analysis.top_share`, `analysis.part_share`: seconds per query,
medians on one connection after a warm-up; `bench_analysis.py` timed them on a replicated shard up to commit 6bbde98).
Target: the top-3-share query under 10 s on 2 cores.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from common import Harness, interleaved_times
from registry import Target, benchmark

TARGET = 0.05  # the check's share of a query's time
TARGET_TOP_SHARE_S = 10.0
TOKENS, REWARDS = 96, 2  # annotate's default max_new_tokens (a response's mean length) and a task's rewards
CREDIT_ROWS_PER_RESPONSE = TOKENS * REWARDS
LAYOUTS = {"default shards (8 prompts x 4 responses)": 32, "large shards (4096 responses)": 4096}
QUERIES = {  # README.md and docs/credits.md
    "responses by task": "select task, count(*) as responses, avg(rewards[1]) as first_reward from responses "
                         "group by task",
    "credits by source": "select relevance_source, count(*) from credits group by all",
    "lowest advantages": "select reward, token_text, advantage from credits order by advantage limit 5",
}


@contextlib.contextmanager
def check_switched_off():
    """run_files without its shard-list and part checks, and connect without the parse that picks their tables
    (what every reader did before them)."""
    from tokencredit.pipeline.dataset import query, writer

    saved = writer._check_run, writer.PartStamps, query.tables_read
    writer._check_run, writer.PartStamps = (lambda *args: None), (lambda root: None)
    query.tables_read = lambda con, sql: None
    try:
        yield
    finally:
        writer._check_run, writer.PartStamps, query.tables_read = saved


def check_alone(run: str, files, sql: str) -> Callable[[], None]:
    """The check `run_query(run, sql)` makes, on `files` (run_files' result, its manifest read already): the tables
    `sql` reads, told from its parse on a connection (connect's is open already), then their check."""
    import duckdb

    from tokencredit.pipeline.dataset import writer
    from tokencredit.pipeline.dataset.read_tables import tables_read
    from tokencredit.pipeline.dataset.stamps import PartStamps

    con = duckdb.connect()
    entries = sorted(files.manifest["shards"].values(), key=lambda e: e["shard"])

    def check() -> None:
        tables = tables_read(con, sql)
        writer._check_run(files.fs, run, files.root, files.manifest, entries, PartStamps(files.root), tables)
    return check


def parts_of(manifest: dict) -> list[dict]:
    """Every part file entry ({path, bytes, ...}) of a manifest's shards."""
    return [part for entry in manifest["shards"].values() for part in entry.values()
            if isinstance(part, dict) and "path" in part]


def stamps_as_left(run: str) -> tuple[Callable[[], None], Callable[[], None], list[str]]:
    """(put back the stamps the run's writer left, remove every stamp, the parts the writer left unstamped: their
    paths). Call it right after the run is written: the first read then lists its folders, reads the footers of
    its tables' parts the writer left unstamped and writes the stamps; a read with none reads every footer."""
    from tokencredit.pipeline.dataset.stamps import STAMPS, PartStamps
    from tokencredit.pipeline.dataset.writer import run_files

    stamps = Path(run) / STAMPS
    written = stamps.read_bytes() if stamps.exists() else None  # none: the writer found no part settled

    def as_written() -> None:
        stamps.unlink(missing_ok=True)
        if written is not None:
            stamps.write_bytes(written)

    with check_switched_off():
        files = run_files(run)
    unstamped = [part["path"] for part, _ in PartStamps(files.root).unverified(parts_of(files.manifest))]
    return as_written, lambda: stamps.unlink(missing_ok=True), unstamped


def settle(run: str) -> None:
    """Wait until the newest file may be stamped (`stamps.SETTLED_NS`), then read once: every stamp recorded."""
    from tokencredit.pipeline.dataset.stamps import SETTLED_NS, PartStamps
    from tokencredit.pipeline.dataset.writer import MANIFEST, SHARDS, TABLES, run_files

    newest = max(p.stat().st_ctime_ns for p in Path(run).rglob("*"))
    time.sleep(max(0.0, (newest + SETTLED_NS - time.time_ns()) / 1e9 + 0.1))
    files = run_files(run)
    stamps = PartStamps(files.root)
    assert stamps.unverified(parts_of(files.manifest)) == [] and all(
        stamps.check_holds(f"shard_list {folder}", (MANIFEST, folder))[0] for folder in (SHARDS, *TABLES))


def build(folder: Path, responses: int, shard_responses: int) -> tuple[float, dict]:
    from tokencredit.pipeline.dataset.analysis import synthetic_run

    start = time.perf_counter()
    synthetic_run(folder, responses, TOKENS, REWARDS, shard_responses=shard_responses)
    manifest = json.loads((folder / "manifest.json").read_text())
    return time.perf_counter() - start, manifest


def measure(run: str, repeats: int) -> list[dict]:
    import duckdb

    from tokencredit.pipeline.dataset.query import run_query
    from tokencredit.pipeline.dataset.read_tables import tables_read
    from tokencredit.pipeline.dataset.writer import run_files

    def query(sql: str, checked: bool):
        def go():
            with contextlib.nullcontext() if checked else check_switched_off():
                return run_query(run, sql).fetchall()
        return go

    with check_switched_off():
        files = run_files(run)
    as_written, unstamped, left = stamps_as_left(run)
    settle(run)
    rows = []
    for name, sql in QUERIES.items():
        check = check_alone(run, files, sql)
        footers = sum(path.split("/")[0] in tables_read(duckdb.connect(), sql) for path in left)
        before = os.getloadavg()[0]
        times = interleaved_times({"with": query(sql, True), "without": query(sql, False), "check": check,
                                   "first": check, "unstamped": check}, repeats=repeats,
                                  setup={"first": as_written, "unstamped": unstamped})
        rows.append({"query": name, "sql": sql, "query_with_check_s": times["with"],
                     "query_without_check_s": times["without"], "check_s": times["check"],
                     "check_over_query": times["check"] / times["without"],
                     "difference_over_query": (times["with"] - times["without"]) / times["without"],
                     "first_read_check_s": times["first"],
                     "first_read_check_over_query": times["first"] / times["without"],
                     "first_read_footers": footers, "unstamped_read_check_s": times["unstamped"],
                     "unstamped_read_check_over_query": times["unstamped"] / times["without"],
                     "load_avg": [before, os.getloadavg()[0]]})
    return rows


def figure6_seconds(h: Harness, run: str) -> dict:
    """Median seconds of the Figure 6 queries on one connection to `run`, and DuckDB's threads."""
    from tokencredit.pipeline.dataset import analysis
    from tokencredit.pipeline.dataset.query import connect

    con = connect(run)
    seconds = {f"{name}_s": round(h.median_time(lambda fn=fn: fn(con), repeats=h.repeats)[0], 3)
               for name, fn in (("top_share", analysis.top_share), ("part_share", analysis.part_share))}
    return {**seconds, "duckdb_threads": con.execute("SELECT current_setting('threads')").fetchall()[0][0]}


@benchmark("read_check", measures="`run_files`' shard-list and part checks of the tables a query reads "
           "(`read_tables`, its parse included; size + stat stamp per part; footer sha256 of a part whose stamp "
           "changed) against the query they precede, on a synthetic run written through RunWriter: every read after "
           "the first, the first read after a write, a run without stamps; and the Figure 6 queries "
           "(`analysis.top_share`, `analysis.part_share`) on its large-shard layout.",
           results=("read_check.json",),
           targets=(Target("worst_check_over_query", "<", TARGET),
                    Target("worst_first_read_check_over_query", "<", TARGET),
                    Target("top_share_s", "<", TARGET_TOP_SHARE_S)))
def run(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench read_check --")
    parser.add_argument("--rows", type=int, default=None, help="credit rows of the run (default 20M; --quick 20k)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls a side (default 5; --quick 1)")
    args = parser.parse_args(h.argv)
    rows_wanted = args.rows or (20_000 if h.quick else 20_000_000)
    h.repeats = args.repeats or (1 if h.quick else 5)
    responses = -(-rows_wanted // CREDIT_ROWS_PER_RESPONSE // 32) * 32  # whole shards of the default layout
    results, figure6 = [], {}
    with tempfile.TemporaryDirectory(prefix="bench_read_check_", dir="/tmp") as tmp:
        for layout, shard_responses in LAYOUTS.items():
            run_dir = Path(tmp) / f"run-{shard_responses}"
            build_s, manifest = build(run_dir, responses, shard_responses)
            for row in measure(str(run_dir), h.repeats):  # the machine, date and mode are the runner's row's
                row.update({"layout": layout, "credit_rows": manifest["totals"]["credits"],
                            "responses": manifest["totals"]["responses"], "shards": len(manifest["shards"]),
                            "part_files": len(parts_of(manifest)), "build_s": build_s, "repeats": h.repeats})
                results.append(row)
            if shard_responses == max(LAYOUTS.values()):
                figure6 = figure6_seconds(h, str(run_dir))
            shutil.rmtree(run_dir)
    h.results("read_check.json").write_text(json.dumps(results, indent=1) + "\n")
    worst = {f"worst_{key}": round(max(r[key] for r in results), 4)
             for key in ("check_over_query", "first_read_check_over_query", "unstamped_read_check_over_query")}
    return {"credit_rows": results[0]["credit_rows"], **worst, **figure6}
