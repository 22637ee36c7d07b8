"""BFCL's AST checker rules for one argument (Python), as bfcl-eval 2026.3.23's `ast_checker.py` has them.

    accepted(value, possible, prop)   # possible: BFCL's list of accepted values, "" = may be left out

The `bfcl` semantics of `tokencredit.verifiers.tools` judges each argument with this when a reference call
carries BFCL's possible answer. Where BFCL's rule is its own, it is kept as is:
  - strings are normalized (`standardize_string`) at the top of a string or `any` argument, as the
    items of an array and as the values of a dict, nowhere deeper (["New York"] inside a list or a
    dict value compares exactly);
  - an `any` parameter is read as a string: a string value is normalized, another value must have
    the accepted value's type and equal it;
  - "" among the accepted values is itself accepted (a string argument passed as "", an array
    passed as [], a dict key or list of dicts passed empty), besides meaning "may be left out";
  - dict values and everything below the top level compare with Python's ==, so True == 1 == 1.0;
  - an array's items are type-checked one level deep, against the item type or the type of an
    accepted list's first item, and not at all when "" is accepted.
Where BFCL would raise (a malformed answer), the value is not accepted.
"""
from __future__ import annotations

import re
from typing import Any

# BFCL's PYTHON_TYPE_MAPPING, with JSON Schema's names for native records (number reads as float)
PYTHON_TYPES = {"string": str, "integer": int, "float": float, "number": float, "boolean": bool, "array": list,
                "tuple": list, "dict": dict, "object": dict, "any": str}
_IGNORED = re.compile(r"[ ,./\-_*^]")


def normalize(text: str) -> str:
    """BFCL's `standardize_string`: "April 1, 2024" and "april 1 2024" become the same."""
    return _IGNORED.sub("", text).lower().replace("'", '"')


def accepted(value: Any, possible: list, prop: dict) -> bool:
    """Whether BFCL's `simple_function_checker` accepts `value` for a parameter declared as `prop`."""
    declared = prop.get("type")
    expected = PYTHON_TYPES.get(declared)
    item_type = (prop.get("items") or {}).get("type") if declared in ("array", "tuple") else None
    nested = PYTHON_TYPES.get(item_type)
    if declared in ("float", "number") and type(value) is int:
        value = float(value)  # BFCL: "Allow python auto conversion from int to float"
    typed, is_variable = _type_check(value, possible, expected, nested)
    if not typed:
        return False
    if not is_variable:  # a "variable" (a value of the accepted value's own type) skips the special checks
        if expected is dict:
            return _dict_accepted(value, possible)
        if expected is list and nested is dict:
            return _list_of_dicts_accepted(value, possible)
        if expected is str:
            return normalize(value) in [normalize(p) for p in possible if type(p) is str]
        if expected is list:
            return _list_accepted(value, possible)
    return _member(value, possible)


def _answer_type(possible: Any) -> type | None:
    """BFCL's `get_possible_answer_type`: the type of the first accepted value other than ""."""
    return next((type(p) for p in possible if p != ""), None) if isinstance(possible, (list, str)) else None


def _type_check(value: Any, possible: list, expected: type | None, nested: type | None) -> tuple[bool, bool]:
    """BFCL's `type_checker`: (type accepted, the value is a "variable")."""
    answer_type = _answer_type(possible)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        # an item list that is not a list (such as "") passes the item check: BFCL only checks lists
        if any(type(p) is not list or all(_type_check(v, p, nested, None)[0] for v in value) for p in possible):
            return True, is_variable
        return False, False
    return answer_type is not None and type(value) is answer_type, True


def _list_accepted(value: list, possible: list) -> bool:
    """BFCL's `list_checker`: string items normalized on both sides, one level deep only."""
    got = [normalize(v) if type(v) is str else v for v in value]
    for p in possible:
        if isinstance(p, (list, str)) and got == [normalize(x) if type(x) is str else x for x in p]:
            return True  # BFCL iterates "" (and any string) as a sequence: "" accepts []
    return False


def _dict_accepted(value: dict, possible: list) -> bool:
    """BFCL's `dict_checker`: some accepted dict {key: [accepted values]} takes every key of `value`."""
    return any(p != "" and _dict_matches(value, p) for p in possible)


def _dict_matches(value: Any, answer: Any) -> bool:
    if not isinstance(value, dict) or not isinstance(answer, dict):
        return False
    if not all(isinstance(v, list) for v in answer.values()):
        return False
    for key, v in value.items():
        if key not in answer:
            return False
        got = normalize(v) if type(v) is str else v
        if not _member(got, [normalize(a) if type(a) is str else a for a in answer[key]]):
            return False
    return all(key in value or "" in accepted_values for key, accepted_values in answer.items())


def _list_of_dicts_accepted(value: list, possible: list) -> bool:
    """BFCL's `list_dict_checker`: item i against dict i of an accepted list ("" accepts [])."""
    for p in possible:
        if isinstance(p, (list, str)) and len(p) == len(value):
            if all(a != "" and _dict_matches(v, a) for v, a in zip(value, p)):
                return True
    return False


def _member(value: Any, values: list) -> bool:
    """Python's `in` (1 == True == 1.0), guarded: a value == cannot compare is not a member."""
    try:
        return value in values
    except (TypeError, RecursionError):
        return False
