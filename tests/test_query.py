"""`tokencredit query` is read-only: hostile SQL neither writes into the run nor reaches outside it."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tokencredit.pipeline.dataset import analysis
from tokencredit.flows.cli import main
from tokencredit.pipeline.dataset.query import connect, run_query
from tokencredit.pipeline.dataset.stamps import STAMPS

ROOT = Path(__file__).resolve().parent.parent


def tree_digest(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones too) -> sha256 of its bytes, but the stamps a read writes once its
    parts are a few seconds old (`stamps`: that read's timing is not what these tests hold)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != STAMPS}


@pytest.fixture()
def run(tmp_path):
    (tmp_path / "secret.txt").write_text("outside the run\n")
    return analysis.synthetic_run(tmp_path / "run", responses=12, tokens=6, rewards=2, seed=3)


def hostile(run: Path) -> list[str]:
    part = run / "responses" / "part-00000.parquet"
    return [
        f"COPY (SELECT * FROM responses WHERE false) TO '{part}' (FORMAT parquet)",
        f"COPY (SELECT 1 AS x) TO '{run / 'manifest.json'}'",
        f"COPY responses TO '{run / 'copy.csv'}'",
        f"SELECT 1; COPY (SELECT 1) TO '{run / 'second.csv'}'",
        f"ATTACH '{run / 'attached.duckdb'}' AS other",
        f"EXPORT DATABASE '{run / 'exported'}'",
        "INSTALL httpfs",
        "LOAD httpfs",
        "CREATE TABLE t AS SELECT 1",
        "CREATE OR REPLACE VIEW responses AS SELECT 1 AS response_id",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        f"PRAGMA enable_profiling; SET profiling_output = '{run / 'profile.json'}'",
        "CALL pragma_version()",
    ]


@pytest.mark.parametrize("index", range(14))
def test_writing_statements_are_refused_and_the_run_is_unchanged(run, capsys, index):
    sql = hostile(run)[index]
    before = tree_digest(run.parent)
    assert main(["query", str(run), sql]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "only read statements" in err, err
    assert tree_digest(run.parent) == before
    # the run still reads as it was written
    assert run_query(run, "SELECT count(*) FROM responses").fetchall() == [(12,)]


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_text('{outside}')",
    "SELECT * FROM read_csv('{run}/../secret.txt')",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM read_parquet('/etc/hostname')",
])
def test_reads_outside_the_run_folder_are_refused(run, capsys, sql):
    sql = sql.format(outside=run.parent / "secret.txt", run=run)
    assert main(["query", str(run), sql]) == 2
    err = capsys.readouterr().err
    assert "disabled by configuration" in err and "outside the run" not in err


def test_read_statements_run(run, capsys):
    assert main(["query", str(run), "SELECT task, count(*) AS n FROM responses GROUP BY ALL ORDER BY ALL"]) == 0
    out = capsys.readouterr().out
    assert "instructions" in out and "sql" in out
    for sql in ("DESCRIBE credits", "SUMMARIZE SELECT adv_gdpo FROM responses", "SHOW TABLES",
                "WITH t AS (SELECT 1 AS x) SELECT x FROM t", "FROM training LIMIT 1",
                f"SELECT count(*) FROM glob('{run}/responses/*.parquet')"):
        assert run_query(run, sql).fetchall(), sql


def test_the_connection_is_locked_after_the_views_exist(run):
    con = connect(run)
    with pytest.raises(duckdb.Error, match="locked"):
        con.execute("SET enable_external_access = true")
    with pytest.raises(duckdb.Error, match="disabled"):
        con.execute(f"SELECT * FROM read_text('{run.parent / 'secret.txt'}')")



def _spill_folders(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("tokencredit-duckdb-*"))


def _spilling_query(run: Path, tmp: Path) -> tuple[subprocess.Popen, Path]:
    """A `tokencredit query` that spills (a sort past a 64 MB limit), once DuckDB has written into its folder."""
    sql = "SELECT count(*) FROM (SELECT md5(i::VARCHAR) AS m FROM range(50000000) t(i) ORDER BY m)"
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", "query", str(run), sql,
                                "--memory-limit", "64MB"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while not (mine := list(tmp.glob(f"tokencredit-duckdb-{process.pid}-*"))) or not any(mine[0].iterdir()):
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "the query never spilled"
            time.sleep(0.05)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, mine[0]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_signalled_query_leaves_no_spill_folder(run, tmp_path, signum):
    """SIGTERM: the query removes its folder and dies of the signal; SIGKILL: the next query removes it (its
    process is gone), but not the folder of a live process."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    live = tmp / f"tokencredit-duckdb-{os.getpid()}-live"
    live.mkdir()
    process, folder = _spilling_query(run, tmp)
    process.send_signal(signum)
    assert process.wait(timeout=60) == -signum
    if signum == signal.SIGKILL:
        assert folder.exists()
        subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", "query", str(run), "SELECT 1"], check=True,
                       env={**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}, capture_output=True)
    assert _spill_folders(tmp) == [live]


def test_a_pivot_without_an_in_list_runs_and_writes_nothing(run):
    """DuckDB makes it two statements (an ENUM of the values, then the select); COPY or CREATE around it stay out."""
    before = tree_digest(run.parent)
    assert run_query(run, "PIVOT responses ON task USING count(*)").columns[-3:] == ["instructions", "sql", "tools"]
    wide = run_query(run, "/* wide */ pivot (SELECT task FROM responses) ON task USING count(*)")
    assert wide.fetchall() == [(4, 4, 4)]
    for sql in [f"COPY (PIVOT responses ON task USING count(*)) TO '{run / 'p.csv'}'",
                "CREATE TABLE p AS PIVOT responses ON task USING count(*)",
                "SELECT * FROM (PIVOT responses ON task USING count(*))"]:
        with pytest.raises(ValueError, match="refused a MULTI statement .a PIVOT without an IN list runs only"):
            run_query(run, sql)
    assert tree_digest(run.parent) == before

def test_query_spills_into_a_temporary_folder_of_its_own_removed_after(run, tmp_path):
    """DuckDB's default is `.tmp` in the current folder and 80% of the machine's memory."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    work = tmp_path / "work"
    work.mkdir()
    sql = "SELECT current_setting('temp_directory') AS t, current_setting('memory_limit') AS m"
    done = subprocess.run([sys.executable, "-c", "from tokencredit.pipeline.dataset.query import run_query; import sys; print(*run_query("
                           "sys.argv[1], sys.argv[2], memory_limit='200MB').fetchall()[0], sep='|')", str(run), sql],
                          cwd=work, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                          check=True)
    temp, memory = done.stdout.strip().split("|")
    assert Path(temp).name.startswith("tokencredit-duckdb-") and not Path(temp).is_relative_to(work)
    assert memory.replace(" ", "") in ("190.7MiB", "200.0MB")  # DuckDB reports 200MB in MiB
    assert not Path(temp).exists() and list(work.iterdir()) == []
    assert main(["query", str(run), "SELECT 1", "--memory-limit", "50MB"]) == 0
    assert main(["query", str(run), "SELECT 1", "--memory-limit", "lots"]) == 2


def test_a_run_of_an_older_schema_reads_its_missing_columns_as_null(run):
    """A run written before `mc_sum` existed (schema 2.2) stays readable: the column reads as NULL."""
    import pyarrow.parquet as pq

    from tests.test_writer import rewrite_as_older_run

    for part in (run / "responses").glob("part-*.parquet"):
        rewrite_as_older_run(run, f"responses/{part.name}", pq.read_table(part).drop_columns(["mc_sum"]))
    con = connect(run)
    assert con.execute("SELECT count(*), count(mc_sum), count(gdpo_sum) FROM responses").fetchone() == (12, 0, 12)
    assert con.execute("SELECT count(*), count(adv_mc) FROM training").fetchone() == (12, 0)
    assert main(["query", str(run), "SELECT count(*) FROM responses WHERE mc_sum IS NULL"]) == 0


ENDLESS = "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) FROM t"


def test_an_endless_recursive_query_is_cancelled_at_its_time_limit(run):
    """It ran until killed; now --timeout ends it with one line naming the option (a subprocess: the old code never
    returns, and the test's own deadline then fails it)."""
    done = subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", "query", str(run), ENDLESS,
                           "--timeout", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    err = done.stderr.strip()
    assert len(err.splitlines()) == 1 and "--timeout 2 s" in err and "cancelled" in err, err


def test_the_time_limit_is_parsed_as_a_bounded_number_of_seconds(run, capsys):
    for bad in ("0", "-1", "inf", "nan", "1e300"):
        with pytest.raises(SystemExit) as exited:
            main(["query", str(run), "SELECT 1", "--timeout", bad])
        assert exited.value.code == 2 and "--timeout" in capsys.readouterr().err
