"""Readers see only complete runs and the manifest's files; a resume repairs what changed; one writer."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokencredit.pipeline.annotate import code_version
from tokencredit.flows.cli import main
from tokencredit.pipeline.dataset.query import run_query
from tokencredit.pipeline.dataset.writer import IncompleteRunError, RunLockedError, RunWriter
from tokencredit.schemas import CREDITS, RESPONSES
from tests.test_train import response_rows, tiny_policy
from tests.test_progress import without_phases

ROOT = Path(__file__).resolve().parent.parent


def shard(rows: list[dict], s: int) -> dict[str, pa.Table]:
    rows = [{**r, "response_id": f"s{s}-{r['response_id']}", "shard": s} for r in rows]
    return {"responses": pa.Table.from_pylist(rows, schema=RESPONSES), "credits": CREDITS.empty_table()}


@pytest.fixture()
def unfinished(tmp_path):
    """A run killed after 2 of its 3 shards, with shard 2's responses file written but not marked; sampled
    (its manifest says) with a word-level policy whose tokenizer gives its token ids."""
    out = tmp_path / "run"
    writer = RunWriter(str(out))
    writer.start("killed", {"seed": 1, "model": str(tiny_policy(tmp_path / "policy"))}, "h", "c", n_shards=3)
    rows = response_rows()
    for s in range(2):
        writer.write_shard(s, shard(rows, s), {})
    pq.write_table(shard(rows, 2)["responses"], out / "responses" / "part-00002.parquet")
    return out, len(rows)


@pytest.mark.parametrize("command", [
    ["query", "{out}", "SELECT count(*) FROM responses"],
    ["report", "{out}"],
    ["train", "--data", "{out}", "--out", "{tmp}/ckpt", "--steps", "1"],
    ["export", "{out}", "--format", "hf"],
])
def test_an_incomplete_run_is_refused(unfinished, tmp_path, capsys, command):
    out, _ = unfinished
    argv = [part.format(out=out, tmp=tmp_path) for part in command]
    assert main(argv) == 2
    err = "\n".join(without_phases(capsys.readouterr().err))
    assert len(err.splitlines()) == 1, err
    assert "not complete (2 of 3 shards written)" in err and "--allow-incomplete" in err
    assert not (tmp_path / "ckpt" / "final").exists() and not (out / "report.html").exists()



BAD_MANIFESTS = [("[]", "expected a JSON object, got list"),
                 ('{"complete": true}', "it says complete but lists no 'shards'"),
                 ('{"complete": true, "shards": {"0": {"shard": 0, "responses": {"path": 3}}}}',
                  "shard 0: 'responses' needs a path, a sha256 and a row count"),
                 ('{"config": []}', "'config' is not an object")]


@pytest.mark.parametrize("command", [
    ["query", "{out}", "SELECT 1"],
    ["report", "{out}"],
    ["train", "--data", "{out}", "--out", "{tmp}/ckpt", "--steps", "1"],
    ["export", "{out}", "--format", "hf"],
    ["export", "{out}", "--format", "verl"],
    ["annotate", "--out", "{out}", "--prompts", "demo", "--tasks", "tools", "--runner", "none"],
])
def test_a_manifest_of_another_shape_is_one_line_naming_it(tmp_path, capsys, command):
    out = tmp_path / "run"
    out.mkdir()
    for text, problem in BAD_MANIFESTS:
        (out / "manifest.json").write_text(text)
        assert main([part.format(out=out, tmp=tmp_path) for part in command]) == 2
        err = "\n".join(without_phases(capsys.readouterr().err))
        assert err == f"tokencredit {command[0]}: error: {out / 'manifest.json'}: {problem}; restore it or annotate " \
                      "again into a new --out"
        assert (out / "manifest.json").read_text() == text


def test_finishing_checks_checksums_and_a_resume_rewrites_the_changed_shard(tmp_path):
    """A part file changed between its shard's marker and the end of the run is named before DuckDB reads it."""
    from tokencredit.pipeline.annotate import finish_run

    writer = RunWriter(str(tmp_path / "run"))
    writer.start("r", {}, "h", "c", n_shards=2)
    rows = response_rows()
    for s in range(2):
        writer.write_shard(s, shard(rows, s), {})
    part = tmp_path / "run" / "responses" / "part-00001.parquet"
    good = part.read_bytes()
    part.write_bytes(good[: len(good) // 2])  # a cut-short copy, a disk error: no longer Parquet
    with pytest.raises(RuntimeError, match=r"the files of shards \[1\] differ from their checksums .* resume the run"):
        finish_run(writer, 2, [])
    assert not writer.manifest.get("complete")
    assert writer.resume_check(2) == [1] and not writer.is_complete(1)  # what a resume does first
    writer.write_shard(1, shard(rows, 1), {})
    manifest = finish_run(writer, 2, [])
    assert manifest["complete"] and part.read_bytes() == good
    assert run_query(tmp_path / "run", "SELECT count(*) FROM responses").fetchall() == [(2 * len(rows),)]

def test_allow_incomplete_reads_the_marked_shards_only(unfinished, tmp_path, capsys):
    out, per_shard = unfinished
    with pytest.raises(IncompleteRunError):
        run_query(out, "SELECT 1")
    assert run_query(out, "SELECT count(*) FROM responses", allow_incomplete=True).fetchall() == [(2 * per_shard,)]
    assert main(["train", "--data", str(out), "--out", str(tmp_path / "ckpt"), "--steps", "1", "--batch-size", "2",
                 "--allow-incomplete"]) == 0
    assert (tmp_path / "ckpt" / "final" / "model.safetensors").is_file()


def test_views_read_the_manifests_files_not_the_folder(tmp_path):
    out = tmp_path / "run"
    writer = RunWriter(str(out))
    writer.start("r", {}, "h", "c", n_shards=1)
    rows = response_rows()
    writer.write_shard(0, shard(rows, 0), {})
    writer.finish(1, {})
    # a stale temporary in the table folders is not read...
    (out / "credits" / ".part-00001.parquet.0123.tmp").write_bytes(b"half a file")
    assert run_query(out, "SELECT count(*) FROM responses").fetchall() == [(len(rows),)]
    # ...and a part file of a shard the manifest does not list is refused, not read or passed over in silence
    pq.write_table(shard(rows, 7)["responses"], out / "responses" / "part-00007.parquet")
    with pytest.raises(ValueError, match="responses/part-00007.parquet is a shard that manifest.json does not list"):
        run_query(out, "SELECT count(*) FROM responses")


def test_resume_deletes_temporaries_and_rewrites_changed_shards(tmp_path):
    """The resume after `query` could write (issue 13): it re-checks every part file."""
    out = tmp_path / "run"
    rows = response_rows()
    writer = RunWriter(str(out))
    writer.start("r", {}, "h", "c", n_shards=3)
    for s in range(3):
        writer.write_shard(s, shard(rows, s), {})
    first = writer.finish(3, {})
    # what `query` could do before it was read-only: empty one part file; and a crash's leftovers
    pq.write_table(RESPONSES.empty_table(), out / "responses" / "part-00001.parquet")
    (out / "credits" / ".part-00004.parquet.0123.tmp").write_bytes(b"half a file")
    with pytest.raises(duckdb.Error):  # the crash's leftovers break a plain glob...
        duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}/credits/*')").fetchall()

    resumed = RunWriter(str(out))
    resumed.lock()
    assert resumed.resume_check(3) == [1]
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    assert not (out / "_shards" / "shard-00001.json").exists()
    assert not list(out.rglob("*.tmp"))
    resumed.write_shard(1, shard(rows, 1), {})
    assert resumed.finish(3, {})["dataset_checksum"] == first["dataset_checksum"]
    resumed.unlock()
    # ...and after the resume every reader agrees
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}/credits/*')").fetchall() == [(0,)]
    assert run_query(out, "SELECT count(*) FROM responses").fetchall() == [(3 * len(rows),)]


def test_a_second_writer_is_refused_while_the_first_lives(tmp_path, capsys):
    out = tmp_path / "run"
    first = RunWriter(str(out))
    first.lock()
    with pytest.raises(RunLockedError, match=f"process {os.getpid()} on"):
        RunWriter(str(out)).lock()
    assert main(["annotate", "--out", str(out), "--limit", "1", "--n", "2", "--runner", "none"]) == 2
    err = "\n".join(without_phases(capsys.readouterr().err))
    assert len(err.splitlines()) == 1 and "is being written by process" in err
    first.unlock()
    RunWriter(str(out)).check_unlocked()


def test_the_lock_dies_with_its_process(tmp_path):
    out = tmp_path / "run"
    code = ("import sys, time; from tokencredit.pipeline.dataset.writer import RunWriter; w = RunWriter(sys.argv[1]); w.lock(); "
            "print('locked', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=f"process {holder.pid} "):
            RunWriter(str(out)).lock()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.time() + 10
    while True:  # the kernel drops the lock with the process
        try:
            RunWriter(str(out)).check_unlocked()
            break
        except RunLockedError:
            assert time.time() < deadline
            time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["none", "threads"])
def test_annotate_records_code_version_and_seed_and_repairs_a_changed_part_file(prefect_harness, tmp_path, capsys,
                                                                                 runner):
    out = tmp_path / "run"
    args = ["annotate", "--out", str(out), "--limit", "1", "--n", "2", "--max-new-tokens", "16", "--seed", "7",
            "--tasks", "sql,tools", "--shard-size", "1", "--runner", runner]
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seeds"] == {"sampling": 7} and manifest["complete"] and manifest["n_shards"] == 2
    assert [e["code_version"] for e in manifest["shards"].values()] == [code_version()] * 2
    part = out / "credits" / "part-00001.parquet"
    good = part.read_bytes()
    pq.write_table(CREDITS.empty_table(), part)  # a file that no longer holds its checksum
    capsys.readouterr()
    assert main(args) == 0
    if runner == "none":  # in a flow the line goes to Prefect's log
        assert "shards [1] differ from their checksums" in capsys.readouterr().err
    assert part.read_bytes() == good
    assert json.loads((out / "manifest.json").read_text())["dataset_checksum"] == manifest["dataset_checksum"]
