"""What the read check costs `query` on a 20M-credit-row run (issue 49, item 3): target under 5% of the query.

    python bench/bench_read_check.py [--quick] [--rows N]

Every reader opens a run through `writer.run_files`, which refuses a manifest whose shard list does not match the
folders (`_shard_list_problem`: folder listings) and a part file whose size or Parquet footer is not the one its
shard wrote (`_check_part`: a stat and two small reads per part). The run is `analysis.synthetic_run` (RunWriter,
about 192 credit rows a response: 96 tokens on average, 2 rewards) in two layouts: annotate's default shards
(8 prompts x 4 responses, so thousands of parts) and large shards (4096 responses). Each query of the docs is
timed through `run_query(...).fetchall()` with the check and with it switched off (the two functions swapped for
no-ops), in turns (`interleaved_times`), the page cache warm for both; the check alone is timed too. The figure is
the check's seconds over the query's without it; the difference of the two query timings is recorded beside it.
Results: bench/results/read_check.json (a row per layout and query) and bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import shutil
import tempfile
import time
from pathlib import Path

from common import ROOT, interleaved_times, machine, median_time, upsert_result, verdict

RESULTS_JSON = ROOT / "bench" / "results" / "read_check.json"
TARGET = 0.05  # the check's share of a query's time
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
    """run_files without its shard-list and part checks (what every reader did before them)."""
    from tokencredit.pipeline.dataset import writer

    saved = writer._shard_list_problem, writer._check_part
    writer._shard_list_problem, writer._check_part = (lambda *args: None), (lambda *args, **kwargs: None)
    try:
        yield
    finally:
        writer._shard_list_problem, writer._check_part = saved


def check_alone(run: str, files) -> None:
    """The checks run_files makes, on `files` (run_files' result, its manifest read already)."""
    from tokencredit.pipeline.dataset import writer

    assert writer._shard_list_problem(files.fs, files.root, files.manifest) is None
    for entry in files.manifest["shards"].values():
        for name in writer.TABLES:
            if name in entry:
                writer._check_part(files.fs, run, files.root, entry[name])


def build(folder: Path, responses: int, shard_responses: int) -> tuple[float, dict]:
    from tokencredit.pipeline.dataset.analysis import synthetic_run

    start = time.perf_counter()
    synthetic_run(folder, responses, TOKENS, REWARDS, shard_responses=shard_responses)
    manifest = json.loads((folder / "manifest.json").read_text())
    return time.perf_counter() - start, manifest


def measure(run: str, repeats: int) -> list[dict]:
    from tokencredit.pipeline.dataset.query import run_query
    from tokencredit.pipeline.dataset.writer import run_files

    def query(sql: str, checked: bool):
        def go():
            with contextlib.nullcontext() if checked else check_switched_off():
                return run_query(run, sql).fetchall()
        return go

    with check_switched_off():
        files = run_files(run)
    check_s, _ = median_time(lambda: check_alone(run, files), repeats=repeats)
    rows = []
    for name, sql in QUERIES.items():
        times = interleaved_times({"with": query(sql, True), "without": query(sql, False)}, repeats=repeats)
        rows.append({"query": name, "sql": sql, "query_with_check_s": times["with"],
                     "query_without_check_s": times["without"], "check_s": check_s,
                     "check_over_query": check_s / times["without"],
                     "difference_over_query": (times["with"] - times["without"]) / times["without"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2M credit rows instead of 20M, 3 repeats")
    parser.add_argument("--rows", type=int, default=None, help="credit rows of the run (default 20M; --quick 2M)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls a side (default 5; --quick 3)")
    args = parser.parse_args()
    rows_wanted = args.rows or (2_000_000 if args.quick else 20_000_000)
    repeats = args.repeats or (3 if args.quick else 5)
    responses = -(-rows_wanted // CREDIT_ROWS_PER_RESPONSE // 32) * 32  # whole shards of the default layout
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_read_check_", dir="/tmp") as tmp:
        for layout, shard_responses in LAYOUTS.items():
            run = Path(tmp) / f"run-{shard_responses}"
            build_s, manifest = build(run, responses, shard_responses)
            parts = sum(isinstance(part, dict) and "path" in part for entry in manifest["shards"].values()
                        for part in entry.values())
            print(f"{layout}: {manifest['totals']['credits']:,} credit rows, {len(manifest['shards'])} shards, "
                  f"{parts} part files, built in {build_s:.0f} s", flush=True)
            for row in measure(str(run), repeats):
                row.update({"layout": layout, "credit_rows": manifest["totals"]["credits"],
                            "responses": manifest["totals"]["responses"], "shards": len(manifest["shards"]),
                            "part_files": parts, "build_s": build_s, "repeats": repeats,
                            "mode": "quick" if args.quick else "full", "machine": machine(),
                            "date": datetime.date.today().isoformat()})
                print(f"  {row['query']}: query {row['query_without_check_s']:.3f} s without the check, "
                      f"{row['query_with_check_s']:.3f} s with; check alone {row['check_s']:.3f} s = "
                      f"{row['check_over_query']:.1%} of the query", flush=True)
                results.append(row)
            shutil.rmtree(run)
    RESULTS_JSON.write_text(json.dumps(results, indent=1) + "\n")
    worst = max(results, key=lambda r: r["check_over_query"])
    figures = "; ".join(f"{r['layout'].split(' (')[0]}, {r['query']}: {r['check_over_query']:.1%} "
                        f"({r['check_s']:.3f} s of {r['query_without_check_s']:.3f} s)" for r in results)
    upsert_result("Read check (query)",
                  "`run_files`' shard-list and part checks (size + footer sha256 per part) against the query they "
                  "precede, on a synthetic run written through RunWriter (`python bench/bench_read_check.py`).",
                  "quick" if args.quick else "full",
                  f"{results[0]['credit_rows']:,} credit rows; {results[0]['part_files']} / {results[-1]['part_files']}"
                  f" part files", figures,
                  f"check < {TARGET:.0%} of the query: {verdict(worst['check_over_query'] < TARGET)} "
                  f"(worst {worst['check_over_query']:.1%})")


if __name__ == "__main__":
    main()
