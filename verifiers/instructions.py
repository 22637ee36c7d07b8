"""Instruction-following verifier: one reward per constraint, named `c{index}_{kind}`.

    constraints = [{"kind": "keyword_include", "args": {"keywords": ["river"]}}, ...]
    rewards     = ["c0_keyword_include", ...]      score in [0, 1], see `tokencredit.verifiers.checkers`

The index keeps two constraints of one kind apart (and names each in the replay prompt); the
dataset stores the kind as the reward and the index in its own column (`split_reward_name`).

Feedback is the constraint's own sentence (the one the prompt uses), "Include the keywords 'river' and
'stone'.", and `observed` what was found: "Found: 'river'; missing 'stone'."

A failed constraint whose check can say where the response breaks it carries those characters as
`spans` (`tokencredit.verifiers.instruction_spans`: a comma, a forbidden word, the words past a limit, ...).

Semantics (`InstructionSpec.semantics`): "tokencredit" scores with `tokencredit.verifiers.checkers` (partial
credit where its docstring says); "ifeval" and "ifeval-loose" score 1 or 0 with the IFEval
reference's strict and loose checks (`tokencredit.verifiers.ifeval`). In every mode an empty or
whitespace-only response scores 0 on every constraint.

`response_parts` labels what the response is made of, whatever the constraints ask:
    json            the whole (stripped) response when it parses as a JSON object or array;
                    nothing else is labelled then
    quote           the two wrapping double quotes of a response that starts and ends with '"'
    bullets         a bullet line ('* ' or '- ') with its newline
    section_header  a 'SECTION n' line with its newline
    title           a <<...>> title
    text            everything else
"""
from __future__ import annotations

import re

from tokencredit.schemas.records import InstructionSpec, RecordError, RewardScore, TaskRecord

from tokencredit.verifiers import ifeval
from tokencredit.verifiers.checkers import CHECKERS, parse_json, validate_args
from tokencredit.verifiers.instruction_spans import spans_for
from tokencredit.verifiers.parts import label_runs

SEMANTICS = ("tokencredit", *ifeval.SEMANTICS)

_PAINTED = (  # (label, pattern), later ones win where they overlap
    ("bullets", re.compile(r"^[ \t]*[*-][ \t]+\S.*\n?", re.MULTILINE)),
    ("section_header", re.compile(r"^[ \t]*SECTION[ \t]+\d+\b.*\n?", re.MULTILINE)),
    ("title", re.compile(r"<<[^<>\n]+>>")),
)


def validate(record: TaskRecord) -> None:
    """Raise RecordError naming the record and the field when a constraint is unusable."""
    spec = record.spec
    if not isinstance(spec, InstructionSpec):
        raise RecordError(record.id, "constraints", f"expected instruction constraints, got {type(spec).__name__}")
    if not spec.constraints:
        raise RecordError(record.id, "constraints", "needs at least one constraint")
    if spec.semantics not in SEMANTICS:
        raise RecordError(record.id, "semantics", f"unknown semantics {spec.semantics!r}; known: {', '.join(SEMANTICS)}")
    for i, c in enumerate(spec.constraints):
        if c.kind not in CHECKERS:
            raise RecordError(record.id, f"constraints[{i}].kind", validate_args(c.kind, c.args))
        problem = validate_args(c.kind, c.args)
        if problem:
            raise RecordError(record.id, f"constraints[{i}].args", problem)


def reward_names(record: TaskRecord) -> list[str]:
    return [f"c{i}_{c.kind}" for i, c in enumerate(record.spec.constraints)]


_NAME = re.compile(r"c(\d+)_(.+)")


def split_reward_name(name: str) -> tuple[str, int | None]:
    """"c2_keyword_include" -> ("keyword_include", 2): a constraint's kind and index; a name of
    another form (a plugin's reward on an instruction record) -> (name, None)."""
    match = _NAME.fullmatch(name)
    if match is None or match.group(2) not in CHECKERS:
        return name, None
    return match.group(2), int(match.group(1))


def describe(kind: str, args: dict, semantics: str = "tokencredit") -> str:
    """The constraint as one sentence, e.g. "Use at most 40 words."."""
    if semantics in ifeval.SEMANTICS and kind in ifeval.DESCRIBE:
        return ifeval.DESCRIBE[kind](**args)
    return CHECKERS[kind].describe(**args)


def verify(record: TaskRecord, response: str) -> list[RewardScore]:
    """One RewardScore per constraint, in order; raises only RecordError (bad constraints)."""
    validate(record)
    semantics = record.spec.semantics
    scores = []
    for name, c in zip(reward_names(record), record.spec.constraints):
        expected = describe(c.kind, c.args, semantics)
        if not response.strip():
            scores.append(RewardScore(name, 0.0, expected, "Found: an empty response."))
            continue
        score, found = CHECKERS[c.kind].check(response, **c.args)
        if semantics == "ifeval":
            score = ifeval.check(c.kind, response, c.args)
        elif semantics == "ifeval-loose":
            score = ifeval.check_loose(c.kind, response, c.args)
        spans = spans_for(c.kind, response, c.args) if score < 1 else ()
        scores.append(RewardScore(name, float(score), expected, f"Found: {found}.", spans))
    return scores


def response_parts(record: TaskRecord, response: str) -> list[tuple[int, int, str]]:
    """Contiguous (char_start, char_end, label) spans covering `response`; labels in the module docstring."""
    labels = ["text"] * len(response)
    body = response.strip()
    start = len(response) - len(response.lstrip())
    if body[:1] in ("{", "["):
        value, error = parse_json(body)
        if error is None and isinstance(value, (dict, list)):
            labels[start:start + len(body)] = ["json"] * len(body)
            return label_runs(labels)
    for label, pattern in _PAINTED:
        for m in pattern.finditer(response):
            labels[m.start():m.end()] = [label] * (m.end() - m.start())
    if len(body) >= 2 and body[0] == body[-1] == '"':
        labels[start] = labels[start + len(body) - 1] = "quote"
    return label_runs(labels)
