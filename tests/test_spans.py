"""Verifier spans: where each built-in check says a response breaks it, and span validation."""
from __future__ import annotations

import json
import sqlite3

import pytest

from tokencredit import verifiers
from tokencredit.schemas.records import Constraint, InstructionSpec, PluginSpec, SqlSpec, TaskRecord, ToolCall, ToolSpec
from tokencredit.verifiers import instructions, plugins, spans, sql, tools

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]}}


def instruction(kind: str, args: dict) -> TaskRecord:
    spec = InstructionSpec((Constraint(kind, args),))
    return TaskRecord("inst-1", "instructions", "Write a note.", None, spec)


def located(score, response: str) -> list[str]:
    return [response[s:e] for s, e in score.spans]


@pytest.mark.parametrize("kind, args, response, want", [
    ("no_commas", {}, "Yes, it runs, far.", [",", ","]),
    ("keyword_exclude", {"keywords": ["river"]}, "The River and the rivers meet a river.", ["River", "river"]),
    ("word_count", {"max": 3}, "one two three four five", ["four five"]),
    ("sentence_count", {"max": 1}, "It rains. It pours. Stop.", ["It pours. Stop."]),
    ("paragraph_count", {"n": 1}, "One.\n\nTwo.\n \nThree.\n", ["Two.\n \nThree."]),
    ("bullet_count", {"n": 1}, "Tips:\n* one\n- two\n* three\nBye.", ["- two\n* three"]),
    ("char_count", {"max": 5}, "  abcdefgh ", ["fgh"]),
    ("punctuation_ban", {"chars": "!?"}, "Hi! Why?", ["!", "?"]),
    ("ends_with", {"phrase": "That is all."}, "Done here, bye now.", ["here,", "bye", "now."]),
    ("ends_with", {"phrase": "Thank you for your patience."}, "Hi. Thank you for your understanding.",
     ["understanding."]),  # the word that differs, aligned from the end
    ("ends_with", {"phrase": "That is all."}, "That is all. Bye now.", ["Bye now."]),  # text after the phrase
    ("starts_with", {"phrase": "Dear"}, "Hello you", ["Hello"]),
    ("starts_with", {"phrase": "Dear Ms. Lee,"}, "Dear Mr. Lee, hello", ["Mr."]),
    ("lowercase", {}, "all fine But not This", ["But", "This"]),
    ("quotation", {}, '"quoted but open', ["n"]),
    ("keyword_frequency", {"keyword": "go", "max": 1}, "go go go", ["go", "go"]),
    ("title", {}, "<title> A poem", ["<title>"]),
])
def test_a_failed_constraint_says_where(kind, args, response, want):
    (score,) = instructions.verify(instruction(kind, args), response)
    assert score.score < 1 and located(score, response) == want


def test_a_passing_or_placeless_constraint_has_no_span():
    (ok,) = instructions.verify(instruction("no_commas", {}), "No commas here.")
    (missing,) = instructions.verify(instruction("keyword_include", {"keywords": ["stone"]}), "A river.")
    (short,) = instructions.verify(instruction("word_count", {"min": 10}), "Too short.")
    (few,) = instructions.verify(instruction("bullet_count", {"n": 3}), "* one\n* two")
    assert ok.spans == missing.spans == short.spans == few.spans == ()


def tool_record(*calls: ToolCall) -> TaskRecord:
    return TaskRecord("tool-1", "tools", "Call a tool.", None, ToolSpec((WEATHER,), calls))


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.mark.parametrize("response, want", [
    (call("get_weather", {"city": "Rome", "unit": "celsius"}), ['Rome"']),  # a wrong value, from its 1st char
    (call("get_weather", {"city": "Parma", "unit": "celsius"}), ['ma"']),  # from where it departs
    (call("get_weather", {"city": "Par", "unit": "celsius"}), ['"']),  # a prefix: where it stops short
    (call("get_weather", {"unit": "celsius"}), ['"']),  # missing first argument: the first key's quote
    (call("get_weather", {"city": "Paris"}), ["}"]),  # missing after "city": right after city's value
    (call("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}), ["3"]),  # unexpected argument
    (call("get_weather", {"city": "Paris", "unit": "celsius"}) + call("get_time", {}), ['time"']),
])
def test_a_wrong_tool_call_says_where(response, want):
    fmt, correct = tools.verify(tool_record(ToolCall("get_weather", {"city": "Paris", "unit": "celsius"})), response)
    assert correct.score < 1 and located(correct, response) == want
    assert fmt.spans == ()


@pytest.mark.parametrize("response, want", [
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}', ["}"]),  # the missing </tool_call>
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}} done', ["done"]),
    ('Sure! <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', ["Sure!"]),
    ("<tool_call>{'name': 'x'}</tool_call>", ["'"]),  # invalid JSON: where the parser stopped
])
def test_a_tool_format_failure_says_where(response, want):
    fmt, _ = tools.verify(tool_record(ToolCall("get_weather", {"city": "Paris"})), response)
    assert fmt.score == 0 and located(fmt, response) == want


@pytest.fixture(scope="module")
def sql_record(tmp_path_factory) -> TaskRecord:
    path = tmp_path_factory.mktemp("db") / "shop.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE items (name TEXT, price REAL)")
    con.execute("INSERT INTO items VALUES ('pen', 1.5)")
    con.commit()
    con.close()
    return TaskRecord("sql-1", "sql", "List items.", None, SqlSpec(str(path), "SELECT name FROM items"))


@pytest.mark.parametrize("response, want", [
    ("<sql>SELECT name FROM item</sql>", ["item"]),  # no such table: item
    ("<sql>SELECT nme FROM items</sql>", ["nme"]),  # no such column: nme
    ("<sql>SELECT name FROM items WHERE WHERE</sql>", ["WHERE", "WHERE"]),  # near "WHERE": syntax error
])
def test_an_sql_error_points_at_the_name_it_names(sql_record, response, want):
    fmt, executable, execution = sql.verify(sql_record, response)
    assert fmt.score == 1 and executable.score == 0 and located(executable, response) == want
    assert execution.spans == ()  # a wrong result has no place in the response


@pytest.mark.parametrize("response, want", [
    ("<sql>SELECT name FROM items", ["s"]),  # where the missing </sql> belongs
    ("<sql>SELECT 1</sql><sql>SELECT 2</sql>", ["<sql>", "</sql>"]),  # the extra block's tags
    ("<sql> </sql>", ["<sql> </sql>"]),
])
def test_an_sql_tag_failure_says_where(sql_record, response, want):
    fmt = sql.verify(sql_record, response)[0]
    assert fmt.score == 0 and located(fmt, response) == want


def test_a_wrong_sql_result_has_no_span(sql_record):
    response = "<sql>SELECT price FROM items</sql>"
    assert [s.spans for s in sql.verify(sql_record, response)] == [(), (), ()]


@pytest.mark.parametrize("bad, reason", [
    ([(3, 2)], "not inside the response"),
    ([(0, 99)], "not inside the response"),
    ([(0, 4), (2, 6)], "overlaps"),
    ([(4, 6), (0, 2)], "overlaps or precedes"),
    ([(0, "2")], "pair of integers"),
    ("0-2", "a list of"),
])
def test_span_validation_names_the_problem(bad, reason):
    with pytest.raises(ValueError, match=f"record 'r': reward 'x': .*{reason}"):
        spans.check(bad, "a short text", "record 'r': reward 'x'")


def test_a_plugin_gives_spans_and_bad_spans_name_record_and_reward(tmp_path):
    source = tmp_path / "span_plugin.py"
    source.write_text(
        "def good(record, response):\n"
        "    yield 'no_x', float('x' not in response), 'Do not write x.', '', "
        "[[i, i + 1] for i, c in enumerate(response) if c == 'x']\n"
        "def bad(record, response):\n"
        "    yield 'no_x', 0.0, 'Do not write x.', '', [(0, len(response) + 5)]\n")
    rec = TaskRecord("p-1", "poem", "Write.", None, PluginSpec({"id": "p-1", "task": "poem", "prompt": "Write."}))
    (good,) = verifiers.verify(rec, "axbx", plugins.resolve([f"{source}:good"]))
    assert good.spans == ((1, 2), (3, 4))
    with pytest.raises(plugins.PluginError, match="record 'p-1'.*reward 'no_x'.*not inside the response"):
        verifiers.verify(rec, "axbx", plugins.resolve([f"{source}:bad"]))
