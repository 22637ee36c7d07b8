"""Tool-calling verifier: format, correctness (in this order).

A response is one or more blocks `<tool_call>{"name": "...", "arguments": {...}}</tool_call>`.

    format       at least one block, every block a JSON object with a string `name` and an
                 object `arguments`, only whitespace outside the blocks                     1 / 0
    correctness  the well-formed calls against the reference calls                       [0, 1]

A block nested more than 100 levels deep is not well-formed; a response of more than `MAX_BLOCKS` (1000)
blocks scores 0 on both without its blocks being parsed. Parsing is linear in the response's length.

Correctness. With reference calls R (m of them) and the response's well-formed calls P (n):

    s(r, p) = [name_r == name_p] * matched(r, p) / (|args_r| + given_defaults(r, p) + extra(r, p))
              (= [name_r == name_p] when the denominator is 0)
    matched = reference arguments (and given defaults) that p passes with an accepted value
    given_defaults = optional arguments of r (its `defaults`) that p passes
    extra   = arguments of p that r neither requires nor has a default for
    correctness = max over one-to-one matchings M of R and P of  sum_{(r, p) in M} s(r, p) / max(m, n)

so argument order and call order do not matter, leaving out an optional argument costs nothing,
each extra argument dilutes its call's score and each extra (or missing) call dilutes the total.
An argument's accepted values are its reference value and its `alternatives`.

Values compare as JSON, type-aware (1 != "1", True != 1) except that numbers compare by value at
every depth (2 == 2.0, {"lat": 48} == {"lat": 48.0}); a parameter declared `integer` still needs
an integer. Semantics (`ToolSpec.semantics`):
    tokencredit  as above; strings compare exactly; the best one-to-one matching of calls
    bfcl         BFCL's AST checker exactly (`tokencredit.verifiers.bfcl_rules`): each argument judged against
                 BFCL's accepted values (the reference call's `possible_answer`, else made from
                 its arguments, defaults and alternatives): strings normalized where BFCL does it
                 (case, spaces and ,./-_*^ ignored, ' read as "; at the top of a value, an array's
                 items and a dict's values only), "" accepted where BFCL lists it, Python's ==
                 inside dicts (True == 1), array items type-checked one level deep; an argument
                 BFCL would not check (not in the answer or not declared) is extra. Calls match
                 greedily as BFCL's parallel checker does: each reference call, in order, takes
                 the first unused call that scores 1; the rest are matched best one-to-one for
                 partial credit (so the total is 1 exactly when BFCL's verdict is valid)
Parameter types are JSON Schema's (string, integer, number, boolean, array, object) or BFCL's
(float, dict, tuple, any).

A failed reward carries the spans of the response that break it (`format_spans`, `correctness_spans`):
the invalid JSON, the stray text, the place of a missing </tool_call>; in a wrong argument value or an
unexpected call's name, the characters from where it departs from the closest accepted one (as JSON) to
its end; for a missing argument, the character after the argument that precedes it in the reference call.

`response_parts` labels: `tags` (every <tool_call> and </tool_call> marker), `name` (the name
value of a well-formed block, quotes included), `arguments` (its arguments object), `other`.
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import numpy as np

from tokencredit.schemas.records import RecordError, RewardScore, TaskRecord, ToolCall, ToolSpec

from tokencredit.verifiers import bfcl_rules
from tokencredit.verifiers.parts import label_runs
from tokencredit.verifiers.spans import Span, merged

REWARDS = ("format", "correctness")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
FORMAT_RULE = 'Write each call as <tool_call>{"name": ..., "arguments": {...}}</tool_call> with nothing outside the tags.'
_TAG = re.compile(r"</?tool_call>")
_JSON_WS = re.compile(r"[ \t\n\r]*")
_SHOWN_CHARS = 40  # longest value or stray text quoted in feedback
# Deepest JSON nesting of a call taken as well-formed: the parser accepts ~1000 levels from a shallow stack, but
# comparing, showing and locating a value recurse again from deeper in the stack and would overflow it.
_MAX_DEPTH = 100
# Most blocks a response may hold: past it both rewards are 0 without parsing the blocks (each costs tens of
# microseconds: 83,333 of them, 2 MB, took 2 s), and `response_parts` labels the first ones only.
MAX_BLOCKS = 1000
_NUMBER = lambda v: type(v) in (int, float)  # noqa: E731 - bool is not a number here
_TYPES = {  # parameter type -> accepted Python values
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: type(v) is int,
    "number": _NUMBER,
    "boolean": lambda v: type(v) is bool,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    # BFCL's names
    "float": _NUMBER,
    "dict": lambda v: isinstance(v, dict),
    "tuple": lambda v: isinstance(v, list),
    "any": lambda v: True,
}
SEMANTICS = ("tokencredit", "bfcl")


# ---------------------------------------------------------------- record validation

def validate(record: TaskRecord) -> None:
    """Raise RecordError naming the record and the field when the tools or reference calls are unusable."""
    spec = record.spec
    if not isinstance(spec, ToolSpec):
        raise RecordError(record.id, "tools", f"expected a tool spec, got {type(spec).__name__}")
    for j, tool in enumerate(spec.tools):
        _validate_tool(record.id, f"tools[{j}]", tool)
    if not spec.reference_calls:
        raise RecordError(record.id, "reference_calls", "needs at least one call (format asks for one)")
    if spec.semantics not in SEMANTICS:
        raise RecordError(record.id, "semantics", f"unknown semantics {spec.semantics!r}; known: {', '.join(SEMANTICS)}")
    by_name = {tool["name"]: tool for tool in spec.tools}
    for i, call in enumerate(spec.reference_calls):
        if call.name not in by_name:
            raise RecordError(record.id, f"reference_calls[{i}].name", f"{call.name!r} is not one of the tools")
        _validate_reference(record.id, f"reference_calls[{i}]", call, by_name[call.name]["parameters"],
                            check_values=spec.semantics != "bfcl")


def _validate_reference(record_id: str, where: str, call: ToolCall, params: dict, check_values: bool) -> None:
    """BFCL holds answers to no schema (a value of another type is "a variable", enums are not
    enforced), so under its semantics only the names are checked."""
    both = sorted(set(call.arguments) & set(call.defaults))
    if both:
        raise RecordError(record_id, f"{where}.defaults", f"{', '.join(both)} also in arguments; give each once")
    for group in ("arguments", "defaults", "alternatives"):
        for key, value in getattr(call, group).items():
            field = f"{where}.{group}.{key}"
            prop = params["properties"].get(key)
            if prop is None:
                raise RecordError(record_id, field, f"{call.name} has no parameter {key!r}")
            values = value if group == "alternatives" else [value]
            if group == "alternatives" and key not in call.arguments and key not in call.defaults:
                raise RecordError(record_id, field, f"alternatives of {key!r}, which is neither an argument nor a default")
            for v in values:
                if _has_non_finite(v):
                    raise RecordError(record_id, field, f"{v!r} holds NaN or Infinity, which no response can equal")
            for v in values if check_values else ():
                if not _TYPES[prop["type"]](v):
                    raise RecordError(record_id, field, f"expected a {prop['type']}, got {v!r}")
                if "enum" in prop and v not in prop["enum"]:
                    raise RecordError(record_id, field, f"{v!r} is not one of {prop['enum']}")
    for key, accepted in (call.possible_answer or {}).items():
        if _has_non_finite(accepted):
            raise RecordError(record_id, f"{where}.possible_answer.{key}",
                              f"{accepted!r} holds NaN or Infinity, which no response can equal")
    missing = [k for k in params.get("required", []) if k not in call.arguments]
    if missing:
        raise RecordError(record_id, f"{where}.arguments", f"missing required {', '.join(missing)}")


def _depth(value: Any) -> int:
    """Levels of nested lists and dicts in a loaded JSON value (a scalar is 0), iteratively."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level + 1)
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _has_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:  # iterative: a loaded value may nest as deeply as the JSON parser allows
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def _validate_tool(record_id: str, where: str, tool: Any) -> None:
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise RecordError(record_id, f"{where}.name", "a tool needs a string name")
    params = tool.get("parameters")
    if not isinstance(params, dict) or not isinstance(params.get("properties"), dict):
        raise RecordError(record_id, f"{where}.parameters", "expected an object with 'properties'")
    for key, prop in params["properties"].items():
        if not isinstance(prop, dict) or prop.get("type") not in _TYPES:
            got = prop.get("type") if isinstance(prop, dict) else prop
            raise RecordError(record_id, f"{where}.parameters.properties.{key}.type",
                              f"expected one of {', '.join(_TYPES)}, got {got!r}")
    required = params.get("required", [])
    if not isinstance(required, list) or not set(required) <= set(params["properties"]):
        raise RecordError(record_id, f"{where}.parameters.required", "must list names of properties")


# ---------------------------------------------------------------- parsing

def _blocks(response: str) -> list[tuple[int, int]]:
    """(start, end) of each `<tool_call>...</tool_call>` block, the body being response[start + len(OPEN):end -
    len(CLOSE)]: an opening tag up to the first closing tag after it, as the lazy regex
    `<tool_call>(.*?)</tool_call>` finds them, in one pass (that regex rescans the rest of the response from
    every unclosed tag: 12,000 of them took 87 s)."""
    blocks, pos = [], 0
    while (opened := response.find(OPEN, pos)) >= 0:
        closed = response.find(CLOSE, opened + len(OPEN))
        if closed < 0:
            break  # no closing tag after this one, so none after any later opening tag either
        pos = closed + len(CLOSE)
        blocks.append((opened, pos))
    return blocks


def _body(response: str, block: tuple[int, int]) -> tuple[str, int]:
    """(a block's text between its tags, the body's offset in the response)."""
    return response[block[0] + len(OPEN):block[1] - len(CLOSE)], block[0] + len(OPEN)


def parse_calls(response: str) -> tuple[list[ToolCall], str | None]:
    """(the calls of the well-formed blocks, None when the whole response is well-formed else the first problem)."""
    calls, problems = [], []
    blocks = _blocks(response)
    for i, block in enumerate(blocks):
        call, why = _parse_block(_body(response, block)[0])
        if call is None:
            problems.append(f"block {i + 1} {why}")
        else:
            calls.append(call)
    gaps = zip([0] + [end for _, end in blocks], [start for start, _ in blocks] + [len(response)])
    outside = "".join(response[a:b] for a, b in gaps).strip()
    if not blocks:
        problems.insert(0, "no <tool_call>...</tool_call> block")
    elif _TAG.search(outside):
        problems.insert(0, "an unmatched tag")
    elif outside:
        problems.insert(0, f"text outside the tags: {_clip(outside)!r}")
    return calls, problems[0] if problems else None


def _parse_block(body: str) -> tuple[ToolCall | None, str]:
    try:
        obj = json.loads(body)
    except ValueError as e:
        return None, f"is not valid JSON ({str(e).split(':')[0]})"
    except RecursionError:
        return None, "is nested too deeply"
    if not isinstance(obj, dict):
        return None, "is not a JSON object"
    if _depth(obj) > _MAX_DEPTH:
        return None, "is nested too deeply"
    if not isinstance(obj.get("name"), str):
        return None, "has no string 'name'"
    if not isinstance(obj.get("arguments"), dict):
        return None, "has no object 'arguments'"
    return ToolCall(obj["name"], obj["arguments"]), ""


# ---------------------------------------------------------------- scoring

def same_value(got: Any, want: Any, param_type: str | None = None) -> bool:
    """JSON equality that keeps types apart (1 != "1", True != 1) but compares numbers by value at
    every depth; an `integer` parameter needs an integer."""
    if param_type == "integer" and type(got) is not int and type(want) is int:
        return False
    if _NUMBER(got) and _NUMBER(want):
        return got == want
    if type(got) is not type(want):
        return False
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return len(got) == len(want) and all(same_value(g, w) for g, w in zip(got, want))
    return got == want


def accepts(value: Any, accepted: list, prop: dict) -> bool:
    """Whether `value` equals one of the accepted values of a parameter declared as `prop` (tokencredit)."""
    return any(same_value(value, want, prop.get("type")) for want in accepted)


def bfcl_answer(ref: ToolCall, params: dict[str, dict]) -> dict[str, list]:
    """BFCL's accepted values per parameter: the call's `possible_answer`, or made from its fields
    (a default also accepts "", a dict value becomes {key: [value]} as BFCL writes it)."""
    if ref.possible_answer is not None:
        return ref.possible_answer
    answer = {}
    for key, value in [*ref.arguments.items(), *ref.defaults.items()]:
        values = [_as_bfcl_value(v, params.get(key, {})) for v in (value, *ref.alternatives.get(key, ()))]
        answer[key] = values + ([""] if key in ref.defaults else [])
    return answer


def _as_bfcl_value(value: Any, prop: dict) -> Any:
    dict_types = ("dict", "object")
    if prop.get("type") in dict_types and isinstance(value, dict):
        return {k: [v] for k, v in value.items()}
    item_type = (prop.get("items") or {}).get("type")
    if prop.get("type") in ("array", "tuple") and item_type in dict_types and isinstance(value, list):
        return [_as_bfcl_value(v, {"type": item_type}) for v in value]
    return value


def call_score(ref: ToolCall, got: ToolCall, params: dict[str, dict],
               semantics: str = "tokencredit") -> tuple[float, list[str]]:
    """s(ref, got) of the module docstring and the argument mismatches; `params` is ref's properties."""
    score, notes, _ = _call_check(ref, got, params, semantics)
    return score, notes


def _call_check(ref: ToolCall, got: ToolCall, params: dict[str, dict],
                semantics: str) -> tuple[float, list[str], list[tuple[str, str]]]:
    """(s(ref, got), mismatch notes, faults): a fault is ("missing" | "value" | "extra", argument name)."""
    if got.name != ref.name:
        return 0.0, [], []  # `correctness` reports the missing and the unexpected call
    if semantics == "bfcl":
        return _bfcl_call_check(ref, got, params)
    notes, faults, matched, given_defaults = [], [], 0, 0
    for key, want in [*ref.arguments.items(), *ref.defaults.items()]:
        optional = key in ref.defaults
        if key not in got.arguments:
            notes += [] if optional else [f"missing argument {key!r}"]
            faults += [] if optional else [("missing", key)]
            continue
        given_defaults += optional
        accepted = [want, *ref.alternatives.get(key, ())]
        if accepts(got.arguments[key], accepted, params.get(key, {})):
            matched += 1
        else:
            notes.append(f"argument {key!r}: got {_show(got.arguments[key])}, expected {_alternatives(accepted)}")
            faults.append(("value", key))
    extra = [k for k in got.arguments if k not in ref.arguments and k not in ref.defaults]
    notes += [f"unexpected argument {_clip(k)!r}" for k in extra]
    faults += [("extra", k) for k in extra]
    denom = len(ref.arguments) + given_defaults + len(extra)
    return (matched / denom if denom else 1.0), notes, faults


def _match(refs: list[ToolCall], calls: list[ToolCall], tools: tuple[dict, ...], semantics: str):
    """The matching of the module docstring (BFCL's greedy first matches under `bfcl`, then the best one-to-one
    matching of the rest): (checks [ref][call] of `_call_check`, gain matrix, rows, cols)."""
    props = {t["name"]: t["parameters"]["properties"] for t in tools}
    checks = [[_call_check(r, c, props[r.name], semantics) for c in calls] for r in refs]
    gain = np.array([[s for s, _, _ in row] for row in checks])
    rows, cols = _best_matching(gain, _greedy_matches(gain) if semantics == "bfcl" else [])
    return checks, gain, rows, cols


def _bfcl_call_check(ref: ToolCall, got: ToolCall,
                     params: dict[str, dict]) -> tuple[float, list[str], list[tuple[str, str]]]:
    """`_call_check` with BFCL's verdict per argument: s = 1 exactly when BFCL's simple checker says valid."""
    answer = bfcl_answer(ref, params)
    # must be passed: a required argument, or one whose accepted values lack ""
    needed = {k for k, accepted in answer.items() if k in ref.arguments or "" not in accepted}
    notes, faults, matched, given_optional, extra = [], [], 0, 0, []
    for key, value in got.arguments.items():
        if key not in answer or key not in params:
            extra.append(key)  # BFCL: "Unexpected parameter"
            continue
        given_optional += key not in needed
        if bfcl_rules.accepted(value, answer[key], params[key]):
            matched += 1
        else:
            notes.append(f"argument {key!r}: got {_show(value)}, expected {_alternatives(answer[key])}")
            faults.append(("value", key))
    missing = sorted(needed - set(got.arguments))
    notes += [f"missing argument {k!r}" for k in missing]
    notes += [f"unexpected argument {_clip(k)!r}" for k in extra]
    faults += [("missing", k) for k in missing] + [("extra", k) for k in extra]
    denom = len(needed) + given_optional + len(extra)
    return (matched / denom if denom else 1.0), notes, faults


def correctness(refs: list[ToolCall], calls: list[ToolCall], tools: tuple[dict, ...],
                semantics: str = "tokencredit") -> tuple[float, list[str]]:
    """Best one-to-one matching score of the module docstring (greedy first under `bfcl`), and the mismatch notes."""
    if not calls:
        return 0.0, ["no well-formed call"]
    checks, gain, rows, cols = _match(refs, calls, tools, semantics)
    notes, used = [], set()
    for i, j in zip(rows, cols):
        if refs[i].name == calls[j].name:
            notes += checks[i][j][1]
            used.add(j)
        else:
            notes.append(f"no call to {refs[i].name}")
    notes += [f"no call to {refs[i].name}" for i in range(len(refs)) if i not in set(rows)]
    notes += [f"unexpected call {_clip(calls[j].name)!r}" for j in range(len(calls)) if j not in used]
    return float(gain[rows, cols].sum()) / max(len(refs), len(calls)), notes


def _greedy_matches(gain: np.ndarray) -> list[tuple[int, int]]:
    """BFCL's `parallel_function_checker_no_order`: each reference, in order, takes the first
    unused call it fully accepts; it does not look back, so a one-to-one matching can do better."""
    taken, fixed = set(), []
    for i, row in enumerate(gain):
        j = next((j for j, s in enumerate(row) if s >= 1.0 and j not in taken), None)
        if j is not None:
            taken.add(j)
            fixed.append((i, j))
    return fixed


def _best_matching(gain: np.ndarray, fixed: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The pairs `fixed` and the best one-to-one matching of the other rows and columns."""
    from scipy.optimize import linear_sum_assignment  # scipy loads in ~1 s: not at the command line's start

    free_rows = [i for i in range(gain.shape[0]) if i not in {i for i, _ in fixed}]
    free_cols = [j for j in range(gain.shape[1]) if j not in {j for _, j in fixed}]
    sub = gain[np.ix_(np.array(free_rows, dtype=int), np.array(free_cols, dtype=int))]
    rows, cols = linear_sum_assignment(sub, maximize=True)
    pairs = fixed + [(free_rows[i], free_cols[j]) for i, j in zip(rows.tolist(), cols.tolist())]
    return [i for i, _ in pairs], [j for _, j in pairs]


def render_calls(calls: list[ToolCall]) -> str:
    """The canonical response: one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` per line."""
    return "\n".join(f"{OPEN}{json.dumps({'name': c.name, 'arguments': c.arguments})}{CLOSE}" for c in calls)


def signature(call: ToolCall) -> str:
    """get_weather(city='Paris' or 'Paris, France', [unit='celsius']): optional arguments in brackets."""
    def shown(key: str, value: Any) -> str:
        return f"{key}={_alternatives([value, *call.alternatives.get(key, ())])}"
    args = [shown(k, v) for k, v in call.arguments.items()] + [f"[{shown(k, v)}]" for k, v in call.defaults.items()]
    return f"{call.name}({', '.join(args)})"


def _alternatives(values: list) -> str:
    return " or ".join(_show(v) for v in values)


def reward_names(record: TaskRecord) -> list[str]:
    return list(REWARDS)


def verify(record: TaskRecord, response: str) -> list[RewardScore]:
    """[format, correctness]; raises only RecordError (bad tools or reference calls)."""
    validate(record)
    refs = list(record.spec.reference_calls)
    expected = f"Expected call{'s' if len(refs) > 1 else ''}: {'; '.join(signature(r) for r in refs)}."
    blocks = _blocks(response)
    if len(blocks) > MAX_BLOCKS:
        found = f"Found: {len(blocks)} blocks, more than the {MAX_BLOCKS} a response may hold."
        past = ((blocks[MAX_BLOCKS][0], blocks[-1][1]),)  # the blocks past the limit
        return [RewardScore("format", 0.0, FORMAT_RULE, found, past), RewardScore("correctness", 0.0, expected, found)]
    calls, problem = parse_calls(response)
    fmt_found = problem or f"{len(calls)} well-formed call{'s' if len(calls) > 1 else ''}"
    score, notes = correctness(refs, calls, record.spec.tools, record.spec.semantics)
    fmt_spans = format_spans(response) if problem is not None else ()
    call_spans = correctness_spans(response, refs, record.spec.tools, record.spec.semantics) if score < 1 else ()
    return [
        RewardScore("format", float(problem is None), FORMAT_RULE, f"Found: {fmt_found}.", fmt_spans),
        RewardScore("correctness", score, expected, f"Found: {'; '.join(notes) if notes else 'all calls match'}.",
                    call_spans),
    ]


def response_parts(record: TaskRecord, response: str) -> list[tuple[int, int, str]]:
    """Contiguous (char_start, char_end, label) spans covering `response`; labels in the module docstring."""
    labels = ["other"] * len(response)
    for block in _blocks(response)[:MAX_BLOCKS]:
        body, offset = _body(response, block)
        if _parse_block(body)[0] is not None:
            members = _member_spans(body, offset)
            for key in ("name", "arguments"):
                start, end = members[key]
                labels[start:end] = [key] * (end - start)
    for m in _TAG.finditer(response):
        labels[m.start():m.end()] = ["tags"] * (m.end() - m.start())
    return label_runs(labels)


def _member_spans(body: str, offset: int) -> dict[str, tuple[int, int]]:
    """Character spans of the top-level values of `body`, a text known to parse as a JSON object."""
    decoder, spans = json.JSONDecoder(), {}
    i = _JSON_WS.match(body, 0).end() + 1  # past "{"
    while True:
        i = _JSON_WS.match(body, i).end()
        if body[i] == "}":
            return spans
        key, i = decoder.raw_decode(body, i)
        i = _JSON_WS.match(body, _JSON_WS.match(body, i).end() + 1).end()  # past ":"
        _, end = decoder.raw_decode(body, i)
        spans[key] = (offset + i, offset + end)  # a repeated key keeps its last value, as json.loads does
        i = _JSON_WS.match(body, end).end()
        i += body[i] == ","


# ---------------------------------------------------------------- spans: where a response breaks a reward

def format_spans(response: str) -> tuple[Span, ...]:
    """Where a response breaks `format`: the invalid JSON of a block (the parser's error position), the
    body of a block with no string name or object arguments, text outside the blocks, and after an
    opening tag never closed what follows its JSON, or the last character (where </tool_call> belongs)."""
    spans, last = [], 0
    for block in _blocks(response):
        spans += _outside(response, last, block[0]) + _block_spans(response, block)
        last = block[1]
    return merged(spans + _outside(response, last, len(response)))


def _block_spans(response: str, block: tuple[int, int]) -> list[Span]:
    body, offset = _body(response, block)
    if not body.strip():
        return [block]
    try:
        json.loads(body)
    except json.JSONDecodeError as error:
        return [_char_at(offset + error.pos, offset, offset + len(body))]
    except (ValueError, RecursionError):
        return [(offset, offset + len(body))]
    return [(offset, offset + len(body))] if _parse_block(body)[0] is None else []


def _outside(response: str, start: int, end: int) -> list[Span]:
    opened = response.find(OPEN, start, end)
    if opened < 0:
        return _stray(response, start, end)
    return _stray(response, start, opened) + _unclosed(response, opened, end)


def _stray(response: str, start: int, end: int) -> list[Span]:
    """The non-blank text of response[start:end] as one span (an unmatched </tool_call> included)."""
    text = response[start:end]
    lead, tail = len(text) - len(text.lstrip()), len(text.rstrip())
    return [(start + lead, start + tail)] if tail > lead else []


def _unclosed(response: str, opened: int, end: int) -> list[Span]:
    body = _JSON_WS.match(response, opened + len(OPEN)).end()
    try:
        _, after = json.JSONDecoder().raw_decode(response[:end], body)
    except json.JSONDecodeError as error:
        return [_char_at(error.pos, opened, end)]
    except (ValueError, RecursionError):
        return [(opened, end)]
    return _stray(response, after, end) or [(end - 1, end)]


def _char_at(pos: int, lo: int, hi: int) -> Span:
    """The one character at `pos`, kept inside [lo, hi) (a parser error may point just past the end)."""
    pos = max(lo, min(pos, hi - 1))
    return pos, pos + 1


def _located_calls(response: str) -> list[tuple[ToolCall, Span, Span, dict[str, Span]]]:
    """Each well-formed call (the order of `parse_calls`) with its name's span, its arguments object's span
    and the span of each argument's value."""
    located = []
    for block in _blocks(response):
        body, offset = _body(response, block)
        call = _parse_block(body)[0]
        if call is not None:
            members = _member_spans(body, offset)
            start, end = members["arguments"]
            located.append((call, members["name"], (start, end), _member_spans(response[start:end], start)))
    return located


def correctness_spans(response: str, refs: list[ToolCall], tools: tuple[dict, ...],
                      semantics: str = "tokencredit") -> tuple[Span, ...]:
    """Where the calls break `correctness`: in a wrong value, from where it departs from the closest accepted
    value; the value of an unexpected argument; the place of a missing argument (`_gap`); in the name of an
    unexpected call, from where it departs from the closest expected name. A call missing altogether has no
    place: no span."""
    located = _located_calls(response)
    if not located:
        return ()
    calls = [c for c, *_ in located]
    checks, _, rows, cols = _match(refs, calls, tools, semantics)
    spans, used = [], set()
    for i, j in zip(rows, cols):
        if refs[i].name != calls[j].name:
            continue
        used.add(j)
        _, _, arguments, values = located[j]
        for kind, key in checks[i][j][2]:
            if kind == "missing":
                spans.append(_gap(response, key, refs[i], arguments, values))
            elif kind == "value":
                spans.append(_departure(response, values[key], _accepted_values(refs[i], key)))
            else:
                spans.append(values[key])
    names = [r.name for r in refs]
    spans += [_departure(response, located[j][1], names) for j in range(len(calls)) if j not in used]
    return merged(spans)


def _accepted_values(ref: ToolCall, key: str) -> list[Any]:
    want = ref.arguments[key] if key in ref.arguments else ref.defaults.get(key)
    return [want, *ref.alternatives.get(key, ())]


def _departure(response: str, span: Span, accepted: list[Any]) -> Span:
    """The part of a value's JSON text from the first character where it departs from the closest accepted
    value's JSON text to its end (its last character when it is a prefix of one): a wrong digit, a wrong word
    in a string, not the quotes around it."""
    start, end = span
    text = response[start:end]
    common = max((len(os.path.commonprefix([text, json.dumps(a, ensure_ascii=False)])) for a in accepted),
                 default=0)
    return (start + common, end) if common < len(text) else (end - 1, end)


def _gap(response: str, key: str, ref: ToolCall, arguments: Span, values: dict[str, Span]) -> Span:
    """Where a missing argument belongs: the character just after the value of the argument before it in the
    reference call's order, or the first character inside the arguments object when none is before it."""
    order = [*ref.arguments, *ref.defaults]
    before = [k for k in order[:order.index(key)] if k in values]
    start, end = arguments
    if before:
        at = values[before[-1]][1]
    else:
        inner = response[start + 1:end]
        at = start + 1 + len(inner) - len(inner.lstrip())
    at = min(at, end - 1)
    return at, at + 1


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _clip(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _SHOWN_CHARS else flat[:_SHOWN_CHARS] + "..."
