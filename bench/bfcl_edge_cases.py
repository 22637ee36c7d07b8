"""Fresh BFCL cases on the rules where BFCL's AST checker reads values its own way: bfcl_edge_cases.jsonl, loaded.

    CASES: [Case(kind, category, functions, answer, output, valid)]

A line of the file: {kind, category, functions: [[name, required, {parameter: type name or JSON schema}]], answer,
output, valid, why (optional: the rule the verdict turns on)}. `answer` is BFCL's ground truth
([{function: {parameter: [accepted values, "" = may be left out]}}]), `output` the model's calls in BFCL's decoded
form ([{function: {parameter: value}}]) and `valid` the verdict BFCL's rule gives, worked out by hand from bfcl-eval 2026.3.23's
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

KINDS = ("nested", "any", "empty", "true_one", "greedy")


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


def load(path: Path = Path(__file__).with_suffix(".jsonl")) -> list[Case]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [Case(r["kind"], r["category"], [fn(name, tuple(required), **params) for name, required, params in
                                            r["functions"]], r["answer"], r["output"], r["valid"]) for r in rows]


CASES = load()


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
