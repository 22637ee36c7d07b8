"""Build the text-to-SQL demo set: three small SQLite databases and templated questions.

    python -m tokencredit.verifiers.demo.build_sql     # rewrites demo/sql.jsonl and demo/databases/*.sqlite

Deterministic (fixed seed, no downloads): the JSONL comes out byte-identical on every run.
The questions are plain templated English over a compact schema line, so that a tiny model
can learn them. Every comparison question uses a value that occurs in its column and lies
strictly between the column's minimum and maximum, so `>` and `>=` (and `<`, `<=`) give
different, non-empty results. Every 5th record in (template, id) order is `"split": "test"`.
"""
from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from tokencredit.verifiers.demo import write_jsonl

SEED = 1234
HERE = Path(__file__).parent
OUT_JSONL = HERE / "sql.jsonl"
DB_DIR = HERE / "databases"
MAX_PROMPT_CHARS = 350
QUESTIONS_PER_DB = 80
TEST_EVERY = 5  # every 5th record of each template run is held out
INSTRUCTION = "Answer with the SQL query between <sql> and </sql>."

FIRST = ["Ada", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ivy", "Jon", "Kai", "Lea",
         "Max", "Nia", "Omar", "Pia", "Raj", "Sara", "Tom", "Uma", "Vic", "Wen", "Yara", "Zoe"]
LAST = ["Adams", "Brook", "Chen", "Diaz", "Evans", "Fox", "Gray", "Hill", "Ito", "Jones", "Khan",
        "Lopez", "Moss", "Nash", "Ortiz", "Park", "Quinn", "Reed", "Stone", "Tran"]
ADJECTIVES = ["Blue", "Golden", "Silent", "Red", "Wild", "Quiet", "Bright", "Dark", "Lost", "Happy",
              "Cold", "Green"]
NOUNS = ["River", "Night", "Garden", "Storm", "Road", "Dream", "Fire", "Sky", "Harbor", "Forest",
         "Moon", "Island"]
ITEMS = ["Lamp", "Chair", "Kite", "Mug", "Ball", "Pan", "Rake", "Puzzle", "Clock", "Bag"]
COUNTRIES = ["France", "Japan", "Brazil", "Canada", "Kenya"]
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Austin"]
OPS = {">": "greater than", ">=": "at least", "<": "less than", "=": "equal to"}
AGGREGATES = {"AVG": "average", "MAX": "maximum", "MIN": "minimum", "SUM": "total"}


@dataclass(frozen=True)
class Table:
    name: str
    singular: str
    plural: str
    columns: tuple[str, ...]  # "id" first; every other column is named below or a foreign key
    label: str | None  # the text column that names a row
    numbers: tuple[str, ...]  # numeric columns to compare, aggregate and order by
    category: str | None  # a text column with few distinct values
    parents: tuple[tuple[str, str], ...] = ()  # (foreign key column, parent table)


# ---------------------------------------------------------------- databases


def unique_names(rng: random.Random, n: int, parts_a: list[str], parts_b: list[str], fmt: str) -> list[str]:
    pairs = [(a, b) for a in parts_a for b in parts_b]
    return [fmt.format(a, b) for a, b in rng.sample(pairs, n)]


def concerts(rng: random.Random) -> tuple[list[Table], dict[str, list[tuple]]]:
    tables = [
        Table("stadium", "stadium", "stadiums", ("id", "name", "city", "capacity"), "name", ("capacity",), "city"),
        Table("singer", "singer", "singers", ("id", "name", "country", "age"), "name", ("age",), "country"),
        Table("concert", "concert", "concerts", ("id", "name", "year", "stadium_id", "singer_id"), "name", ("year",),
              None, (("stadium_id", "stadium"), ("singer_id", "singer"))),
    ]
    stadiums = unique_names(rng, 8, ADJECTIVES, ["Arena", "Park", "Hall", "Dome"], "{} {}")
    singers = unique_names(rng, 20, FIRST, LAST, "{} {}")
    shows = unique_names(rng, 30, ADJECTIVES, NOUNS, "{} {}")
    rows = {
        "stadium": [(i + 1, n, rng.choice(CITIES), rng.randrange(2000, 20001, 500)) for i, n in enumerate(stadiums)],
        "singer": [(i + 1, n, rng.choice(COUNTRIES), rng.randint(20, 60)) for i, n in enumerate(singers)],
        "concert": [(i + 1, n, rng.randint(2014, 2024), rng.randint(1, 8), rng.randint(1, 20)) for i, n in enumerate(shows)],
    }
    return tables, rows


def library(rng: random.Random) -> tuple[list[Table], dict[str, list[tuple]]]:
    tables = [
        Table("author", "author", "authors", ("id", "name", "country", "birth_year"), "name", ("birth_year",), "country"),
        Table("book", "book", "books", ("id", "title", "genre", "year", "pages", "author_id"), "title",
              ("year", "pages"), "genre", (("author_id", "author"),)),
        Table("member", "member", "members", ("id", "name", "city", "age"), "name", ("age",), "city"),
        Table("loan", "loan", "loans", ("id", "book_id", "member_id", "days"), None, ("days",), None,
              (("book_id", "book"), ("member_id", "member"))),
    ]
    authors = unique_names(rng, 12, FIRST, LAST, "{} {}")
    titles = unique_names(rng, 30, ADJECTIVES, NOUNS, "The {} {}")
    members = unique_names(rng, 15, FIRST, LAST, "{} {}")
    genres = ["Fiction", "History", "Science", "Poetry"]
    rows = {
        "author": [(i + 1, n, rng.choice(COUNTRIES), rng.randint(1940, 1995)) for i, n in enumerate(authors)],
        "book": [(i + 1, t, rng.choice(genres), rng.randint(1980, 2023), rng.randrange(100, 601, 10), rng.randint(1, 12))
                 for i, t in enumerate(titles)],
        "member": [(i + 1, n, rng.choice(CITIES), rng.randint(18, 70)) for i, n in enumerate(members)],
        "loan": [(i + 1, rng.randint(1, 30), rng.randint(1, 15), rng.randint(1, 30)) for i in range(40)],
    }
    return tables, rows


def shop(rng: random.Random) -> tuple[list[Table], dict[str, list[tuple]]]:
    tables = [
        Table("customer", "customer", "customers", ("id", "name", "city", "age"), "name", ("age",), "city"),
        Table("product", "product", "products", ("id", "name", "category", "price"), "name", ("price",), "category"),
        Table("orders", "order", "orders", ("id", "customer_id", "product_id", "quantity"), None, ("quantity",), None,
              (("customer_id", "customer"), ("product_id", "product"))),
    ]
    customers = unique_names(rng, 20, FIRST, LAST, "{} {}")
    products = unique_names(rng, 15, ADJECTIVES, ITEMS, "{} {}")
    categories = ["Toys", "Garden", "Kitchen", "Sports"]
    rows = {
        "customer": [(i + 1, n, rng.choice(CITIES), rng.randint(18, 70)) for i, n in enumerate(customers)],
        "product": [(i + 1, n, rng.choice(categories), rng.randint(5, 200)) for i, n in enumerate(products)],
        "orders": [(i + 1, rng.randint(1, 20), rng.randint(1, 15), rng.randint(1, 10)) for i in range(40)],
    }
    return tables, rows


def write_database(path: Path, tables: list[Table], rows: dict[str, list[tuple]]) -> None:
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    with conn:
        for t in tables:
            conn.execute(f"CREATE TABLE {t.name} ({', '.join(_column_def(t, c) for c in t.columns)})")
            marks = ", ".join("?" * len(t.columns))
            conn.executemany(f"INSERT INTO {t.name} VALUES ({marks})", rows[t.name])
    conn.close()


def _column_def(table: Table, column: str) -> str:
    if column == "id":
        return "id INTEGER PRIMARY KEY"
    numeric = column in table.numbers or column in dict(table.parents)
    return f"{column} {'INTEGER' if numeric else 'TEXT'}"


# ---------------------------------------------------------------- questions


def words(column: str) -> str:
    return column.replace("_", " ")


def inner_values(conn: sqlite3.Connection, source: str, column: str) -> list:
    """Values of `column` in `source` (a FROM clause) strictly between its min and max.

    Comparing against one of them keeps both sides of `>`/`>=`/`<`/`=` non-empty and distinct.
    """
    values = sorted({v for (v,) in conn.execute(f"SELECT {column} {source}")})
    return values[1:-1]


def categories(conn: sqlite3.Connection, table: str, column: str) -> list[str]:
    return sorted({v for (v,) in conn.execute(f"SELECT {column} FROM {table}")})


def single_table_questions(conn, t: Table, rng: random.Random):
    """Yields (template, question, sql) for one table."""
    yield "count_all", f"How many {t.plural} are there?", f"SELECT COUNT(*) FROM {t.name}"
    for x in t.numbers:
        for op, op_words in OPS.items():
            for v in rng.sample(inner_values(conn, f"FROM {t.name}", x), 2):
                cond = f"{x} {op} {v}"
                yield "count_cmp", f"How many {t.plural} have {words(x)} {op_words} {v}?", f"SELECT COUNT(*) FROM {t.name} WHERE {cond}"
                if t.label:
                    yield ("list_cmp", f"List the {t.label} of {t.plural} with {words(x)} {op_words} {v}.",
                           f"SELECT {t.label} FROM {t.name} WHERE {cond}")
        for f, f_words in AGGREGATES.items():
            if f == "SUM" and "year" in x:  # a total of years means nothing
                continue
            yield "aggregate", f"What is the {f_words} {words(x)} of all {t.plural}?", f"SELECT {f}({x}) FROM {t.name}"
            if t.category:
                yield ("group_aggregate", f"What is the {f_words} {words(x)} of {t.plural} for each {t.category}?",
                       f"SELECT {t.category}, {f}({x}) FROM {t.name} GROUP BY {t.category}")
        if t.label:
            yield from top_k_questions(conn, t, x)
    if t.category:
        yield "distinct", f"List the distinct {t.category} values of {t.plural}.", f"SELECT DISTINCT {t.category} FROM {t.name}"
        yield ("group_count", f"How many {t.plural} are there for each {t.category}?",
               f"SELECT {t.category}, COUNT(*) FROM {t.name} GROUP BY {t.category}")
        for c in rng.sample(categories(conn, t.name, t.category), 2):
            cond = f"{t.category} = '{c}'"
            yield "count_category", f"How many {t.plural} have {t.category} {c}?", f"SELECT COUNT(*) FROM {t.name} WHERE {cond}"
            if t.label:
                yield "list_category", f"List the {t.label} of {t.plural} with {t.category} {c}.", f"SELECT {t.label} FROM {t.name} WHERE {cond}"


def top_k_questions(conn, t: Table, x: str):
    """ORDER BY + LIMIT questions whose answer has no ties (the row order is then unique)."""
    ranked = {
        "DESC": [v for (v,) in conn.execute(f"SELECT {x} FROM {t.name} ORDER BY {x} DESC")],
        "ASC": [v for (v,) in conn.execute(f"SELECT {x} FROM {t.name} ORDER BY {x} ASC")],
    }
    for direction, extreme in (("DESC", "highest"), ("ASC", "lowest")):
        for k in (1, 3):
            head = ranked[direction][: k + 1]
            if len(set(head)) < len(head):
                continue
            sql = f"SELECT {t.label} FROM {t.name} ORDER BY {x} {direction} LIMIT {k}"
            question = (f"Which {t.singular} has the {extreme} {words(x)}? Give its {t.label}." if k == 1
                        else f"List the {t.label} of the {k} {t.plural} with the {extreme} {words(x)}.")
            yield "top_k", question, sql


def join_questions(conn, child: Table, parent: Table, fk: str, rng: random.Random):
    """Yields (template, question, sql) over `child JOIN parent`."""
    join = f"FROM {child.name} JOIN {parent.name} ON {child.name}.{fk} = {parent.name}.id"
    p_label = f"{parent.name}.{parent.label}"
    if child.label:
        yield ("join_list", f"List the {child.label} of each {child.singular} with the {parent.label} of its {parent.singular}.",
               f"SELECT {child.name}.{child.label}, {p_label} {join}")
    yield ("join_group", f"How many {child.plural} does each {parent.singular} have? Give the {parent.label} and the count.",
           f"SELECT {p_label}, COUNT(*) {join} GROUP BY {p_label}")
    linked = [v for (v,) in conn.execute(f"SELECT DISTINCT {p_label} {join} ORDER BY {p_label}")]
    for name in rng.sample(linked, 2):
        yield ("join_name", f"How many {child.plural} does the {parent.singular} with {parent.label} {name} have?",
               f"SELECT COUNT(*) {join} WHERE {p_label} = '{name}'")
    for x in parent.numbers:
        for op, op_words in rng.sample(sorted(OPS.items()), 2):
            v = rng.choice(inner_values(conn, join, f"{parent.name}.{x}"))
            cond = f"{parent.name}.{x} {op} {v}"
            yield ("join_cmp", f"How many {child.plural} have a {parent.singular} with {words(x)} {op_words} {v}?",
                   f"SELECT COUNT(*) {join} WHERE {cond}")


def all_questions(conn, tables: list[Table], rng: random.Random):
    by_name = {t.name: t for t in tables}
    for t in tables:
        yield from single_table_questions(conn, t, rng)
        for fk, parent in t.parents:
            yield from join_questions(conn, t, by_name[parent], fk, rng)


def schema_line(tables: list[Table]) -> str:
    return "Schema: " + "; ".join(f"{t.name}({', '.join(t.columns)})" for t in tables) + "."


def check_reference(conn: sqlite3.Connection, sql: str) -> None:
    rows = conn.execute(sql).fetchall()
    assert rows and rows not in ([(0,)], [(None,)]), f"reference query has an empty result: {sql}"


def pick(questions: list[tuple[str, str, str]], n: int, rng: random.Random) -> list[tuple[str, str, str]]:
    """`n` questions drawn round-robin over templates, so that every template is represented."""
    by_template: dict[str, list] = {}
    for q in questions:
        by_template.setdefault(q[0], []).append(q)
    for group in by_template.values():
        rng.shuffle(group)
    chosen: list = []
    while len(chosen) < n and any(by_template.values()):
        for template in sorted(by_template):
            if by_template[template] and len(chosen) < n:
                chosen.append(by_template[template].pop())
    return chosen


def build() -> list[dict]:
    rng = random.Random(SEED)
    DB_DIR.mkdir(exist_ok=True)
    drafts = []
    for db_name, make in (("concerts", concerts), ("library", library), ("shop", shop)):
        tables, rows = make(rng)
        db_file = f"{db_name}.sqlite"
        write_database(DB_DIR / db_file, tables, rows)
        conn = sqlite3.connect(DB_DIR / db_file)
        questions = list(dict.fromkeys(all_questions(conn, tables, rng)))  # drop repeats, keep order
        for template, question, sql in pick(questions, QUESTIONS_PER_DB, rng):
            check_reference(conn, sql)
            prompt = f"{schema_line(tables)}\nQuestion: {question}\n{INSTRUCTION}"
            assert len(prompt) <= MAX_PROMPT_CHARS, f"prompt too long ({len(prompt)}): {prompt}"
            drafts.append((template, prompt, db_file, sql))
        conn.close()
    rng.shuffle(drafts)
    return assign_splits(drafts)


def assign_splits(drafts: list[tuple[str, str, str, str]]) -> list[dict]:
    records = [record(i, *d) for i, d in enumerate(drafts)]
    templates = [d[0] for d in drafts]
    order = sorted(range(len(records)), key=lambda i: (templates[i], i))
    for rank, i in enumerate(order):
        records[i]["split"] = "test" if rank % TEST_EVERY == TEST_EVERY - 1 else "train"
    return records


def record(i: int, template: str, prompt: str, db_file: str, sql: str) -> dict:
    return {"id": f"sql-{i:04d}", "task": "sql", "prompt": prompt, "reference_response": f"<sql>{sql}</sql>",
            "db": db_file, "reference_sql": sql}


def main() -> None:
    records = build()
    write_jsonl(records, OUT_JSONL)
    n_test = sum(r["split"] == "test" for r in records)
    print(f"wrote {len(records)} records ({n_test} test) to {OUT_JSONL} and {len(list(DB_DIR.glob('*.sqlite')))} databases")


if __name__ == "__main__":
    main()
