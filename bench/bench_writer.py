"""RunWriter.write_shard of a credits table vs raw `pyarrow.parquet.write_table` of the same Arrow data.

    python bench/bench_writer.py [--quick]

The credits table is one shard of `tokencredit.pipeline.dataset.analysis.synthetic_run`, read back into memory. Rows per
second: the writer (schema cast, hidden temporary file, rename, SHA-256, completion marker) against a
plain write_table; target >= 0.7x. Memory: peak extra RSS of writing 1 and 4 shards in a fresh
process each, against the shard's Arrow size; bounded by a shard means 4 shards peak like 1.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

from common import interleaved_times, mib, peak_extra_bytes, run_child, upsert_result, verdict

TARGET = 0.7


def child(source: str, out: str, shards: int) -> None:
    """Print the peak extra RSS of writing `shards` shards of the credits table in `source`."""
    from tokencredit.pipeline.dataset.writer import RunWriter

    table = pq.read_table(source)
    writer = RunWriter(out)

    def write_all() -> None:
        for s in range(shards):
            writer.write_shard(s, {"credits": table}, {"responses": 0})

    extra, _ = peak_extra_bytes(write_all)
    print(json.dumps({"extra": extra, "table": table.nbytes}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller shard, fewer repeats")
    parser.add_argument("--child", nargs=3, metavar=("SOURCE", "OUT", "SHARDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], int(args.child[2]))

    from tokencredit.pipeline.dataset.analysis import synthetic_run
    from tokencredit.pipeline.dataset.writer import RunWriter

    responses, tokens, rewards = (1024, 64, 3) if args.quick else (4096, 64, 3)
    repeats = 3 if args.quick else 5
    tmp = Path(tempfile.mkdtemp(prefix="bench_writer_", dir="/tmp"))
    try:
        synthetic_run(tmp / "source", responses, tokens, rewards, shard_responses=responses)
        source = str(tmp / "source" / "credits" / "part-00000.parquet")
        table = pq.read_table(source)
        sizes = (f"one shard: {table.num_rows} credit rows ({responses} responses x ~{tokens} tokens x "
                 f"{rewards} rewards), {mib(table.nbytes)} in Arrow; {repeats} reps, median")
        print(f"sizes: {sizes}")

        writer = RunWriter(str(tmp / "run"))
        (tmp / "raw").mkdir()
        times = interleaved_times({
            "writer": lambda: writer.write_shard(0, {"credits": table}, {"responses": responses}),
            "raw": lambda: pq.write_table(table, tmp / "raw" / "part-00000.parquet"),
        }, repeats=repeats)
        speed = {name: table.num_rows / t for name, t in times.items()}
        ratio = speed["writer"] / speed["raw"]
        print(f"write_shard {times['writer']:.3f} s ({speed['writer']:,.0f} rows/s), raw write_table "
              f"{times['raw']:.3f} s ({speed['raw']:,.0f} rows/s): {ratio:.2f}x (target >= {TARGET}x: "
              f"{verdict(ratio >= TARGET)})")

        peaks = {n: run_child(__file__, ["--child", source, str(tmp / f"mem{n}"), str(n)])["extra"] for n in (1, 4)}
        bounded = peaks[4] <= 1.25 * peaks[1] + 16 * 2**20
        print(f"peak extra RSS: 1 shard {mib(peaks[1])}, 4 shards {mib(peaks[4])} "
              f"({peaks[1] / table.nbytes:.2f}x the shard's Arrow size); bounded by a shard: {verdict(bounded)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    upsert_result(
        "Writer vs raw Parquet (bench_writer.py)",
        "`RunWriter.write_shard` of a credits shard vs `pyarrow.parquet.write_table` of the same table; "
        "peak extra RSS of writing 1 and 4 shards, each in a fresh process.",
        "quick" if args.quick else "full", sizes,
        f"writer {speed['writer']:,.0f} rows/s vs raw {speed['raw']:,.0f} rows/s = {ratio:.2f}x; peak extra "
        f"1 shard {mib(peaks[1])}, 4 shards {mib(peaks[4])} (shard {mib(table.nbytes)})",
        f">= {TARGET}x: {verdict(ratio >= TARGET)}; memory bounded by a shard: {verdict(bounded)}",
    )


if __name__ == "__main__":
    main()
