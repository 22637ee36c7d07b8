"""Tool-calling verifier: format, correctness (formula, types, order), feedback, record errors, demo set."""
from __future__ import annotations

import copy
import itertools
import json
import random
import re
import sys
from pathlib import Path

import pytest

from tokencredit.schemas.records import RecordError, TaskRecord, ToolCall, ToolSpec
from tokencredit.verifiers import bfcl_rules, tools
from tokencredit.verifiers import formats
from tokencredit.verifiers.spans import check as check_spans
from tokencredit.verifiers.demo import build_tools
from tokencredit.verifiers.tasks import load_tasks

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}
SEARCH = {"name": "search_web", "parameters": {"type": "object", "properties": {
    "query": {"type": "string"}, "limit": {"type": "integer"}, "offset": {"type": "integer"}}, "required": ["query"]}}
CONVERT = {"name": "convert_units", "parameters": {"type": "object", "properties": {
    "value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": {"type": "string"}}, "required": ["value"]}}
PARIS = ToolCall("get_weather", {"city": "Paris", "unit": "celsius"})
JAZZ = ToolCall("search_web", {"query": "jazz", "limit": 10, "offset": 20})


def record(*calls: ToolCall, record_id: str = "tool-test", tool_list=(WEATHER, SEARCH, CONVERT)) -> TaskRecord:
    return TaskRecord(record_id, "tools", "Call a tool.", "", ToolSpec(tuple(tool_list), tuple(calls)))


def block(name, arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def scores(rec: TaskRecord, response: str) -> tuple[float, float]:
    fmt, correct = tools.verify(rec, response)
    assert (fmt.name, correct.name) == ("format", "correctness")
    return fmt.score, correct.score


# ---------------------------------------------------------------- format

GOOD_FORMAT = [
    tools.render_calls([PARIS]),
    "\n  " + tools.render_calls([PARIS, JAZZ]) + "\n",
    '<tool_call>\n{"arguments": {}, "name": "x", "extra": 1}\n</tool_call>',  # wrong call, right shape
]
BAD_FORMAT = [
    ("", "no <tool_call>"),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', "no <tool_call>"),
    ("Sure! " + tools.render_calls([PARIS]), "text outside the tags: 'Sure!'"),
    (tools.render_calls([PARIS]) + "<tool_call>{", "an unmatched tag"),
    (tools.render_calls([PARIS]) + "</tool_call>", "an unmatched tag"),
    ("<tool_call>{'name': 'get_weather'}</tool_call>", "block 1 is not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "block 1 is not a JSON object"),
    ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', "block 1 has no string 'name'"),
    ('<tool_call>{"name": "get_weather", "arguments": []}</tool_call>', "block 1 has no object 'arguments'"),
    (tools.render_calls([PARIS]) + '<tool_call>{"name": "x"}</tool_call>', "block 2 has no object 'arguments'"),
]


@pytest.mark.parametrize("response", GOOD_FORMAT)
def test_format_passes(response):
    assert scores(record(PARIS), response)[0] == 1.0


@pytest.mark.parametrize("response,problem", BAD_FORMAT)
def test_format_fails_with_the_problem_named(response, problem):
    fmt, _ = tools.verify(record(PARIS), response)
    assert fmt.score == 0.0
    assert fmt.feedback == tools.FORMAT_RULE and f"Found: {problem}" in fmt.observed


def test_format_and_correctness_are_decoupled():
    # well-formed but wrong, and malformed around a right call
    assert scores(record(PARIS), block("get_weather", {"city": "Rome", "unit": "celsius"})) == (1.0, 0.5)
    assert scores(record(PARIS), "Here: " + tools.render_calls([PARIS])) == (0.0, 1.0)


# ---------------------------------------------------------------- correctness

@pytest.mark.parametrize("response,expected", [
    (block("get_weather", {"unit": "celsius", "city": "Paris"}), 1.0),        # keyword order
    (block("get_weather", {"city": "Paris", "unit": "fahrenheit"}), 0.5),     # one of two arguments
    (block("get_weather", {"city": "Paris"}), 0.5),                           # a missing argument
    (block("get_weather", {"city": "Paris", "unit": "celsius", "days": 3}), 2 / 3),  # extra argument
    (block("search_web", {"city": "Paris", "unit": "celsius"}), 0.0),         # wrong function
    (tools.render_calls([PARIS, PARIS]), 0.5),                                # an extra call
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>'
     '<tool_call>{"name": "get_weather"}</tool_call>', 1.0),                  # malformed block: format's job
])
def test_correctness_formula_one_call(response, expected):
    assert scores(record(PARIS), response)[1] == pytest.approx(expected)


def test_correctness_two_calls_order_insensitive_and_partial():
    rec = record(PARIS, JAZZ)
    assert scores(rec, tools.render_calls([JAZZ, PARIS]))[1] == 1.0
    half_jazz = block("search_web", {"query": "jazz", "limit": 11, "offset": 21, "page": 1})  # 1 / (3 + 1)
    assert scores(rec, half_jazz + tools.render_calls([PARIS]))[1] == pytest.approx((0.25 + 1) / 2)
    assert scores(rec, tools.render_calls([PARIS]))[1] == pytest.approx(0.5)  # a missing call
    # two calls of one tool: the best matching, not the first fit, pairs them
    a, b = ToolCall("search_web", {"query": "a", "limit": 1}), ToolCall("search_web", {"query": "b", "limit": 2})
    assert scores(record(a, b), tools.render_calls([b, a]))[1] == 1.0


@pytest.mark.parametrize("got,expected", [
    ({"value": 5.0, "from_unit": "km"}, 1.0),      # number param: 5.0 == 5
    ({"value": "5", "from_unit": "km"}, 0.5),      # "5" is a string
    ({"value": True, "from_unit": "km"}, 0.5),     # a boolean is not a number
    ({"value": 5, "from_unit": "KM"}, 0.5),        # strings compare exactly
])
def test_type_aware_number_param(got, expected):
    ref = ToolCall("convert_units", {"value": 5, "from_unit": "km"})
    assert scores(record(ref), block("convert_units", got))[1] == pytest.approx(expected)


@pytest.mark.parametrize("offset,expected", [(20, 1.0), (20.0, 2 / 3), ("20", 2 / 3), (21, 2 / 3)])
def test_type_aware_integer_param(offset, expected):
    got = block("search_web", {"query": "jazz", "limit": 10, "offset": offset})
    assert scores(record(JAZZ), got)[1] == pytest.approx(expected)


def test_same_value_is_json_typed_with_numbers_equal_by_value_at_every_depth():
    assert tools.same_value({"a": [1, "x"]}, {"a": [1, "x"]})
    assert tools.same_value({"lat": 48}, {"lat": 48.0}) and tools.same_value([[1, 2.5]], [[1.0, 2.5]])
    assert not tools.same_value(1, True) and not tools.same_value(None, 0) and not tools.same_value([True], [1])
    assert tools.same_value(2, 2.0, "number") and not tools.same_value(2.0, 2, "integer")
    assert not tools.same_value("Paris", "paris")


def test_bfcl_string_normalization():
    assert bfcl_rules.normalize("April 1, 2024") == bfcl_rules.normalize("april 1 2024") == "april12024"
    assert bfcl_rules.normalize("New-York_City*^") == "newyorkcity"
    assert bfcl_rules.normalize("it's") == 'it"s'


STATION = {"name": "find_station", "parameters": {"type": "dict", "properties": {
    "city": {"type": "string"}, "radius": {"type": "float"}, "lines": {"type": "array", "items": {"type": "float"}},
    "where": {"type": "dict"}, "fuel": {"type": "any"}}, "required": ["city"]}}
STATION_REF = ToolCall("find_station", {"city": "San Francisco", "lines": [1.0, 2.5]},
                       defaults={"radius": 5.0}, alternatives={"city": ("SF",), "radius": (10.0,)})


@pytest.mark.parametrize("semantics,arguments,expected", [
    ("tokencredit", {"city": "San Francisco", "lines": [1.0, 2.5]}, 1.0),              # default left out
    ("tokencredit", {"city": "SF", "lines": [1, 2.5], "radius": 5}, 1.0),              # alternative, default given
    ("tokencredit", {"city": "SF", "lines": [1.0, 2.5], "radius": 10.0}, 1.0),         # alternative default
    ("tokencredit", {"city": "SF", "lines": [1.0, 2.5], "radius": 7.5}, 2 / 3),        # a wrong default costs
    ("tokencredit", {"city": "san francisco", "lines": [1.0, 2.5]}, 0.5),              # exact strings
    ("bfcl", {"city": "san-francisco", "lines": [1.0, 2.5]}, 1.0),                     # BFCL's normalization
    ("bfcl", {"city": "SF", "lines": [1, 2.5]}, 0.5),                                  # BFCL: an int is no float item
    ("tokencredit", {"lines": [1.0, 2.5]}, 0.5),                                       # required argument missing
    ("tokencredit", {"city": "SF", "lines": [1.0, 2.5], "fuel": "gas"}, 2 / 3),        # an extra argument dilutes
])
def test_defaults_alternatives_and_semantics(semantics, arguments, expected):
    spec = ToolSpec((STATION,), (STATION_REF,), semantics=semantics)
    rec = TaskRecord("station", "tools", "Find a station.", None, spec)
    _, correct = tools.verify(rec, block("find_station", arguments))
    assert correct.score == pytest.approx(expected)
    assert correct.feedback == ("Expected call: find_station(city='San Francisco' or 'SF', lines=[1.0, 2.5], "
                                "[radius=5.0 or 10.0]).")


def test_correctness_matches_brute_force_over_matchings():
    """The assignment equals the best of all one-to-one matchings (permutations) on random calls."""
    rng = random.Random(0)
    props = {t["name"]: t["parameters"]["properties"] for t in (WEATHER, SEARCH, CONVERT)}

    def random_call():
        name = rng.choice(["get_weather", "search_web"])
        keys = rng.sample(sorted(props[name]) + ["zz"], rng.randint(0, 3))
        return ToolCall(name, {k: rng.choice([1, 2, "1"]) for k in keys})

    for _ in range(60):
        refs = [random_call() for _ in range(rng.randint(1, 3))]
        calls = [random_call() for _ in range(rng.randint(1, 4))]
        best = 0.0
        for perm in itertools.permutations(range(max(len(refs), len(calls)))):
            total = sum(tools.call_score(r, calls[perm[i]], props[r.name])[0]
                        for i, r in enumerate(refs) if perm[i] < len(calls))
            best = max(best, total)
        got, _ = tools.correctness(refs, calls, (WEATHER, SEARCH, CONVERT))
        assert got == pytest.approx(best / max(len(refs), len(calls)))


def test_correctness_feedback():
    """`feedback` states the expected calls and never quotes the response; `observed` says what differs."""
    _, correct = tools.verify(record(PARIS), block("get_weather", {"city": "Paris", "unit": "fahrenheit"}))
    assert correct.feedback == "Expected call: get_weather(city='Paris', unit='celsius')."
    assert correct.observed == "Found: argument 'unit': got 'fahrenheit', expected 'celsius'."
    _, correct = tools.verify(record(PARIS, JAZZ), block("get_stock_price", {"symbol": "X"}))
    assert correct.feedback == ("Expected calls: get_weather(city='Paris', unit='celsius'); "
                                "search_web(query='jazz', limit=10, offset=20).")
    assert "get_stock_price" not in correct.feedback
    assert "no call to get_weather" in correct.observed and "unexpected call 'get_stock_price'" in correct.observed
    _, correct = tools.verify(record(PARIS), tools.render_calls([PARIS]))
    assert correct.observed == "Found: all calls match."


# ---------------------------------------------------------------- BFCL's own rules (bfcl vs tokencredit semantics)

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import bfcl_edge_cases  # noqa: E402 - plain data, no torch


def array(item: str, kind: str = "array") -> dict:
    return {"type": kind, "items": {"type": item}}


def one_call(params: dict, answer: dict, given: dict, semantics: str, required=()) -> float:
    """correctness of `f(**given)` against BFCL's `answer` for `f(params)`, loaded as `--format bfcl` does."""
    function = bfcl_edge_cases.fn("f", tuple(required), **params)
    ref = ToolCall(**formats._bfcl_reference("r", 0, {"f": answer}, {"f": function}))
    spec = ToolSpec((function,), (ref,), semantics=semantics)
    return tools.verify(TaskRecord("r", "tools", "Call f.", None, spec), block("f", given))[1].score


ROUTES = {"routes": array("array")}


@pytest.mark.parametrize("params,answer,given,bfcl,tokencredit", [
    # a list in a list is compared exactly by BFCL: no normalization below the array's items
    (ROUTES, {"routes": [[["New York"]]]}, {"routes": [["new york"]]}, 0.0, 0.0),
    ({"cities": array("string")}, {"cities": [["New York"]]}, {"cities": ["new-york"]}, 1.0, 0.0),
    ({"trip": "dict"}, {"trip": [{"cities": [["Paris"]]}]}, {"trip": {"cities": ["paris"]}}, 0.0, 0.0),
    ({"trip": "dict"}, {"trip": [{"city": ["Paris"]}]}, {"trip": {"city": "PARIS"}}, 1.0, 0.0),
])
def test_bfcl_normalizes_strings_at_the_top_level_only(params, answer, given, bfcl, tokencredit):
    assert one_call(params, answer, given, "bfcl") == bfcl
    assert one_call(params, answer, given, "tokencredit") == tokencredit


@pytest.mark.parametrize("answer,given,bfcl,tokencredit", [
    (["New York"], "new york", 1.0, 0.0),             # a string in an `any` parameter is normalized
    ([["New York"]], ["new york"], 0.0, 0.0),         # a list is a "variable": compared with ==
    ([5], 5.0, 0.0, 1.0),                              # ... and must have the accepted value's type
    ([[1, 2]], [1.0, 2], 1.0, 1.0),                    # == takes 1.0 for 1
    ([5], "5", 0.0, 0.0),
])
def test_bfcl_reads_an_any_parameter_as_a_string(answer, given, bfcl, tokencredit):
    assert one_call({"v": "any"}, {"v": answer}, {"v": given}, "bfcl") == bfcl
    assert one_call({"v": "any"}, {"v": answer}, {"v": given}, "tokencredit") == tokencredit


@pytest.mark.parametrize("params,answer,given,bfcl,tokencredit", [
    ({"unit": "string"}, {"unit": ["cm", ""]}, {"unit": ""}, 1.0, 0.0),    # "" is an accepted value
    ({"unit": "string"}, {"unit": [""]}, {"unit": ""}, 1.0, 0.0),          # tokencredit: an extra argument
    ({"unit": "string"}, {"unit": [""]}, {"unit": "cm"}, 0.0, 0.0),
    ({"n": "integer"}, {"n": [5, ""]}, {"n": ""}, 0.0, 0.0),               # but not for an integer
    ({"tags": array("string")}, {"tags": [["a"], ""]}, {"tags": []}, 1.0, 0.0),
    ({"xs": array("float")}, {"xs": [[1.0], ""]}, {"xs": [1]}, 1.0, 1.0),  # no item check
    ({"xs": array("float")}, {"xs": [[1.0]]}, {"xs": [1]}, 0.0, 1.0),       # item check
    ({"size": "dict"}, {"size": [{"w": [1], "u": ["cm", ""]}]}, {"size": {"w": 1, "u": ""}}, 1.0, 0.0),
    ({"unit": "string"}, {"unit": ["cm", ""]}, {}, 1.0, 1.0),
])
def test_bfcl_takes_an_empty_string_as_a_passed_optional_value(params, answer, given, bfcl, tokencredit):
    assert one_call(params, answer, given, "bfcl") == bfcl
    assert one_call(params, answer, given, "tokencredit") == tokencredit


@pytest.mark.parametrize("params,answer,given,bfcl", [
    ({"o": "dict"}, {"o": [{"flag": [True]}]}, {"o": {"flag": 1}}, 1.0),
    ({"o": "dict"}, {"o": [{"n": [0]}]}, {"o": {"n": False}}, 1.0),
    ({"o": "dict"}, {"o": [{"ids": [[1, 2]]}]}, {"o": {"ids": [True, 2]}}, 1.0),
    ({"rows": array("dict")}, {"rows": [[{"k": [1]}]]}, {"rows": [{"k": True}]}, 1.0),
    ({"o": "dict"}, {"o": [{"n": [2]}]}, {"o": {"n": True}}, 0.0),
    ({"on": "boolean"}, {"on": [True]}, {"on": 1}, 0.0),   # at the top level BFCL checks the type
])
def test_bfcl_takes_true_for_one_inside_dicts(params, answer, given, bfcl):
    assert one_call(params, answer, given, "bfcl") == bfcl
    assert one_call(params, answer, given, "tokencredit") == 0.0  # tokencredit: True is no number


def test_bfcl_matches_parallel_calls_greedily():
    """BFCL: the first answer takes f(x=1), so the second (x=1 only) finds f(x=2) and fails;
    tokencredit's one-to-one matching pairs them the other way round."""
    function = bfcl_edge_cases.fn("f", ("x",), x="integer")
    answer = [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}]
    refs = tuple(ToolCall(**formats._bfcl_reference("r", i, a, {"f": function})) for i, a in enumerate(answer))
    for semantics, order, want in (("bfcl", [1, 2], 0.5), ("bfcl", [2, 1], 1.0), ("tokencredit", [1, 2], 1.0)):
        rec = TaskRecord("r", "tools", "Call f.", None, ToolSpec((function,), refs, semantics=semantics))
        response = "".join(block("f", {"x": x}) for x in order)
        assert tools.verify(rec, response)[1].score == want, (semantics, order)


def test_bfcl_semantics_on_native_records_reads_fields_as_bfcls_answer():
    """Without `possible_answer` a default also accepts "", and a dict value compares with ==."""
    function = bfcl_edge_cases.fn("f", ("o",), o="dict", unit="string")
    ref = ToolCall("f", {"o": {"flag": True}}, defaults={"unit": "cm"})
    assert tools.bfcl_answer(ref, function["parameters"]["properties"]) == {"o": [{"flag": [True]}],
                                                                           "unit": ["cm", ""]}
    for semantics, want in (("bfcl", 1.0), ("tokencredit", 0.0)):
        rec = TaskRecord("r", "tools", "Call f.", None, ToolSpec((function,), (ref,), semantics=semantics))
        assert tools.verify(rec, block("f", {"o": {"flag": 1}, "unit": ""}))[1].score == want


def edge_scores(tmp_path, semantics: str) -> list[float]:
    records, rejected = load_tasks(bfcl_edge_cases.write_files(tmp_path), "bfcl", semantics=semantics)
    assert rejected == []
    by_id = {r.id: r for r in records}
    scores = []
    for i, case in enumerate(bfcl_edge_cases.CASES):
        calls = [ToolCall(name, args) for call in case.output for name, args in call.items()]
        scores.append(tools.verify(by_id[f"edge_{i}"], tools.render_calls(calls))[1].score)
    return scores


def test_bfcl_edge_cases_score_as_bfcls_rules_say(tmp_path):
    """Every fresh edge case (bench/bfcl_edge_cases.jsonl) gets BFCL's verdict, worked out by hand from its checker."""
    cases = bfcl_edge_cases.CASES
    assert len(cases) >= 40 and all(sum(c.kind == k for c in cases) >= 8 for k in bfcl_edge_cases.KINDS)
    got = [score >= 1.0 for score in edge_scores(tmp_path / "bfcl", "bfcl")]
    assert [(i, c.kind) for i, (c, g) in enumerate(zip(cases, got)) if g != c.valid] == []
    # tokencredit's own, stricter semantics differs on these rules (README: "Public formats")
    strict = [score >= 1.0 for score in edge_scores(tmp_path / "tc", "tokencredit")]
    assert {c.kind for c, s in zip(cases, strict) if s != c.valid} == set(bfcl_edge_cases.KINDS)


def test_bfcl_edge_cases_agree_with_bfcl_eval_where_installed(tmp_path):
    import references

    if not references.available():
        pytest.skip("bfcl-eval not unpacked; run `python bench/references.py`")
    checker = references.bfcl()
    from bfcl_eval.constants.enums import Language

    cases = copy.deepcopy(bfcl_edge_cases.CASES)  # the checker may edit what it is given
    verdicts = [checker.ast_checker(c.functions, c.output, c.answer, Language.PYTHON, c.category,
                                    "tokencredit")["valid"] for c in cases]
    assert verdicts == [c.valid for c in bfcl_edge_cases.CASES]
    assert [s >= 1.0 for s in edge_scores(tmp_path, "bfcl")] == verdicts


# ---------------------------------------------------------------- parts, garbage, record errors

def test_response_parts_labels():
    text = ' <tool_call> {"arguments": {"name": "x"}, "name": "get_weather"} </tool_call>\nbye <tool_call>{'
    spans = tools.response_parts(record(PARIS), text)
    got = [(text[a:b], label) for a, b, label in spans]
    assert got == [(" ", "other"), ("<tool_call>", "tags"), (' {"arguments": ', "other"),
                   ('{"name": "x"}', "arguments"), (', "name": ', "other"), ('"get_weather"', "name"),
                   ("} ", "other"), ("</tool_call>", "tags"), ("\nbye ", "other"), ("<tool_call>", "tags"),
                   ("{", "other")]


GARBAGE = [
    "", "<tool_call>", "</tool_call><tool_call>", "<tool_call>" * 1000 + "</tool_call>",
    "<tool_call>" + "[" * 100_000 + "</tool_call>", "\x00\xff\ud800" * 1000,
    "<tool_call>" + json.dumps({"name": "get_weather", "arguments": {"city": "P" * 500_000}}) + "</tool_call>",
    '<tool_call>{"name": "get_weather", "arguments": {"city": NaN}}</tool_call>',
    "<tool_call></tool_call>" * 200,
]


@pytest.mark.parametrize("response", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_never_raises(response):
    rec = record(PARIS, JAZZ)
    assert all(0.0 <= s <= 1.0 for s in scores(rec, response))
    spans = tools.response_parts(rec, response)
    assert [a for a, _, _ in spans] == [0] + [b for _, b, _ in spans[:-1]] if spans else response == ""
    assert sum(b - a for a, b, _ in spans) == len(response)



_M = 2_000_000  # characters of each adversarial response
_PARIS_BLOCK = tools.render_calls([ToolCall("get_weather", {"city": "Paris"})])
ADVERSARIAL = [  # (2 MB response, format's found text, correctness score)
    ("<tool_call>" * (_M // 11), "no <tool_call>...</tool_call> block", 0.0),  # 87 s in the old regex at 132 KB
    ("<tool_call>x" * (_M // 12), "no <tool_call>...</tool_call> block", 0.0),
    ("</tool_call>" * (_M // 12), "no <tool_call>...</tool_call> block", 0.0),
    (_PARIS_BLOCK + "<tool_call>" * (_M // 11), "an unmatched tag", 1.0),
    ("<tool_call>" * (_M // 30) + _PARIS_BLOCK + "</tool_call>" * (_M // 30), "an unmatched tag", 0.0),
    (block("get_weather", {"city": "a" * _M}), "1 well-formed call", 0.0),
    (block("get_weather", {"city": "Paris", "pad": [1] * (_M // 3)}), "1 well-formed call", 0.5),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": ' + "[" * (_M // 2) + "]" * (_M // 2) + "}}</tool_call>",
     "block 1 is nested too deeply", 0.0),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": ' + "9" * _M + "}}</tool_call>",
     "block 1 is not valid JSON (Exceeds the limit (4300 digits) for integer string conversion", 0.0),
    ("<tool_call>" + "{" * _M, "no <tool_call>...</tool_call> block", 0.0),
    (_PARIS_BLOCK * (_M // len(_PARIS_BLOCK)), f"{_M // len(_PARIS_BLOCK)} blocks, more than the 1000", 0.0),
    ("<tool_call>{</tool_call>" * (_M // 24), f"{_M // 24} blocks, more than the 1000", 0.0),
]


@pytest.mark.parametrize("response, found, correct", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_responses_score(response, found, correct):
    """Any shape of 2 MB verifies (in linear time: `python -m bench verify` times these) with valid spans and parts
    that cover it."""
    rec = record(ToolCall("get_weather", {"city": "Paris"}))
    fmt, correctness = tools.verify(rec, response)
    assert fmt.observed.startswith(f"Found: {found}") and fmt.score == float(found == "1 well-formed call")
    assert correctness.score == correct
    for reward in (fmt, correctness):
        check_spans(reward.spans, response, reward.name)
    parts = tools.response_parts(rec, response)
    assert parts[0][0] == 0 and parts[-1][1] == len(response)
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


def test_a_call_nested_past_the_limit_is_malformed_not_an_error():
    """990 levels parse, but comparing or showing them again from deeper in the stack overflowed it."""
    value = "[" * 990 + "]" * 990
    response = '<tool_call>{"name": "get_weather", "arguments": {"city": ' + value + "}}</tool_call>"
    fmt, correctness = tools.verify(record(PARIS), response)
    assert (fmt.score, correctness.score) == (0.0, 0.0) and fmt.observed == "Found: block 1 is nested too deeply."
    limit = "[" * (tools._MAX_DEPTH - 2) + "]" * (tools._MAX_DEPTH - 2)  # with the call object and `arguments`
    assert tools.verify(record(PARIS), response.replace(value, limit))[0].score == 1.0


def test_block_scan_finds_what_the_lazy_regex_found():
    lazy = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    pieces = ["<tool_call>", "</tool_call>", "<tool_call", "x", "{}", "\n"]
    rng = random.Random(27)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        assert tools._blocks(text) == [m.span() for m in lazy.finditer(text)], text


BAD_RECORDS = [
    ((ToolCall("get_time", {}),), (WEATHER,), "reference_calls[0].name", "not one of the tools"),
    ((PARIS, ToolCall("get_weather", {"town": "Rome"})), (WEATHER,), "reference_calls[1].arguments.town", "no parameter"),
    ((ToolCall("search_web", {"query": "a", "limit": "3"}),), (SEARCH,), "reference_calls[0].arguments.limit",
     "expected a integer"),
    ((ToolCall("get_weather", {"city": "Rome", "unit": "kelvin"}),), (WEATHER,), "reference_calls[0].arguments.unit",
     "not one of"),
    ((ToolCall("get_weather", {"unit": "celsius"}),), (WEATHER,), "reference_calls[0].arguments", "missing required city"),
    ((), (WEATHER,), "reference_calls", "at least one call"),
    ((PARIS,), (WEATHER, {"name": "f", "parameters": {"properties": {"x": {"type": "decimal"}}}}),
     "tools[1].parameters.properties.x.type", "got 'decimal'"),
    ((PARIS,), (WEATHER, {"name": "f", "parameters": {"properties": {}, "required": ["y"]}}),
     "tools[1].parameters.required", "names of properties"),
    ((PARIS,), (WEATHER, {"name": "f"}), "tools[1].parameters", "'properties'"),
]


@pytest.mark.parametrize("calls,tool_list,field,reason", BAD_RECORDS)
def test_bad_records_name_id_and_field(calls, tool_list, field, reason):
    rec = record(*calls, record_id="bad-3", tool_list=tool_list)
    with pytest.raises(RecordError) as err:
        tools.validate(rec)
    assert (err.value.record_id, err.value.field) == ("bad-3", field)
    assert reason in err.value.reason
    with pytest.raises(RecordError):
        tools.verify(rec, tools.render_calls([PARIS]))


# ---------------------------------------------------------------- demo set

def load_demo() -> list[dict]:
    return [json.loads(line) for line in build_tools.OUT_JSONL.read_text(encoding="utf-8").splitlines()]


def test_demo_file_is_current_and_every_reference_scores_one():
    shipped = load_demo()
    assert shipped == build_tools.build()
    assert [r["id"] for r in shipped] == [f"tool-{i:04d}" for i in range(200)]
    assert sum(r["split"] == "test" for r in shipped) == 40
    assert 10 <= len({c["name"] for r in shipped for c in r["reference_calls"]}) <= 15
    assert 20 <= sum(len(r["reference_calls"]) == 2 for r in shipped) <= 80
    for obj in shipped:
        rec = build_tools.as_task_record(obj)
        assert len(obj["prompt"]) <= 450 and obj["prompt"].endswith(build_tools.INSTRUCTION)
        assert obj["reference_response"] == tools.render_calls(list(rec.spec.reference_calls))
        assert scores(rec, obj["reference_response"]) == (1.0, 1.0), obj["id"]


def test_demo_off_by_one_integer_is_wrong():
    """Every integer argument is stated in the request, and one more than it loses credit."""
    checked = 0
    for obj in load_demo():
        rec = build_tools.as_task_record(obj)
        for i, call in enumerate(obj["reference_calls"]):
            for key, value in call["arguments"].items():
                if type(value) is int:
                    assert str(value) in obj["prompt"]
                    calls = [dict(c, arguments=dict(c["arguments"])) for c in obj["reference_calls"]]
                    calls[i]["arguments"][key] = value + 1
                    wrong = tools.render_calls([ToolCall(c["name"], c["arguments"]) for c in calls])
                    assert scores(rec, wrong)[1] < 1.0
                    checked += 1
    assert checked >= 50


def test_demo_loads_through_the_task_loader():
    from tokencredit.verifiers.tasks import load_tasks

    records, rejected = load_tasks(build_tools.OUT_JSONL)
    assert not rejected and len(records) == 200
    for rec in records:
        tools.validate(rec)
