"""`tokencredit query --memory-limit` holds for allocations DuckDB's own limit does not cover (issue 39, item 6):
the process's address space is capped and a watchdog cancels the query, each refusal naming the limit it hit.
Every query here runs under a limit of 200 MB or less, so that none can eat the machine."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pytest

from tokencredit.pipeline.annotate import run_annotation
from tokencredit.pipeline.config import AnnotateConfig, SamplingConfig
from tokencredit.pipeline.dataset.memory_bound import MemoryBound

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory") / "run"
    run_annotation(AnnotateConfig(limit=2, tasks=("instructions",), sampling=SamplingConfig(n=2, max_new_tokens=8)),
                   str(out), progress=False)
    return out


def query(run: Path, sql: str, limit: str = "200MB") -> tuple[int, str, int]:
    """(exit status, stderr, peak resident memory in bytes) of `tokencredit query` in a process of its own."""
    process = subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", "query", str(run), sql,
                                "--memory-limit", limit], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    err = process.stderr.read().decode()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, err.strip(), usage.ru_maxrss * 1024


def test_a_string_built_in_one_vector_is_refused_within_the_limit(run):
    """Before: `repeat` reached 1.46 GB under --memory-limit 200MB and printed its result (exit 0). Its 300 MB strings
    each fit the address-space cap, so the watchdog cancels it; 100000000 repeats (a string past the cap) are refused
    the allocation."""
    status, _, idle = query(run, "SELECT 1")
    assert status == 0
    status, err, peak = query(run, "SELECT length(repeat(response_id, 30000000)) FROM responses")
    assert status == 2 and len(err.splitlines()) == 1, err
    assert "--memory-limit 200MB" in err and ("cancelled" in err or "address-space limit" in err)
    assert peak < idle + (200 << 20) + (64 << 20), (peak, idle)


def test_a_list_past_duckdbs_own_limit_and_a_string_past_the_address_cap_name_the_limit_hit(run):
    status, err, _ = query(run, "SELECT len(list(range(1000000000)))")
    assert status == 2 and len(err.splitlines()) == 1, err
    assert "DuckDB's memory limit (0.75 of --memory-limit 200MB)" in err
    status, err, _ = query(run, "SELECT length(repeat(response_id, 100000000)) FROM responses")
    assert status == 2 and len(err.splitlines()) == 1, err
    assert "--memory-limit 200MB" in err and "address-space limit" in err


def test_a_query_within_the_limit_still_spills_and_answers(run):
    status, err, _ = query(run, "SELECT count(*) FROM (SELECT md5(i::VARCHAR) AS m FROM range(2000000) t(i) ORDER BY m)",
                           limit="64MB")
    assert status == 0, err


def test_the_watchdog_cancels_a_query_while_the_process_is_past_the_limit():
    """Memory DuckDB does not count (here a thread of this process takes 150 MB) still counts against the bound:
    the query is cancelled and the refusal names the limit; the address-space cap is lifted after the query."""
    import resource

    con = duckdb.connect()
    before = resource.getrlimit(resource.RLIMIT_AS)
    hog = []
    deadline = threading.Timer(120, con.interrupt)  # a watchdog that never fires fails the test, not hangs it
    bound = MemoryBound(con, 50 << 20, "--memory-limit 50MB")
    with bound:
        assert resource.getrlimit(resource.RLIMIT_AS)[0] != before[0]
        deadline.start()
        threading.Thread(target=lambda: hog.append(b"\x01" * (150 << 20))).start()
        with pytest.raises(duckdb.InterruptException) as error:
            con.execute("SELECT count(*) FROM range(1000000000000) t(i) WHERE i % 7 = 3").fetchall()
    deadline.cancel()
    hog.clear()
    assert bound.cancelled
    assert "cancelled" in bound.refusal(error.value) and "--memory-limit 50MB" in bound.refusal(error.value)
    assert resource.getrlimit(resource.RLIMIT_AS) == before
