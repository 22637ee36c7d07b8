"""Every reader of a run checks what it reads (issue 49, item 3): a part file copied over another shard's, cut short
or appended to, and a manifest whose shard list does not match the shards on disk, are refused in one line by
query, export, train, report, values and repair, before anything is written; rerunning annotate repairs both. A
part verified once is stamped (`stamps`) and not read again until it changes: a change after a verified read is
refused all the same, and a run folder that cannot be written is checked in full."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tokencredit.flows.cli import main
from tokencredit.pipeline.dataset.query import connect, run_query
from tokencredit.pipeline.dataset.read_tables import tables_read
from tokencredit.pipeline.dataset.stamps import SETTLED_NS, STAMPS
from tokencredit.pipeline.dataset.writer import RunWriter

from tests.test_identity import FAST, title_record, write_prompts
from tests.test_progress import without_phases
from tests.test_writer import shard_tables

READERS = {
    "query": lambda run, out: ["query", str(run), "SELECT count(*) FROM responses"],
    "export": lambda run, out: ["export", str(run), "--format", "hf", "--dest", str(out)],
    "train": lambda run, out: ["train", "--data", str(run), "--out", str(out), "--steps", "1"],
    "report": lambda run, out: ["report", str(run), "--dest", str(out)],
    "values": lambda run, out: ["values", str(run), "--out", str(out)],
    "repair": lambda run, out: ["repair", str(run), "--out", str(out)],
}


EVERY_TABLE = "SELECT (SELECT count(*) FROM responses), (SELECT count(*) FROM credits), (SELECT count(*) FROM nodes)"


def three_shards(folder: Path) -> Path:
    """A complete run of 3 shards whose part files have one size (same rows, same lengths; other ids and stats)."""
    writer = RunWriter(str(folder))
    writer.start("run", {"seed": 0}, "h", "c")
    for shard in range(3):
        writer.write_shard(shard, shard_tables(shard), {})
    writer.finish(3, {"rejected": 0})
    return folder


def refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = without_phases(capsys.readouterr().err)  # a phase's announcement, then the one error line
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def edit_manifest(run: Path, change) -> None:
    manifest = json.loads((run / "manifest.json").read_text())
    change(manifest)
    (run / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("reader", READERS)
def test_a_part_copied_over_another_shards_is_refused_by_every_reader(tmp_path, capsys, reader):
    """The issue's case: same rows and here the same size too, so only the footer tells them apart; query read
    duplicate ids and train and export ran on them with exit 0."""
    run = three_shards(tmp_path / "run")
    part = run / "responses" / "part-00001.parquet"
    assert part.stat().st_size == (run / "responses" / "part-00000.parquet").stat().st_size
    shutil.copyfile(run / "responses" / "part-00000.parquet", part)
    err = refused(capsys, READERS[reader](run, tmp_path / "dest"))
    assert "responses/part-00001.parquet is not the file the run wrote: its Parquet footer differs" in err, err
    assert "rerun the annotate command that wrote it" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing written


@pytest.mark.parametrize("damage,problem", [
    (lambda data: data[:-100], "holds {} bytes where the run wrote {} (cut short or replaced?)"),
    (lambda data: data + b"more", "holds {} bytes where the run wrote {} (cut short or replaced?)"),
    (lambda data: b"", "holds {} bytes where the run wrote {} (cut short or replaced?)"),
])
def test_a_part_cut_short_or_appended_to_is_refused_naming_its_sizes(tmp_path, capsys, damage, problem):
    run = three_shards(tmp_path / "run")
    part = run / "credits" / "part-00002.parquet"
    size = part.stat().st_size
    part.write_bytes(damage(part.read_bytes()))
    err = refused(capsys, ["query", str(run), "SELECT count(*) FROM credits"])
    assert f"credits/part-00002.parquet {problem.format(part.stat().st_size, size)}" in err, err


def test_an_older_runs_parts_without_sizes_are_checked_by_their_sha256(tmp_path, capsys):
    """A run written before parts recorded their size and footer: its full sha256 is what it has."""
    run = three_shards(tmp_path / "run")

    def forget_sizes(manifest):
        for entry in manifest["shards"].values():
            for name in ("responses", "credits", "nodes"):
                del entry[name]["bytes"], entry[name]["footer_sha256"]

    edit_manifest(run, forget_sizes)
    assert run_query(run, "SELECT count(DISTINCT response_id) FROM responses").fetchall() == [(9,)]
    shutil.copyfile(run / "responses" / "part-00000.parquet", run / "responses" / "part-00001.parquet")
    err = refused(capsys, READERS["query"](run, None))
    assert "responses/part-00001.parquet differs from the sha256 the run recorded for it" in err, err


def drop_shard(manifest: dict, shard: int = 1) -> None:
    del manifest["shards"][str(shard)]


def drop_last_shard_and_count(manifest: dict) -> None:
    """What looks like a complete run of 2 shards."""
    drop_shard(manifest, 2)
    manifest["n_shards"] = 2


@pytest.mark.parametrize("change,problem,remove", [
    (drop_shard, "manifest.json lists no shard 1 of its 3 shards", ()),
    (drop_last_shard_and_count, "_shards/shard-00002.json is a shard that manifest.json does not list", ()),
    (drop_last_shard_and_count, "responses/part-00002.parquet is a shard that manifest.json does not list",
     ("_shards/shard-00002.json",)),
    (drop_last_shard_and_count, "manifest.json counts 9 responses rows but its shards hold 6",
     ("_shards/shard-00002.json", "responses/part-00002.parquet", "credits/part-00002.parquet",
      "nodes/part-00002.parquet")),
])
@pytest.mark.parametrize("reader", ["query", "train"])
def test_a_manifest_whose_shards_do_not_match_the_run_is_refused_naming_the_shard(tmp_path, capsys, change, problem,
                                                                                   remove, reader):
    """Before, every command read the shards the manifest still listed: 6 of 9 responses, silently."""
    run = three_shards(tmp_path / "run")
    edit_manifest(run, change)
    for relpath in remove:
        (run / relpath).unlink()
    err = refused(capsys, READERS[reader](run, tmp_path / "dest"))
    assert f"{run}: {problem}" in err and "; resume the run (rerun the annotate command" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_rerunning_annotate_repairs_a_copied_part_and_a_shard_dropped_from_the_manifest(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", [title_record(f"r{i}", f"Title {i}.") for i in range(2)])
    run = tmp_path / "run"
    annotate = ["annotate", "--out", str(run), "--prompts", str(prompts), "--shard-size", "1", *FAST]
    assert main(annotate) == 0
    ids = run_query(run, "SELECT response_id FROM responses ORDER BY ALL").fetchall()
    assert len(ids) == 4

    edit_manifest(run, drop_shard)
    capsys.readouterr()
    refused(capsys, READERS["query"](run, None))
    assert main(annotate) == 0
    assert run_query(run, "SELECT response_id FROM responses ORDER BY ALL").fetchall() == ids

    shutil.copyfile(run / "responses" / "part-00000.parquet", run / "responses" / "part-00001.parquet")
    capsys.readouterr()
    refused(capsys, READERS["query"](run, None))
    assert main(annotate) == 0
    assert run_query(run, "SELECT response_id FROM responses ORDER BY ALL").fetchall() == ids


def settled(run: Path) -> Path:
    """`run` once its newest part is old enough for a read to stamp it (`stamps.SETTLED_NS`, about 2 s)."""
    newest = max(p.stat().st_ctime_ns for p in run.glob("*/part-*.parquet"))
    deadline = time.monotonic() + 60
    while time.time_ns() <= newest + SETTLED_NS:
        assert time.monotonic() < deadline, "the clock does not move"
        time.sleep(0.1)
    return run


def copy_over_keeping_its_mtime(part: Path, other: Path) -> None:
    """`cp` over the part, then its mtime put back: the same inode, size and mtime; only the ctime moves."""
    before = part.stat()
    shutil.copyfile(other, part)
    os.utime(part, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (part.stat().st_ino, part.stat().st_size, part.stat().st_mtime_ns) == \
        (before.st_ino, before.st_size, before.st_mtime_ns)


def moved_over(part: Path, other: Path) -> None:
    shutil.copyfile(other, part.parent / "copy")
    os.replace(part.parent / "copy", part)


def cut_short(part: Path, other: Path) -> None:
    os.truncate(part, part.stat().st_size - 100)


def assert_stamped_then_refused(run, shards: int, damage, problem: str, capsys) -> None:
    """The stamps name every part of the first `shards` shards; shard 1's responses part, damaged after, is refused
    by the next query with `problem` (formatted with its size now and the size the run wrote)."""
    stamped = json.loads((run / STAMPS).read_text())["parts"]
    assert sorted(stamped) == sorted(f"{name}/part-{s:05d}.parquet" for s in range(shards)
                                     for name in ("responses", "credits", "nodes"))
    part = run / "responses" / "part-00001.parquet"
    size = part.stat().st_size
    damage(part, run / "responses" / "part-00000.parquet")
    err = refused(capsys, READERS["query"](run, None))
    assert f"responses/part-00001.parquet {problem.format(part.stat().st_size, size)}" in err, err


@pytest.mark.parametrize("damage,problem", [
    (copy_over_keeping_its_mtime, "is not the file the run wrote: its Parquet footer differs"),
    (moved_over, "is not the file the run wrote: its Parquet footer differs"),
    (cut_short, "holds {} bytes where the run wrote {}"),
])
def test_a_part_changed_after_a_verified_read_is_refused_by_the_next(tmp_path, capsys, damage, problem):
    """The first read verifies every part it reads (here every table's) and stamps it; the next skips the footers
    whose stamps hold, so a stamp that missed a change would let the copied part through."""
    run = settled(three_shards(tmp_path / "run"))
    assert run_query(run, EVERY_TABLE).fetchall()[0][0] == 9
    assert_stamped_then_refused(run, 3, damage, problem, capsys)


@pytest.mark.parametrize("damage,problem", [
    (copy_over_keeping_its_mtime, "is not the file the run wrote: its Parquet footer differs"),
    (cut_short, "holds {} bytes where the run wrote {}"),
])
def test_the_writer_stamps_the_settled_parts_it_checked_and_a_change_after_is_refused(tmp_path, capsys, damage,
                                                                                       problem):
    """`finish` hashes every part in full before it writes the manifest: it stamps those whose ctime is old enough
    (`stamps.SETTLED_NS`), so the first read after a write reads no footer but the newest parts'; a part it stamped
    and that changed after is refused by that read all the same, and a part written just before it is not stamped."""
    run = tmp_path / "run"
    writer = RunWriter(str(run))
    writer.start("run", {"seed": 0}, "h", "c")
    for shard in range(2):
        writer.write_shard(shard, shard_tables(shard), {})
    settled(run)
    writer.write_shard(2, shard_tables(2), {})
    writer.finish(3, {"rejected": 0})
    assert_stamped_then_refused(run, 2, damage, problem, capsys)


@pytest.mark.parametrize("change,problem", [
    (lambda run: edit_manifest(run, drop_shard), "manifest.json lists no shard 1 of its 3 shards"),
    (lambda run: shutil.copyfile(run / "credits" / "part-00002.parquet", run / "credits" / "part-00003.parquet"),
     "credits/part-00003.parquet is a shard that manifest.json does not list"),
    (lambda run: shutil.copyfile(run / "_shards" / "shard-00002.json", run / "_shards" / "shard-00007.json"),
     "_shards/shard-00007.json is a shard that manifest.json does not list"),
])
def test_a_shard_list_changed_after_a_verified_read_is_refused_by_the_next(tmp_path, capsys, change, problem):
    """A read that found the shard list whole stamps the manifest with each folder it listed (the markers' and
    those of the tables it reads); the next lists a folder only when it or the manifest moved."""
    run = settled(three_shards(tmp_path / "run"))
    assert run_query(run, "SELECT count(*) FROM credits").fetchall()[0][0] > 0
    checks = json.loads((run / STAMPS).read_text())["checks"]
    assert {name: [stamp[0] for stamp in stamps] for name, stamps in checks.items()} == \
        {"shard_list _shards": ["manifest.json", "_shards"], "shard_list credits": ["manifest.json", "credits"]}
    change(run)
    err = refused(capsys, ["query", str(run), "SELECT count(*) FROM credits"])
    assert f"{run}: {problem}" in err, err


def test_a_read_of_a_verified_run_writes_nothing(tmp_path):
    run = settled(three_shards(tmp_path / "run"))
    run_query(run, EVERY_TABLE).fetchall()
    before = {p: (p.stat().st_ino, p.stat().st_ctime_ns) for p in run.rglob("*")}
    assert run / STAMPS in before
    assert run_query(run, "SELECT count(*) FROM credits").fetchall() == [(sum(len(shard_tables(s)["credits"])
                                                                               for s in range(3)),)]
    assert {p: (p.stat().st_ino, p.stat().st_ctime_ns) for p in run.rglob("*")} == before


CLI = "import sys; from tokencredit.flows.cli import main; sys.exit(main(sys.argv[1:]))"


def read_only(run: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """The command line run with `run` mounted read-only for it alone (a mount namespace of its own: file modes
    do not stop root); skips the test where no mount namespace can be made."""
    script = 'mount --bind -o ro "$0" "$0" || exit 98; touch "$0/probe" 2>/dev/null && exit 99; exec "$@"'
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    done = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", script, str(run), sys.executable,
                           "-c", CLI, *argv], capture_output=True, text=True, timeout=300)
    if done.returncode == 98 or done.stderr.startswith("unshare:"):
        pytest.skip(f"no read-only mount here: {done.stderr.strip()}")
    assert done.returncode != 99, "the run folder was writable"
    return done


def test_a_read_only_run_folder_is_read_and_checked_in_full_each_time(tmp_path):
    run = settled(three_shards(tmp_path / "run"))
    for _ in range(2):
        done = read_only(run, ["query", str(run), "SELECT count(DISTINCT response_id) FROM responses"])
        assert done.returncode == 0 and "9" in done.stdout, done.stderr
        assert not (run / STAMPS).exists() and not list(run.glob(f"{STAMPS}*"))
    shutil.copyfile(run / "responses" / "part-00000.parquet", run / "responses" / "part-00001.parquet")
    done = read_only(run, ["query", str(run), "SELECT count(*) FROM responses"])
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "responses/part-00001.parquet is not the file the run wrote" in done.stderr


@pytest.mark.parametrize("damaged", ["credits/part-00000.parquet", "credits/part-00001.parquet",
                                     "nodes/part-00000.parquet"])
@pytest.mark.parametrize("sql", ["SELECT count(*) FROM responses", "SELECT count(*) FROM training",
                                 "WITH r AS (SELECT * FROM responses) SELECT count(*) FROM r",
                                 "SELECT count(*) FROM Responses WHERE response_id IN "
                                 "(SELECT response_id FROM main.training)"])
def test_a_query_neither_checks_nor_opens_the_parts_of_a_table_it_does_not_read(tmp_path, capsys, damaged, sql):
    """A query of `responses` (or of the view over it) is checked on responses' parts alone: a part of `credits`
    or `nodes` cut short does not stop it (a first part among them: the views of other tables do not open their
    files either), and it stamps only what it verified: the markers, responses' folder and parts."""
    run = settled(three_shards(tmp_path / "run"))
    cut_short(run / damaged, None)
    assert main(["query", str(run), sql]) == 0
    assert "9" in capsys.readouterr().out
    stamps = json.loads((run / STAMPS).read_text())
    assert sorted(stamps["parts"]) == [f"responses/part-{s:05d}.parquet" for s in range(3)]
    assert sorted(stamps["checks"]) == ["shard_list _shards", "shard_list responses"]


@pytest.mark.parametrize("sql", ["SELECT count(*) FROM credits", "SELECT count(*) FROM responses JOIN credits USING "
                                 "(response_id)", "WITH c AS (SELECT * FROM credits) SELECT count(*) FROM c",
                                 "SELECT (SELECT max(advantage) FROM credits) FROM responses",
                                 "SELECT count(*) FROM responses; SELECT count(*) FROM credits",
                                 "SUMMARIZE credits",
                                 "SELECT count(*) FROM credits PIVOT (count(*) FOR reward IN ('a'))"])
def test_a_query_that_reads_a_table_refuses_its_damaged_part(tmp_path, capsys, sql):
    """However the statement reaches `credits` (a join, a CTE, a subquery, a second statement, SUMMARIZE, PIVOT)."""
    run = settled(three_shards(tmp_path / "run"))
    run_query(run, EVERY_TABLE).fetchall()  # every part stamped: the damage must move its stamp
    copy_over_keeping_its_mtime(run / "credits" / "part-00001.parquet", run / "credits" / "part-00000.parquet")
    err = refused(capsys, ["query", str(run), sql])
    assert "credits/part-00001.parquet is not the file the run wrote: its Parquet footer differs" in err, err


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM read_parquet('{run}/responses/part-00000.parquet')",  # a table function may name any part
    "SELECT count(*) FROM '{run}/credits/part-00001.parquet'",  # a replacement scan reads the damaged part itself
    "SELECT count(*) FROM (WITH \"{run}/credits/part-00001.parquet\" AS (SELECT 1) SELECT 1), "
    "'{run}/credits/part-00001.parquet'",  # a CTE of that name out of scope does not excuse the file
    "FROM query('SELECT count(*) FROM responses')",  # SQL in a string
    "PIVOT responses ON task USING count(*)",  # DuckDB does not serialize it
    "SELECT count(*) FROM responses_files",  # not a view of the run
])
def test_a_query_whose_tables_cannot_be_told_checks_every_table(tmp_path, capsys, sql):
    run = three_shards(tmp_path / "run")
    shutil.copyfile(run / "credits" / "part-00000.parquet", run / "credits" / "part-00001.parquet")
    err = refused(capsys, ["query", str(run), sql.format(run=run)])
    assert "credits/part-00001.parquet is not the file the run wrote: its Parquet footer differs" in err, err


def test_the_views_of_the_tables_a_connection_was_not_checked_for_refuse_to_be_read(tmp_path):
    """What keeps a table `read_tables` missed from being read unchecked (or read as empty); a second read of it
    is refused too, by DuckDB (a RecordBatchReader is read once)."""
    run = three_shards(tmp_path / "run")
    for view, table in (("responses", "responses"), ("training", "responses"), ("nodes", "nodes")):
        con = connect(run, sql="SELECT count(*) FROM credits")
        assert con.sql("SELECT count(*) FROM credits").fetchall()[0][0] > 0
        with pytest.raises(duckdb.Error, match=f"read the run's {table} table, whose parts were not checked"):
            con.sql(f"SELECT count(*) FROM {view}").fetchall()
        with pytest.raises(duckdb.Error, match="already been consumed"):
            con.sql(f"SELECT count(*) FROM {view}").fetchall()


@pytest.mark.parametrize("sql,tables", [
    ("SELECT * FROM training", ("responses",)),  # the views' tables come from schemas/views.sql
    ("SELECT * FROM leaf_segments", ("responses", "nodes")),
    ("WITH credits AS (SELECT 1) SELECT * FROM credits", ("credits",)),  # a CTE named like a view counts as it
    ("DESCRIBE nodes", ("nodes",)),
    ("SELECT 1", ()),
    ("SELECT * FROM memory.main.credits", ("credits",)),
    ("SELECT * FROM system.main.credits", None),
    ("SELECT * FROM \"credits\"\"\"", None),
    ("SELEC 1", None),
])
def test_read_tables_tells_the_tables_a_statement_reads_or_none(sql, tables):
    assert tables_read(duckdb.connect(), sql) == tables
