"""The run writer: atomic shards, completion markers, manifest, schema version, config guard."""
from __future__ import annotations

import json

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tokencredit.pipeline.dataset.query import run_query
from tokencredit.pipeline.dataset.writer import RunWriter
from tokencredit.schemas import CREDITS, NODES, RESPONSES, SCHEMA_VERSION, TABLES, views_sql


def shard_tables(shard: int, responses: int = 3, tokens: int = 4) -> dict[str, pa.Table]:
    ids = [f"s{shard}-r{i}" for i in range(responses)]
    resp = pa.Table.from_pylist([{
        "response_id": rid, "group_id": f"g{shard}", "shard": shard, "task": "sql", "prompt": "p",
        "response": "<sql>x</sql>", "prompt_token_ids": [1, 2], "token_ids": list(range(tokens)),
        "sample_logprobs": [-1.0] * tokens, "reward_names": ["format"], "rewards": [1.0], "feedback": ["ok"],
        "reward_advs": [0.5], "adv_grpo": 0.1, "gdpo_sum": 0.2, "mrtpo_sum": [0.3] * tokens, "status": "ok",
        "model": "m", "seed": 0} for rid in ids], schema=RESPONSES)
    cred = pa.Table.from_pylist([{
        "response_id": rid, "task": "sql", "position": t, "token_id": t, "token_text": "x", "char_start": t,
        "char_end": t + 1, "part": "query", "reward": "format", "reward_adv": 0.5, "distance": 0.1 * t,
        "weight": 1.0, "advantage": 0.5, "beta": 0.5} for rid in ids for t in range(tokens)], schema=CREDITS)
    return {"responses": resp, "credits": cred, "nodes": NODES.empty_table()}  # flat samples: no tree nodes


def rewrite_as_older_run(run, relpath: str, table: pa.Table) -> None:
    """Write `table` as the run's part file `relpath`, recorded as a writer from before parts recorded their size and
    footer did (path, rows, sha256), in the manifest and the shard's marker: what a run of an older schema holds."""
    import hashlib

    pq.write_table(table, run / relpath)
    part = {"path": relpath, "rows": table.num_rows, "sha256": hashlib.sha256((run / relpath).read_bytes()).hexdigest()}
    manifest = json.loads((run / "manifest.json").read_text())
    for entry in manifest["shards"].values():
        for name in TABLES:
            if entry.get(name, {}).get("path") == relpath:
                entry[name] = part
                marker = run / "_shards" / f"shard-{entry['shard']:05d}.json"
                marker.write_text(json.dumps(entry))
    (run / "manifest.json").write_text(json.dumps(manifest))


def test_shards_are_marked_complete_and_the_manifest_adds_up(tmp_path):
    writer = RunWriter(str(tmp_path))
    writer.start("run", {"seed": 3}, "hash-a", "code")
    assert not writer.is_complete(0)
    for shard in range(3):
        writer.write_shard(shard, shard_tables(shard), {"replays_done": 2, "seconds": {"sample": 1.25}})
    assert all(writer.is_complete(s) for s in range(3))
    manifest = writer.finish(3, {"rejected": 0})
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk["totals"] == manifest["totals"] == {"responses": 9, "credits": 36, "nodes": 0}
    # counts and each stage's seconds are summed over the shards; the writer adds the seconds its tables took
    writes = [writer.shard_entry(s)["stats"]["seconds"]["write"] for s in range(3)]
    assert all(w > 0 for w in writes)
    assert on_disk["stats"] == {"replays_done": 6, "seconds": {"sample": 3.75, "write": pytest.approx(sum(writes))}}
    assert on_disk["seeds"] == {"sampling": 3}
    assert len(on_disk["dataset_checksum"]) == 64
    assert not list(tmp_path.rglob("*.tmp")), "temporary files must be renamed into place"


def test_schema_version_is_in_the_parquet_metadata(tmp_path):
    writer = RunWriter(str(tmp_path))
    writer.start("run", {}, "h", "c")
    writer.write_shard(0, shard_tables(0), {})
    metadata = pq.read_schema(tmp_path / "credits/part-00000.parquet").metadata
    assert metadata[b"tokencredit.schema_version"] == SCHEMA_VERSION.encode()
    assert metadata[b"tokencredit.table"] == b"credits"


def test_finish_refuses_an_incomplete_run(tmp_path):
    writer = RunWriter(str(tmp_path))
    writer.start("run", {}, "h", "c")
    writer.write_shard(0, shard_tables(0), {})
    writer.write_shard(2, shard_tables(2), {})
    with pytest.raises(RuntimeError, match=r"shards \[1\]"):
        writer.finish(3, {})


def test_unmarked_shard_files_are_rewritten_not_duplicated(tmp_path):
    writer = RunWriter(str(tmp_path))
    writer.start("run", {}, "h", "c")
    # a crash after the table files but before the marker: the shard is not complete...
    pq.write_table(shard_tables(0)["responses"], tmp_path / "responses/part-00000.parquet")
    (tmp_path / "responses/.part-00001.parquet.deadbeef.tmp").write_bytes(b"half a file")
    assert not writer.is_complete(0)
    # ...and its rewrite replaces the file rather than adding rows
    writer.write_shard(0, shard_tables(0), {})
    manifest = writer.finish(1, {})
    assert ds.dataset(tmp_path / "responses", format="parquet").count_rows() == manifest["totals"]["responses"] == 3


def test_a_directory_holds_one_config(tmp_path):
    RunWriter(str(tmp_path)).start("run", {"seed": 0}, "hash-a", "c")
    RunWriter(str(tmp_path)).start("run", {"seed": 0}, "hash-a", "c")
    with pytest.raises(ValueError, match="another config"):
        RunWriter(str(tmp_path)).start("run", {"seed": 1}, "hash-b", "c")


def test_views_and_readers_see_the_same_rows(tmp_path):
    writer = RunWriter(str(tmp_path))
    writer.start("run", {"credit": {"gdpo": {"batch": "none"}}}, "h", "c")  # views: c = 1, m = 0
    for shard in range(2):
        writer.write_shard(shard, shard_tables(shard), {})
    writer.finish(2, {})
    con = duckdb.connect()
    con.execute(views_sql({name: f"read_parquet('{tmp_path}/{name}/part-*.parquet')" for name in TABLES},
                          {"batch": "none"}))
    assert con.execute("select count(*) from credits").fetchall() == [(2 * 3 * 4,)]
    training = run_query(tmp_path, "select token_ids, adv_gdpo, adv_mrtpo, sft_weight from training").fetchall()
    assert len(training) == 6
    for token_ids, adv_gdpo, adv_mrtpo, sft_weight in training:
        assert len(adv_gdpo) == len(adv_mrtpo) == len(sft_weight) == len(token_ids)
        assert sft_weight == pytest.approx([0.3] * 4)
    from datasets import load_dataset

    hf = load_dataset("parquet", data_files=str(tmp_path / "responses/part-*.parquet"), split="train")
    assert hf.num_rows == 6 and set(hf.column_names) >= {"response_id", "token_ids", "gdpo_sum"}


def test_finishing_a_run_removes_what_a_killed_writer_left(tmp_path):
    """A Dask worker killed inside pq.write_table leaves its hidden temporary file; the shard is
    written again by another worker, and finishing the run deletes the leftover."""
    writer = RunWriter(str(tmp_path))
    writer.start("run", {}, "h", "c")
    writer.write_shard(0, shard_tables(0), {})
    leftover = tmp_path / "responses" / ".part-00001.parquet.0123abcd.tmp"
    pq.write_table(shard_tables(1)["responses"].slice(0, 1), leftover)  # half a shard, as the killed writer had it
    writer.write_shard(1, shard_tables(1), {})
    writer.finish(2, {})
    assert not leftover.exists() and not list(tmp_path.rglob("*.tmp"))
    assert run_query(tmp_path, "SELECT count(*) FROM responses").fetchall() == [(6,)]


def test_a_truncated_manifest_is_an_error_naming_the_file(tmp_path, capsys):
    from tokencredit.flows.cli import main

    writer = RunWriter(str(tmp_path))
    writer.start("run", {}, "h", "c")
    writer.write_shard(0, shard_tables(0), {})
    writer.finish(1, {})
    manifest = tmp_path / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])
    assert main(["query", str(tmp_path), "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tokencredit query: error: {manifest} is not valid JSON (") and err.count("\n") == 1
