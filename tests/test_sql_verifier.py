"""Text-to-SQL verifier on a real SQLite file: rewards, result comparison, and hostile queries."""
import hashlib
import sqlite3
import time
from pathlib import Path

import pytest

from tokencredit.schemas.records import RecordError, SqlSpec, TaskRecord
from tokencredit.verifiers import sandbox, sql
from tokencredit.verifiers.tasks import load_tasks

SINGERS = [(1, "Ann", 30, 1.5), (2, "Bob", 25, None), (3, "Cid", 30, 2.25), (4, "Dee", 41, 0.5)]


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("db") / "concerts.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, age INTEGER, rating REAL)")
    conn.executemany("INSERT INTO singer VALUES (?, ?, ?, ?)", SINGERS)
    conn.commit()
    conn.close()
    return path


def task(db: Path, reference_sql: str, record_id: str = "q1") -> TaskRecord:
    return TaskRecord(record_id, "sql", "Question?", f"<sql>{reference_sql}</sql>", SqlSpec(str(db), reference_sql))


def scores(db: Path, reference_sql: str, response: str) -> list[float]:
    return [s.score for s in sql.verify(task(db, reference_sql), response)]


def feedback(db: Path, reference_sql: str, response: str) -> dict[str, str]:
    """Reward name -> what was expected and what was found (the `expected+observed` style)."""
    return {s.name: f"{s.feedback} {s.observed}" for s in sql.verify(task(db, reference_sql), response)}


OVER_25 = "SELECT name FROM singer WHERE age > 25"


def test_reward_names_and_a_correct_response(db):
    record = task(db, OVER_25)
    assert sql.reward_names(record) == ["format", "executable", "execution"]
    result = sql.verify(record, f"Here it is: <sql>{OVER_25}</sql>")
    assert [s.name for s in result] == sql.reward_names(record)
    assert [s.score for s in result] == [1.0, 1.0, 1.0]
    assert [(s.feedback, s.observed) for s in result] == [
        ("The query must be a single SQL statement between <sql> and </sql>.", "Found one <sql> block."),
        ("The query must run on the database without error.", "The query ran without error."),
        (f"The reference query is: {OVER_25}.", "The result matches the reference.")]


@pytest.mark.parametrize("response, found", [
    (OVER_25, "Found no <sql> block."),
    (f"<sql>{OVER_25}</sql> or <sql>SELECT 1</sql>", "Found 2 <sql> blocks."),
    (f"<sql>{OVER_25}", "Found <sql> without a closing </sql>."),
    (f"{OVER_25}</sql>", "Found </sql> without an opening <sql>."),
    (f"</sql>{OVER_25}<sql>", "Found </sql> before <sql>."),
    ("<sql>  \n </sql>", "Found an empty <sql> block."),
])
def test_bad_format_fails_all_three_and_says_what_was_found(db, response, found):
    assert scores(db, OVER_25, response) == [0.0, 0.0, 0.0]
    texts = feedback(db, OVER_25, response)
    assert texts["format"].endswith(found)
    assert texts["execution"].startswith(f"The reference query is: {OVER_25}.")


def test_right_format_that_does_not_run(db):
    assert scores(db, OVER_25, "<sql>SELECT nme FROM singer</sql>") == [1.0, 0.0, 0.0]
    assert "no such column: nme" in feedback(db, OVER_25, "<sql>SELECT nme FROM singer</sql>")["executable"]


@pytest.mark.parametrize("query, fix", [
    ("SELECT nme FROM singer", "Use an existing column: name."),
    ("SELECT s.agee FROM singer s", "Use an existing column: age."),
    ("SELECT name FROM singers", "Use an existing table: singer."),
    ("SELECT name FROM singer WHERE", None),
])
def test_expected_feedback_names_the_fix_and_never_quotes_the_response(db, query, fix):
    """The `feedback` of a failed query states what would run (the closest existing name), not the
    error message, which quotes the response's own wrong name."""
    executable = sql.verify(task(db, OVER_25), f"<sql>{query}</sql>")[1]
    assert executable.score == 0.0 and executable.observed.startswith("The query failed:")
    assert executable.feedback == sql.EXECUTABLE_RULE + (f" {fix}" if fix else "")
    for word in ("nme", "agee", "singers"):
        assert word not in executable.feedback


def test_runs_but_wrong_result_notes_the_mismatch(db):
    at_least = "<sql>SELECT name FROM singer WHERE age >= 25</sql>"
    assert scores(db, OVER_25, at_least) == [1.0, 1.0, 0.0]
    assert feedback(db, OVER_25, at_least)["execution"].endswith("The result has 4 rows, expected 3.")
    two_cols = "<sql>SELECT name, age FROM singer WHERE age > 25</sql>"
    assert feedback(db, OVER_25, two_cols)["execution"].endswith("The result has 2 columns, expected 1.")
    wrong_values = "<sql>SELECT name FROM singer WHERE age < 41</sql>"
    assert scores(db, OVER_25, wrong_values) == [1.0, 1.0, 0.0]
    assert "differs: it has row ('Bob',) where the reference has ('Cid',)" in feedback(db, OVER_25, wrong_values)["execution"]


def test_row_order_matters_only_under_a_top_level_order_by(db):
    shuffled = "<sql>SELECT name FROM singer WHERE age > 25 ORDER BY name DESC</sql>"
    assert scores(db, OVER_25, shuffled) == [1.0, 1.0, 1.0]
    ordered_ref = "SELECT name FROM singer ORDER BY age DESC, name"
    assert scores(db, ordered_ref, "<sql>SELECT name FROM singer ORDER BY age DESC, id</sql>") == [1.0, 1.0, 1.0]
    reversed_rows = "<sql>SELECT name FROM singer ORDER BY age ASC, name</sql>"
    assert scores(db, ordered_ref, reversed_rows) == [1.0, 1.0, 0.0]
    assert feedback(db, ordered_ref, reversed_rows)["execution"].endswith("The result has the right rows in the wrong order.")
    # An ORDER BY inside a subquery does not make the outer result ordered.
    sub_ref = "SELECT name FROM (SELECT name FROM singer ORDER BY age)"
    assert scores(db, sub_ref, "<sql>SELECT name FROM singer ORDER BY name DESC</sql>") == [1.0, 1.0, 1.0]


def test_rows_compare_as_a_multiset(db):
    ages = "SELECT age FROM singer"  # 30, 25, 30, 41: 30 twice
    assert scores(db, ages, "<sql>SELECT age FROM singer WHERE age <> 25 UNION ALL SELECT 25</sql>") == [1, 1, 1]
    assert scores(db, ages, "<sql>SELECT DISTINCT age FROM singer</sql>") == [1, 1, 0]
    same_size_other_counts = "<sql>SELECT CASE WHEN id = 3 THEN 25 ELSE age END FROM singer</sql>"
    assert scores(db, ages, same_size_other_counts) == [1, 1, 0]


def test_values_compare_with_type_care_and_float_tolerance(db):
    assert scores(db, "SELECT AVG(age) FROM singer", "<sql>SELECT SUM(age) / 4.0 FROM singer</sql>") == [1, 1, 1]
    assert scores(db, "SELECT AVG(age) FROM singer", "<sql>SELECT 31.50000001</sql>") == [1, 1, 1]
    assert scores(db, "SELECT AVG(age) FROM singer", "<sql>SELECT 31.51</sql>") == [1, 1, 0]
    assert scores(db, "SELECT COUNT(*) FROM singer", "<sql>SELECT 4.0</sql>") == [1, 1, 1]
    assert scores(db, "SELECT COUNT(*) FROM singer", "<sql>SELECT '4'</sql>") == [1, 1, 0]
    assert scores(db, "SELECT rating FROM singer", "<sql>SELECT COALESCE(rating, 0) FROM singer</sql>") == [1, 1, 0]
    assert scores(db, "SELECT rating FROM singer", "<sql>SELECT rating FROM singer ORDER BY rating</sql>") == [1, 1, 1]


def test_top_level_order_by_detection():
    assert sandbox.has_top_level_order_by("SELECT a FROM t ORDER BY a")
    assert sandbox.has_top_level_order_by("WITH x AS (SELECT 1 AS a) SELECT a FROM x UNION SELECT 2 order  by 1")
    assert not sandbox.has_top_level_order_by("SELECT a FROM (SELECT a FROM t ORDER BY a)")
    assert not sandbox.has_top_level_order_by("SELECT ROW_NUMBER() OVER (ORDER BY a) FROM t")
    assert not sandbox.has_top_level_order_by("SELECT 'ORDER BY' FROM t -- ORDER BY a")
    assert not sandbox.has_top_level_order_by('SELECT "order" FROM t /* order by */ WHERE b = 1')


def test_a_reference_query_that_fails_is_a_record_error(db):
    with pytest.raises(RecordError) as err:
        sql.verify(task(db, "SELECT missing FROM singer", record_id="broken-7"), "<sql>SELECT 1</sql>")
    assert (err.value.record_id, err.value.field) == ("broken-7", "reference_sql")


def test_response_parts_label_tags_query_and_the_rest(db):
    text = "Sure: <sql>SELECT 1</sql> done"
    assert sql.response_parts(task(db, OVER_25), text) == [
        (0, 6, "other"), (6, 11, "tags"), (11, 19, "query"), (19, 25, "tags"), (25, 30, "other")]
    assert sql.response_parts(task(db, OVER_25), "no tags") == [(0, 7, "other")]
    assert sql.response_parts(task(db, OVER_25), "") == []


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hostile_queries(tmp: Path) -> list[tuple[str, str]]:
    """(query, words the executable feedback must contain)."""
    start = "must start with SELECT or WITH"
    return [
        (f"ATTACH DATABASE '{tmp}/evil.db' AS evil", start),
        ("PRAGMA writable_schema = 1", start),
        ("PRAGMA journal_mode = WAL", start),
        ("SELECT * FROM pragma_table_info('singer')", "changing the schema is not allowed"),
        ("INSERT INTO singer VALUES (9, 'Eve', 20, 1.0)", start),
        ("UPDATE singer SET age = 0", start),
        ("DELETE FROM singer", start),
        ("DROP TABLE singer", start),
        ("CREATE TABLE evil (x)", start),
        ("WITH x AS (SELECT 1) INSERT INTO singer SELECT 9, 'Eve', 20, 1.0 FROM x", "INSERT on table singer is not allowed"),
        ("WITH x AS (SELECT 1) UPDATE singer SET age = 0", "UPDATE on table singer is not allowed"),
        ("WITH x AS (SELECT 1) DELETE FROM singer", "DELETE on table singer is not allowed"),
        ("SELECT load_extension('/tmp/evil.so')", "load_extension() is not allowed"),
        ("SELECT 1; DROP TABLE singer", "only one SQL statement"),
        (f"VACUUM INTO '{tmp}/copy.db'", start),
        ("SELECT readfile('/etc/passwd')", "readfile"),
        (f"SELECT writefile('{tmp}/evil.txt', 'x')", "writefile"),
        ("BEGIN IMMEDIATE", start),
        ("SELECT * FROM singer a, singer b, singer c, singer d, singer e, singer f, singer g", "more than 10000 rows"),
        ("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT x FROM r", "more than 10000 rows"),
        ("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 100) SELECT zeroblob(90000) FROM r",
         "larger than 8000000 bytes"),
        ("SELECT randomblob(2000000000)", "too big"),
        ("SELECT printf('%.*c', 2000000000, 'x')", "the function printf() is not allowed"),
        ("SELECT length(hex(zeroblob(60000)))", "too big"),
        ("SELECT hex(zeroblob(40000)) LIKE replace(hex(zeroblob(600)), '0', '%a')", "too complex"),
        ("SELECT 1 " + "+ 1 " * 30_000, "longer than 100000 characters"),
    ]


def test_hostile_queries_are_refused_and_leave_the_database_untouched(db, tmp_path):
    before = sha256(db)
    for query, expected in hostile_queries(tmp_path):
        result = sql.verify(task(db, "SELECT COUNT(*) FROM singer"), f"<sql>{query}</sql>")
        assert [s.score for s in result] == [1.0, 0.0, 0.0], query
        assert expected in result[1].observed, (query, result[1].observed)
    assert sha256(db) == before
    assert list(tmp_path.iterdir()) == []  # no attached, vacuumed or written file appeared
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM singer").fetchone() == (4,)


@pytest.mark.parametrize("statement, denied", [
    ("ATTACH DATABASE ':memory:' AS evil", "ATTACH"),
    ("PRAGMA journal_mode = WAL", "PRAGMA"),
    ("DROP TABLE singer", "changing the schema"),
    ("CREATE TEMP TABLE evil (x)", "changing the schema"),
    ("BEGIN", "TRANSACTION"),
    ("VACUUM INTO ':memory:'", "ATTACH"),
])
def test_the_authorizer_alone_refuses_what_the_text_check_also_catches(db, statement, denied):
    """Defence in depth: skip the leading-keyword check and go straight to the authorizer."""
    limits = sandbox.Limits()
    conn = sandbox._open_readonly(db, limits)
    with pytest.raises(sandbox.SandboxError, match=f"Refused: {denied} is not allowed"):
        sandbox._execute(conn, statement, limits)
    conn.close()


def test_an_endless_recursive_query_is_stopped_by_the_time_bound(db):
    endless = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r"
    started = time.monotonic()
    result = sql.verify(task(db, "SELECT 1"), f"<sql>{endless}</sql>")
    elapsed = time.monotonic() - started
    assert [s.score for s in result] == [1.0, 0.0, 0.0]
    assert result[1].observed == "Refused: the query ran longer than 2 s."
    assert 1.9 < elapsed < 5.0
    with pytest.raises(sandbox.SandboxError, match="longer than 0.2 s"):
        sandbox.run_select(db, endless, sandbox.Limits(timeout_s=0.2))


@pytest.mark.parametrize("response", [
    "", " ", "\x00\x01\x02\xff", "<sql>\x00</sql>", "<sql>SELECT '\udcff'</sql>", "<sql>" * 100_000,
    "<sql>SELECT '" + "a" * 1_000_000 + "'</sql>", "<sql>;</sql>", "<sql>-- only a comment</sql>",
    "<sql>SELECT 1; </sql>", "<sql>SELECT (((((</sql>", "<SQL>SELECT 1</SQL>", "\u202e<sql>SELECT ☃</sql>",
])
def test_verify_never_raises_on_garbage(db, response):
    result = sql.verify(task(db, "SELECT 1"), response)
    assert [s.name for s in result] == ["format", "executable", "execution"]
    assert all(s.score in (0.0, 1.0) and s.feedback for s in result)
    spans = sql.response_parts(task(db, "SELECT 1"), response)
    ends = [0] + [end for _, end, _ in spans]
    assert [start for start, _, _ in spans] == ends[:-1] and ends[-1] == len(response)  # contiguous, covering
    assert all(start < end for start, end, _ in spans)


def test_a_trailing_semicolon_is_one_statement(db):
    assert scores(db, "SELECT 1", "<sql>SELECT 1; </sql>") == [1, 1, 1]


def test_every_demo_reference_passes_and_widening_a_strict_comparison_fails_execution():
    records = [r for r in load_tasks("demo")[0] if r.task == "sql"]
    assert all([s.score for s in sql.verify(r, r.reference_response)] == [1, 1, 1] for r in records)
    strict = [r for r in records if " > " in r.spec.reference_sql or " < " in r.spec.reference_sql]
    assert len(strict) >= 20
    for r in strict:
        widened = r.reference_response.replace(" > ", " >= ").replace(" < ", " <= ")
        assert [s.score for s in sql.verify(r, widened)] == [1, 1, 0], r.id


def cte_chain(depth: int) -> str:
    """Each CTE joins the previous one with itself: SQLite's preparation doubles time and memory per level."""
    ctes = ["a0(x) AS (SELECT 1)"] + [f"a{i}(x) AS (SELECT sum(p.x) FROM a{i - 1} p, a{i - 1} q)"
                                      for i in range(1, depth + 1)]
    return f"WITH {', '.join(ctes)} SELECT x FROM a{depth}"


CTE_PROBE = """
import resource, sys, time
from tokencredit.verifiers import sandbox, sql
from tokencredit.schemas.records import SqlSpec, TaskRecord
from tests.test_sql_verifier import cte_chain
record = TaskRecord("q", "sql", "Question?", None, SqlSpec(sys.argv[1], "SELECT 1"))
mib = lambda who: resource.getrusage(who).ru_maxrss / 1024
before = mib(resource.RUSAGE_SELF)
for depth in (20, 22):
    started = time.monotonic()
    observed = sql.verify(record, f"<sql>{cte_chain(depth)}</sql>")[1].observed
    print(depth, round(time.monotonic() - started, 2), observed)
    try:
        sandbox.run_select(sys.argv[1], cte_chain(depth), sandbox.Limits(timeout_s=600))
    except sandbox.SandboxError as e:
        print(depth, "untimed", e)
sandbox.close_workers()
print(round(mib(resource.RUSAGE_SELF) - before), round(mib(resource.RUSAGE_CHILDREN)))
"""
MEMORY_LABEL = "Refused: the query needed more than 256 MB of memory (temporary tables and sorts included)."


def test_a_cte_chain_that_explodes_while_prepared_is_bounded_in_time_and_memory(db):
    """Depth 20 took 7 s and 2.3 GB before the worker process. With the default limits it stops
    within 3 s, on whichever bound it reaches first (memory on an idle machine, time on a loaded
    one); with no effective time limit, on the memory bound. The worker's RSS stays under
    RLIMIT_AS (the SQLite heap limit plus a margin: 512 MB), the calling process does not grow."""
    import os
    import subprocess
    import sys
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", CTE_PROBE, str(db)], capture_output=True, text=True, check=True,
                         cwd=root, env={**os.environ, "PYTHONPATH": str(root)}).stdout.splitlines()
    for depth, timed, untimed in zip((20, 22), out[0::2], out[1::2]):
        got_depth, seconds, observed = timed.split(" ", 2)
        assert int(got_depth) == depth and float(seconds) < 3.0, timed
        assert observed in (MEMORY_LABEL, "Refused: the query ran longer than 2 s."), timed
        assert untimed == f"{depth} untimed {MEMORY_LABEL}"
    parent_growth_mib, worker_mib = map(int, out[4].split())
    cap = (sandbox.Limits().max_memory_bytes + sandbox._AS_MARGIN_BYTES) / 2**20
    assert worker_mib < cap and parent_growth_mib < 50, out


def test_a_statement_still_being_prepared_at_the_deadline_is_killed_and_labelled_by_time(db):
    limits = sandbox.Limits(timeout_s=0.3, max_memory_bytes=4_000_000_000)  # memory would not stop it
    started = time.monotonic()
    with pytest.raises(sandbox.SandboxError, match=r"^Refused: the query ran longer than 0.3 s.$"):
        sandbox.run_select(db, cte_chain(22), limits)
    assert time.monotonic() - started < 3.0
    assert sandbox.run_select(db, "SELECT COUNT(*) FROM singer", limits).rows == [(4,)]  # a fresh worker


def test_temporary_storage_stays_in_the_bounded_memory_and_no_file_is_written(db, tmp_path, monkeypatch):
    """A DISTINCT over 1 GB of rows once wrote 1.07 GB of temporary files within its 2 s."""
    sandbox.close_workers()  # the next worker starts with this temporary folder
    monkeypatch.setenv("SQLITE_TMPDIR", str(tmp_path))
    big = ("WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r LIMIT 200000) "
           "SELECT COUNT(*) FROM (SELECT DISTINCT zeroblob(5000) || x FROM r)")
    started = time.monotonic()
    result = sql.verify(task(db, "SELECT 1"), f"<sql>{big}</sql>")
    assert result[1].observed in (MEMORY_LABEL, "Refused: the query ran longer than 2 s.")
    assert time.monotonic() - started < 3.0
    sandbox.close_workers()
    assert list(tmp_path.iterdir()) == []


def test_a_fresh_workers_start_is_not_counted_as_query_time(db):
    # an interpreter can take seconds to start on a loaded machine: the worker reports ready first, and
    # the query's clock (here 1 ms plus the kill grace) starts only then
    sandbox.close_workers()
    limits = sandbox.Limits(timeout_s=0.001)
    assert sandbox.run_select(db, "SELECT COUNT(*) FROM singer", limits).rows == [(4,)]
