"""Built-in verifiers on hostile 2 MB responses: the worst time of `verify` (the bounded call) and of
`response_parts` (which the credits table calls outside it) over responses of every shape, median of 3 each.

    python bench/bench_verifier_inputs.py [--quick]

Tool calls: unclosed, nested and stray tags (the old lazy regex took 87.6 s on 12,000 unclosed tags, 132 KB),
one huge argument, deep nesting, a huge integer, 83,333 blocks. Instructions: 2 MB of "A. " under
`sentence_count` (666,666 Punkt sentences: ~20 s if all were found).
"""
from __future__ import annotations

import argparse
import json

from common import median_time, update_figures, upsert_result, verdict

from tokencredit import verifiers
from tokencredit.schemas.records import Constraint, InstructionSpec, TaskRecord, ToolCall, ToolSpec

TARGET_S = 1.0
M = 2_000_000
WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"]}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def tool_shapes() -> dict[str, str]:
    def call(value: str) -> str:
        return '<tool_call>{"name": "get_weather", "arguments": {"city": ' + value + "}}</tool_call>"
    return {
        "unclosed tags": "<tool_call>" * (M // 11),
        "unclosed tags with text": "<tool_call>x" * (M // 12),
        "closing tags": "</tool_call>" * (M // 12),
        "nested tags": "<tool_call>" * (M // 30) + CALL + "</tool_call>" * (M // 30),
        "huge string": call(json.dumps("a" * M)),
        "deep nesting": call("[" * (M // 2) + "]" * (M // 2)),
        "huge integer": call("9" * M),
        f"{M // 24:,} bad blocks": "<tool_call>{</tool_call>" * (M // 24),
        f"{M // len(CALL):,} good blocks": CALL * (M // len(CALL)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 timing per case instead of 3")
    repeats = 1 if parser.parse_args().quick else 3
    tools = TaskRecord("t", "tools", "p", None, ToolSpec((WEATHER,), (ToolCall("get_weather", {"city": "Paris"}),)))
    sentences = TaskRecord("i", "instructions", "p", None,
                           InstructionSpec((Constraint("sentence_count", {"min": 2, "max": 3}),)))
    cases = [(tools, name, text) for name, text in tool_shapes().items()]
    cases.append((sentences, '"A. " under sentence_count', "A. " * (M // 3)))
    verify_s, parts_s = {}, {}
    for record, name, text in cases:
        verify_s[name] = median_time(lambda: verifiers.verify(record, text), repeats)[0]
        parts_s[name] = median_time(lambda: verifiers.response_parts(record, text), repeats)[0]
        print(f"{name:28s} verify {verify_s[name]:.3f} s, response_parts {parts_s[name]:.3f} s", flush=True)
    worst_verify, worst_parts = max(verify_s, key=verify_s.get), max(parts_s, key=parts_s.get)
    figures = (f"worst verify {verify_s[worst_verify]:.3f} s ({worst_verify}), worst response_parts "
               f"{parts_s[worst_parts]:.3f} s ({worst_parts}), over {len(cases)} shapes")
    print(figures)
    update_figures({"verifier_inputs_worst_verify_s": round(verify_s[worst_verify], 4),
                    "verifier_inputs_worst_parts_s": round(parts_s[worst_parts], 4)})
    upsert_result("Hostile verifier inputs (bench_verifier_inputs.py)",
                  "Built-in verifiers on 2 MB responses of every shape: the worst `verify` and `response_parts` "
                  "(called by the credits table) time, median of 3 per shape. The lazy tool-call regex this "
                  "replaced took 87.6 s on 12,000 unclosed tags (132 KB).",
                  "quick" if repeats == 1 else "full", f"{len(cases)} shapes x 2 MB, {repeats} timing(s) each",
                  figures, f"< {TARGET_S:g} s each: "
                  f"{verdict(max(verify_s[worst_verify], parts_s[worst_parts]) < TARGET_S)}")


if __name__ == "__main__":
    main()
