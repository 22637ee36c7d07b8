"""Built-in verifiers on hostile 2 MB responses: the worst time of `verify` (the bounded call) and of
`response_parts` (which the credits table calls outside it) over responses of every shape, median of 3 each.

    python -m bench verifier_inputs [--quick]

Tool calls: unclosed, nested and stray tags (the old lazy regex took 87.6 s on 12,000 unclosed tags, 132 KB),
one huge argument, deep nesting, a huge integer, 83,333 blocks. Instructions: 2 MB of "A. " under
`sentence_count` (666,666 Punkt sentences: ~20 s if all were found).
"""
from __future__ import annotations

import json

from common import Harness
from registry import Target, benchmark

from tokencredit import verifiers
from tokencredit.schemas.records import Constraint, InstructionSpec, TaskRecord, ToolCall, ToolSpec

TARGET_S = 1.0
M = 2_000_000  # characters of a response (--quick: a tenth)
WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"]}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def tool_shapes(size: int) -> dict[str, str]:
    def call(value: str) -> str:
        return '<tool_call>{"name": "get_weather", "arguments": {"city": ' + value + "}}</tool_call>"
    return {
        "unclosed tags": "<tool_call>" * (size // 11),
        "unclosed tags with text": "<tool_call>x" * (size // 12),
        "closing tags": "</tool_call>" * (size // 12),
        "nested tags": "<tool_call>" * (size // 30) + CALL + "</tool_call>" * (size // 30),
        "huge string": call(json.dumps("a" * size)),
        "deep nesting": call("[" * (size // 2) + "]" * (size // 2)),
        "huge integer": call("9" * size),
        f"{size // 24:,} bad blocks": "<tool_call>{</tool_call>" * (size // 24),
        f"{size // len(CALL):,} good blocks": CALL * (size // len(CALL)),
    }


@benchmark("verifier_inputs", measures="Built-in verifiers on 2 MB responses of every shape: the worst `verify` and "
           "`response_parts` (called by the credits table) time, median of 3 per shape. The lazy tool-call regex this "
           "replaced took 87.6 s on 12,000 unclosed tags (132 KB).", results=("speed.json",),
           targets=(Target("verifier_inputs_worst_verify_s", "<", TARGET_S), Target("verifier_inputs_worst_parts_s", "<", TARGET_S)))
def run(h: Harness) -> dict:
    h.repeats, size = (1, M // 10) if h.quick else (3, M)
    tools = TaskRecord("t", "tools", "p", None, ToolSpec((WEATHER,), (ToolCall("get_weather", {"city": "Paris"}),)))
    sentences = TaskRecord("i", "instructions", "p", None,
                           InstructionSpec((Constraint("sentence_count", {"min": 2, "max": 3}),)))
    cases = [(tools, name, text) for name, text in tool_shapes(size).items()]
    cases.append((sentences, '"A. " under sentence_count', "A. " * (size // 3)))
    verify_s, parts_s = {}, {}
    for record, name, text in cases:
        verify_s[name] = h.median_time(lambda: verifiers.verify(record, text), h.repeats)[0]
        parts_s[name] = h.median_time(lambda: verifiers.response_parts(record, text), h.repeats)[0]
    worst_verify, worst_parts = max(verify_s, key=verify_s.get), max(parts_s, key=parts_s.get)
    figures = {"verifier_inputs_worst_verify_s": round(verify_s[worst_verify], 4),
               "verifier_inputs_worst_parts_s": round(parts_s[worst_parts], 4)}
    h.update_figures(figures)
    return figures | {"shapes": len(cases), "worst_verify_shape": worst_verify, "worst_parts_shape": worst_parts}
