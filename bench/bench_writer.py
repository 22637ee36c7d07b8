"""RunWriter.write_shard of a credits table vs raw `pyarrow.parquet.write_table` of the same Arrow data.

    python -m bench writer [--quick]

The credits table is one shard of `tokencredit.pipeline.dataset.analysis.synthetic_run`, read back into memory. Rows per
second: the writer (schema cast, hidden temporary file, rename, SHA-256, completion marker) against a
plain write_table; target >= 0.7x. Memory: peak extra RSS of writing 1 and 4 shards in a fresh
process each, against the shard's Arrow size; bounded by a shard means 4 shards peak like 1.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

from common import Harness, peak_extra_bytes
from registry import Target, benchmark

TARGET = 0.7


def peak(source: str, out: str, shards: int) -> dict:
    """{extra: the peak extra RSS of writing `shards` shards of the credits table in `source`, table: its bytes}."""
    from tokencredit.pipeline.dataset.writer import RunWriter

    table = pq.read_table(source)
    writer = RunWriter(out)

    def write_all() -> None:
        for s in range(shards):
            writer.write_shard(s, {"credits": table}, {"responses": 0})

    extra, _ = peak_extra_bytes(write_all)
    return {"extra": extra, "table": table.nbytes}


@benchmark("writer", measures="`RunWriter.write_shard` of a credits shard against `pyarrow.parquet.write_table` of the "
           "same table (rows/s, interleaved); peak extra RSS of writing 1 and 4 shards, each in a fresh process.",
           targets=(Target("writer_over_raw", ">=", TARGET), Target("memory_bounded_by_a_shard", "==", True)))
def run(h: Harness) -> dict:
    from tokencredit.pipeline.dataset.analysis import synthetic_run
    from tokencredit.pipeline.dataset.writer import RunWriter

    responses, tokens, rewards = (256, 16, 3) if h.quick else (4096, 64, 3)
    h.repeats = 2 if h.quick else 5
    tmp = Path(tempfile.mkdtemp(prefix="bench_writer_", dir="/tmp"))
    try:
        synthetic_run(tmp / "source", responses, tokens, rewards, shard_responses=responses)
        source = str(tmp / "source" / "credits" / "part-00000.parquet")
        table = pq.read_table(source)
        writer = RunWriter(str(tmp / "run"))
        (tmp / "raw").mkdir()
        times = h.interleaved_times({
            "writer": lambda: writer.write_shard(0, {"credits": table}, {"responses": responses}),
            "raw": lambda: pq.write_table(table, tmp / "raw" / "part-00000.parquet"),
        }, repeats=h.repeats)
        # a full run measures each in a fresh process, whose allocator has kept nothing of earlier work
        peaks = {n: (peak(source, str(tmp / f"mem{n}"), n) if h.quick else
                     h.run_child(__file__, ["--child", source, str(tmp / f"mem{n}"), str(n)]))["extra"] for n in (1, 4)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    speed = {name: table.num_rows / t for name, t in times.items()}
    return {"credit_rows": table.num_rows, "shard_mib": round(table.nbytes / 2**20, 1),
            "writer_rows_per_s": round(speed["writer"]), "raw_rows_per_s": round(speed["raw"]),
            "writer_over_raw": round(speed["writer"] / speed["raw"], 3),
            "peak_extra_mib_1_shard": round(peaks[1] / 2**20, 1), "peak_extra_mib_4_shards": round(peaks[4] / 2**20, 1),
            "memory_bounded_by_a_shard": peaks[4] <= 1.25 * peaks[1] + 16 * 2**20}


if __name__ == "__main__":  # a child process of run(): --child SOURCE OUT SHARDS
    print(json.dumps(peak(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
