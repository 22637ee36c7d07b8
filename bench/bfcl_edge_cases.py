"""Fresh BFCL cases on the rules where BFCL's AST checker reads values its own way.

    CASES: [Case(kind, category, functions, answer, output, valid)]

`answer` is BFCL's ground truth ([{function: {parameter: [accepted values, "" = may be left
out]}}]), `output` the model's calls in BFCL's decoded form ([{function: {parameter: value}}]) and
`valid` the verdict BFCL's rule gives, worked out by hand from bfcl-eval 2026.3.23's
`ast_checker.py` (bench_fidelity.py checks it against the checker itself). Kinds:

    nested    strings are normalized at the top of an argument, an array's items and a dict's
              values only: deeper (a list in a list, a list or dict in a dict) they compare exactly
    any       an `any` parameter is read as a string: strings normalized, other values of the
              accepted value's type compared with ==
    empty     "" among the accepted values is itself accepted ("" for a string, [] for an array
              or a list of dicts, "" for a dict key), and turns off an array's item type check
    true_one  inside dicts and lists of dicts values compare with Python's ==: True == 1, 0 == False
    greedy    parallel calls: each answer, in order, takes the first output call it accepts, so an
              output that a one-to-one matching would accept can fail

Plain module (no torch): the unit tests read the cases too.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple


class Case(NamedTuple):
    kind: str
    category: str  # BFCL's: simple_python, parallel, parallel_multiple
    functions: list[dict]
    answer: list[dict]
    output: list[dict]
    valid: bool


def fn(name: str, required: tuple[str, ...] = (), /, **params: Any) -> dict:
    """A BFCL function; a parameter given as a string is its type (positional-only: a parameter may be `name`)."""
    props = {k: {"type": v} if isinstance(v, str) else v for k, v in params.items()}
    return {"name": name, "description": f"{name} for the fidelity cases.",
            "parameters": {"type": "dict", "properties": props, "required": list(required)}}


def array(item: str, kind: str = "array") -> dict:
    return {"type": kind, "items": {"type": item}}


def simple(kind: str, params: dict, accepted: dict, given: dict, valid: bool, required=()) -> Case:
    """One call to `f` with parameters `params` (name -> type)."""
    return Case(kind, "simple_python", [fn("f", tuple(required), **params)], [{"f": accepted}], [{"f": given}], valid)


NESTED = [
    simple("nested", {"routes": array("array")}, {"routes": [[["New York", "Boston"]]]},
           {"routes": [["new york", "Boston"]]}, False),
    simple("nested", {"routes": array("array")}, {"routes": [[["New York", "Boston"]]]},
           {"routes": [["New York", "Boston"]]}, True),
    simple("nested", {"routes": array("array")}, {"routes": [[["San Francisco"]]]},
           {"routes": [["San-Francisco"]]}, False),
    simple("nested", {"days": array("array", "tuple")}, {"days": [[["Mon", "Tue"]]]},
           {"days": [["mon", "tue"]]}, False),
    simple("nested", {"cities": array("string")}, {"cities": [["New York", "Boston"]]},
           {"cities": ["new york", "BOSTON"]}, True),  # the items of an array are normalized
    simple("nested", {"trip": "dict"}, {"trip": [{"cities": [["Paris", "Rome"]]}]},
           {"trip": {"cities": ["paris", "rome"]}}, False),
    simple("nested", {"trip": "dict"}, {"trip": [{"city": ["Paris"]}]}, {"trip": {"city": "PARIS"}}, True),
    simple("nested", {"trip": "dict"}, {"trip": [{"stop": [{"city": "Paris"}]}]},
           {"trip": {"stop": {"city": "paris"}}}, False),
    simple("nested", {"items": array("dict")}, {"items": [[{"tags": [["Red", "Blue"]]}]]},
           {"items": [{"tags": ["red", "blue"]}]}, False),
    simple("nested", {"items": array("dict")}, {"items": [[{"tag": ["Dark Red"]}]]},
           {"items": [{"tag": "dark-red"}]}, True),  # a dict's string values are normalized
]

ANY = [
    simple("any", {"v": "any"}, {"v": ["New York"]}, {"v": "new york"}, True),
    simple("any", {"v": "any"}, {"v": [["New York", "Boston"]]}, {"v": ["new york", "boston"]}, False),
    simple("any", {"v": "any"}, {"v": [["New York", "Boston"]]}, {"v": ["New York", "Boston"]}, True),
    simple("any", {"v": "any"}, {"v": [5]}, {"v": 5.0}, False),  # a float is no int when read as a variable
    simple("any", {"v": "any"}, {"v": [5]}, {"v": 5}, True),
    simple("any", {"v": "any"}, {"v": [{"a": "X"}]}, {"v": {"a": "x"}}, False),
    simple("any", {"v": "any"}, {"v": ["5"]}, {"v": 5}, False),
    simple("any", {"v": "any"}, {"v": [5]}, {"v": "5"}, False),
    simple("any", {"v": "any"}, {"v": [True]}, {"v": 1}, False),
    simple("any", {"v": "any"}, {"v": [[1, 2]]}, {"v": [1.0, 2]}, True),
]

EMPTY = [
    simple("empty", {"unit": "string"}, {"unit": ["cm", ""]}, {"unit": ""}, True),
    simple("empty", {"unit": "string"}, {"unit": [""]}, {"unit": ""}, True),
    simple("empty", {"unit": "string"}, {"unit": [""]}, {"unit": "cm"}, False),
    simple("empty", {"n": "integer"}, {"n": [5, ""]}, {"n": ""}, False),  # "" is no integer
    simple("empty", {"tags": array("string")}, {"tags": [["a"], ""]}, {"tags": []}, True),
    simple("empty", {"xs": array("float")}, {"xs": [[1.0, 2.0], ""]}, {"xs": [1, 2]}, True),
    simple("empty", {"xs": array("float")}, {"xs": [[1.0, 2.0]]}, {"xs": [1, 2]}, False),  # items checked
    simple("empty", {"size": "dict"}, {"size": [{"w": [1], "unit": ["cm", ""]}]}, {"size": {"w": 1, "unit": ""}}, True),
    simple("empty", {"rows": array("dict")}, {"rows": [[{"a": [1]}], ""]}, {"rows": []}, True),
    simple("empty", {"rows": array("dict")}, {"rows": [[{"a": [1], "b": ["x", ""]}]]},
           {"rows": [{"a": 1, "b": ""}]}, True),
    simple("empty", {"name": "string"}, {"name": ["abc", ""]}, {"name": ""}, True, required=("name",)),
    simple("empty", {"v": "any"}, {"v": ["x", ""]}, {"v": ""}, True),
    simple("empty", {"unit": "string"}, {"unit": ["cm", ""]}, {}, True),
]

TRUE_ONE = [
    simple("true_one", {"opts": "dict"}, {"opts": [{"flag": [True]}]}, {"opts": {"flag": 1}}, True),
    simple("true_one", {"opts": "dict"}, {"opts": [{"n": [1]}]}, {"opts": {"n": True}}, True),
    simple("true_one", {"opts": "dict"}, {"opts": [{"n": [0]}]}, {"opts": {"n": False}}, True),
    simple("true_one", {"opts": "dict"}, {"opts": [{"n": [1]}]}, {"opts": {"n": 1.0}}, True),
    simple("true_one", {"rows": array("dict")}, {"rows": [[{"on": [True]}, {"on": [False]}]]},
           {"rows": [{"on": 1}, {"on": 0}]}, True),
    simple("true_one", {"opts": "dict"}, {"opts": [{"ids": [[1, 2]]}]}, {"opts": {"ids": [True, 2]}}, True),
    simple("true_one", {"opts": "dict"}, {"opts": [{"n": [2]}]}, {"opts": {"n": True}}, False),
    simple("true_one", {"opts": "dict"}, {"opts": [{"flag": [True]}]}, {"opts": {"flag": "true"}}, False),
    simple("true_one", {"rows": array("dict")}, {"rows": [[{"k": [1]}]]}, {"rows": [{"k": True}]}, True),
    simple("true_one", {"opts": "dict"}, {"opts": [{"sub": [{"x": 1}]}]}, {"opts": {"sub": {"x": True}}}, True),
    simple("true_one", {"on": "boolean"}, {"on": [True]}, {"on": 1}, False),  # at the top the type is checked
]


def parallel(functions: list[dict], answer: list[dict], output: list[dict], valid: bool) -> Case:
    category = "parallel_multiple" if len(functions) > 1 else "parallel"
    return Case("greedy", category, functions, answer, output, valid)


F, G = fn("f", ("x",), x="integer"), fn("g", ("y",), y="integer")
CITY = fn("f", ("city",), city="string")
AB = fn("f", ("a",), a="integer", b="integer")
V = fn("f", ("v",), v="float")
D = fn("f", ("d",), d="dict")
GREEDY = [
    parallel([F], [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}], [{"f": {"x": 1}}, {"f": {"x": 2}}], False),
    parallel([F], [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}], [{"f": {"x": 2}}, {"f": {"x": 1}}], True),
    parallel([CITY], [{"f": {"city": ["NYC", "New York"]}}, {"f": {"city": ["NYC"]}}],
             [{"f": {"city": "nyc"}}, {"f": {"city": "New York"}}], False),
    parallel([AB], [{"f": {"a": [1], "b": ["", 2]}}, {"f": {"a": [1], "b": [2]}}],
             [{"f": {"a": 1, "b": 2}}, {"f": {"a": 1}}], False),
    parallel([F], [{"f": {"x": [1, 2, 3]}}, {"f": {"x": [1, 2]}}, {"f": {"x": [1]}}],
             [{"f": {"x": 3}}, {"f": {"x": 2}}, {"f": {"x": 1}}], True),
    parallel([F], [{"f": {"x": [1, 2, 3]}}, {"f": {"x": [1, 2]}}, {"f": {"x": [1]}}],
             [{"f": {"x": 1}}, {"f": {"x": 2}}, {"f": {"x": 3}}], False),
    parallel([F, G], [{"f": {"x": [1, 2]}}, {"g": {"y": [1]}}, {"f": {"x": [1]}}],
             [{"f": {"x": 1}}, {"g": {"y": 1}}, {"f": {"x": 2}}], False),
    parallel([V], [{"f": {"v": [1.0, 2.0]}}, {"f": {"v": [1.0]}}], [{"f": {"v": 1}}, {"f": {"v": 2}}], False),
    parallel([F], [{"f": {"x": [1]}}, {"f": {"x": [2]}}], [{"f": {"x": 2}}, {"f": {"x": 1}}, {"f": {"x": 1}}], False),
    parallel([F], [{"f": {"x": [1]}}, {"f": {"x": [2]}}], [{"f": {"x": 2}}, {"f": {"x": 1}}], True),
    parallel([D], [{"f": {"d": [{"a": [1, 2]}]}}, {"f": {"d": [{"a": [1]}]}}],
             [{"f": {"d": {"a": 1}}}, {"f": {"d": {"a": 2}}}], False),
]

CASES = [*NESTED, *ANY, *EMPTY, *TRUE_ONE, *GREEDY]
KINDS = ("nested", "any", "empty", "true_one", "greedy")


def write_files(folder: Path, cases: list[Case] = CASES) -> Path:
    """`cases` as BFCL question and possible-answer files in `folder` (ids edge_<index>), one pair per category."""
    (folder / "possible_answer").mkdir(parents=True, exist_ok=True)
    for i, case in enumerate(cases):
        record_id, name = f"edge_{i}", f"BFCL_v4_{case.category}.json"
        question = [[{"role": "user", "content": f"Edge case {i} ({case.kind})."}]]
        with open(folder / name, "a") as f:
            f.write(json.dumps({"id": record_id, "question": question, "function": case.functions}) + "\n")
        with open(folder / "possible_answer" / name, "a") as f:
            f.write(json.dumps({"id": record_id, "ground_truth": case.answer}) + "\n")
    return folder
