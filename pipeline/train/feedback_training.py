"""Training data that teaches the tiny policy to use verifier feedback (so that MRTPO's replay localizes).

Per train record, three kinds of (prompt, response) examples, all laid out by `tokencredit.pipeline.sample.prompts`:

  (a) sampling_prompt(x)            -> the reference, or a corruption (sets the sampling error rate);
  (b) replay_prompt(x, sections)    -> the reference (every feedback section present: sure and right);
  (c) replay_prompt(x, sections, k) -> half the time a corruption of the part reward k governs, else
                                       the reference (without section k: unsure exactly there).

The feedback sections come from running the real verifiers on an independently drawn response (the
reference or any corruption), so the other sections never give away which corruption is the target.
A corruption "belongs" to reward k when k is the first reward (in the verifier's order) that it fails.
Half the (b) examples are counterfactual: the record's reference is swapped for one of its corruptions
that is itself valid (an executable query, well-formed tool calls), the feedback quotes that one, and so
does the target. A tiny model otherwise answers train prompts from memory and ignores the feedback;
here only the feedback tells it what to write, so it learns to copy from it. Some (b) examples teach
recovery: the target is a corrupted response whose wrong characters get weight 0, so the model learns
to continue correctly after an error without learning to make it.

Corruptions are plain text edits of the reference response, one function per task (`CORRUPTORS`).
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tokencredit import verifiers
from tokencredit.schemas.records import RecordError, TaskRecord

from tokencredit.pipeline.sample.prompts import feedback_text, replay_prompt, sampling_prompt



@dataclass(frozen=True)
class Example:
    """One SFT example; the response's characters in [zero_start, zero_end) get loss weight 0.

    Offset len(response) stands for the end-of-sequence token that follows the response.
    """

    prompt: str
    response: str
    zero_start: int = 0
    zero_end: int = 0


@dataclass
class Pool:
    """A record's reference, its distinct corruptions, and which reward each corruption belongs to."""

    record: TaskRecord
    reward_names: list[str]
    corruptions: list[str]
    by_reward: list[list[str]]  # [K]: corruptions whose first failed reward is k
    feedback: dict[str, list[tuple[str, str]]]  # response -> verifier sections (name, feedback)
    alternatives: list[TaskRecord]  # the record with a corruption as its reference (see `as_reference`)


# ------------------------------------------------------------------------- SQL corruptions

_OP_SWAP = {">": ">=", ">=": ">", "<": "<=", "<=": "<", "=": "!="}
_CMP = re.compile(r"(?<=\s)(>=|<=|>|<|=)(?=\s)")
_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")
_STRING = re.compile(r"'([^']+)'")
_WORD = re.compile(r"[A-Za-z_]+")
_SWAPS = {"COUNT": "SUM", "SUM": "COUNT", "AVG": "MAX", "MAX": "MIN", "MIN": "MAX", "DESC": "ASC", "ASC": "DESC"}


def _schema_names(prompt: str) -> tuple[dict[str, list[str]], set[str]]:
    """(table -> columns, all names) from the prompt's `Schema: t(a, b); u(c).` line."""
    tables = {}
    for line in prompt.splitlines():
        if line.startswith("Schema:"):
            for name, cols in re.findall(r"(\w+)\(([^)]*)\)", line):
                tables[name] = [c.strip() for c in cols.split(",")]
    return tables, set(tables) | {c for cols in tables.values() for c in cols}


def _replace_at(text: str, start: int, end: int, new: str) -> str:
    return text[:start] + new + text[end:]


def sql_corruptions(record: TaskRecord, rng: random.Random) -> Iterator[str]:
    """Wrong versions of `<sql>query</sql>`: tags, operators, numbers, literals, names, functions."""
    ref = record.reference_response
    match = re.search(r"<sql>(.*)</sql>", ref, re.DOTALL)
    if match is None:
        return
    q = match.group(1)
    yield f"```sql\n{q}\n```"
    yield q
    yield f"<sql>{q}"
    yield f"<sql>{q}</sql>\n<sql>{q}</sql>"
    where = q.find(" WHERE ")
    for m in _CMP.finditer(q):
        if m.start() > where >= 0:
            yield f"<sql>{_replace_at(q, m.start(), m.end(), _OP_SWAP[m.group()])}</sql>"
    for m in _NUMBER.finditer(q):
        v = int(m.group())
        for new in {v + 1, max(v - 1, 0), v + rng.choice([2, 5, 10])} - {v}:
            yield f"<sql>{_replace_at(q, m.start(), m.end(), str(new))}</sql>"
    for m in _STRING.finditer(q):
        s = m.group(1)
        yield f"<sql>{_replace_at(q, m.start(1), m.end(1), s[:-1])}</sql>"
    tables, names = _schema_names(record.prompt)
    siblings = {c: [o for o in cols if o != c and o != "id"] for cols in tables.values() for c in cols}
    siblings.update({t: [o for o in tables if o != t] for t in tables})
    for m in _WORD.finditer(q):
        word = m.group()
        if word in names and word != "id":
            yield f"<sql>{_replace_at(q, m.start(), m.end(), word + 's' if not word.endswith('s') else word[:-1])}</sql>"
            if siblings.get(word):
                yield f"<sql>{_replace_at(q, m.start(), m.end(), rng.choice(siblings[word]))}</sql>"
        elif word in _SWAPS:
            yield f"<sql>{_replace_at(q, m.start(), m.end(), _SWAPS[word])}</sql>"


# ------------------------------------------------------------------------- tool-call corruptions

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _sibling_value(value, rng: random.Random, siblings: list):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + rng.choice([1, -1]) if value > 1 else value + 1
    others = [v for v in siblings if v != value and isinstance(v, str)]
    return rng.choice(others) if others else value + "s"


def tool_corruptions(record: TaskRecord, rng: random.Random, values: dict[str, list]) -> Iterator[str]:
    """Wrong tool calls: broken tags or JSON, text outside the tags; a changed, dropped or extra
    argument, another function name, a dropped call. `values`: argument name -> values seen in the data."""
    ref = record.reference_response
    blocks = list(_CALL.finditer(ref))
    bodies = [json.loads(b.group(1)) for b in blocks]
    yield "\n".join(b.group(1) for b in blocks)
    yield ref.replace("</tool_call>", "", 1)
    yield ref.replace('"', "'")
    yield f"Sure. {ref}"
    tool_names = [t["name"] for t in record.spec.tools]
    for i, (block, body) in enumerate(zip(blocks, bodies)):
        def edit(new_body, i=i, block=block):
            return _replace_at(ref, block.start(1), block.end(1), json.dumps(new_body, ensure_ascii=False))

        for arg, value in body["arguments"].items():
            yield edit({**body, "arguments": {**body["arguments"], arg: _sibling_value(value, rng, values.get(arg, []))}})
            yield edit({**body, "arguments": {a: v for a, v in body["arguments"].items() if a != arg}})
        others = [n for n in tool_names if n != body["name"]]
        if others:
            yield edit({**body, "name": rng.choice(others)})
        if len(blocks) > 1:
            yield (ref[:block.start()] + ref[block.end():]).strip()


def argument_values(records: list[TaskRecord]) -> dict[str, list]:
    values: dict[str, list] = {}
    for r in records:
        if r.task == "tools":
            for call in r.spec.reference_calls:
                for arg, v in call.arguments.items():
                    if v not in values.setdefault(arg, []):
                        values[arg].append(v)
    return values


# ------------------------------------------------------------------------- instruction corruptions

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def instruction_corruptions(record: TaskRecord, rng: random.Random, values: dict[str, list]) -> Iterator[str]:
    """Plain edits that each tend to break one kind of constraint (the verifier decides which)."""
    ref = record.reference_response
    yield ref.upper()
    yield ref.lower()
    yield ref[:1].swapcase() + ref[1:]
    yield ref.strip('"') if ref.startswith('"') else f'"{ref}"'
    yield re.sub(r"<<([^<>]*)>>\n?", "", ref)
    yield re.sub(r"\[(\w+)\]", r"\1", ref, count=1)
    yield ref.replace("\n\n", " ")
    yield ref.replace(". ", ".\n\n", 1)
    yield ref.replace(" ", ", ", 1)
    yield ref.replace(".", ";", 1)
    yield ref.replace(".", "!", 1)
    parts = _SENTENCE_END.split(ref)
    if len(parts) > 1:
        yield " ".join(parts[:-1])
        yield " ".join(parts[1:])
    yield f"{ref} {parts[-1]}"
    yield f"{ref} {ref}"
    yield ref[: len(ref) // 2]
    lines = ref.split("\n")
    if len(lines) > 1:
        yield "\n".join(lines[:-1])
        yield "\n".join(lines + lines[-1:])
    yield ref.rstrip('"}').rstrip(".") + ('"}' if ref.endswith('"}') else "")
    for c in record.spec.constraints:
        for word in c.args.get("keywords", []) + [c.args.get("keyword")] * ("keyword" in c.args):
            hit = re.search(rf"\b{re.escape(word)}\b", ref, re.IGNORECASE)
            yield ref[:hit.start()] + "thing" + ref[hit.end():] if hit else f"{ref} {word}"
        for key in ("phrase",):
            if key in c.args and c.args[key] in ref:
                yield ref.replace(c.args[key], "", 1).strip()


CASCADES = {"sql", "tools"}  # an early failure (format) makes every later reward fail too
CORRUPTORS: dict[str, Callable[[TaskRecord, random.Random, dict], Iterator[str]]] = {
    "sql": lambda record, rng, values: sql_corruptions(record, rng),
    "tools": tool_corruptions,
    "instructions": instruction_corruptions,
}


# ------------------------------------------------------------------------- pools and examples


def sections_of(record: TaskRecord, response: str) -> list[tuple[str, str]]:
    """The feedback sections of `response` as the shipped tiny policy was trained with them: what each
    verifier expected and what it found."""
    return [(s.name, feedback_text(s, with_observed=True)) for s in verifiers.verify(record, response)]


def build_pool(record: TaskRecord, rng: random.Random, values: dict[str, list] | None = None) -> Pool:
    """Verify every corruption once; keep those that fail some reward, grouped by the first one.

    Where rewards are independent (instructions), only corruptions that fail exactly one reward are kept.
    """
    names = verifiers.reward_names(record)
    ref_scores = verifiers.verify(record, record.reference_response)
    if any(s.score < 1.0 for s in ref_scores):
        raise ValueError(f"record {record.id!r}: field 'reference_response': fails the verifier "
                         f"({', '.join(s.name for s in ref_scores if s.score < 1.0)})")
    feedback = {record.reference_response: [(s.name, s.feedback) for s in ref_scores]}
    by_reward: list[list[str]] = [[] for _ in names]
    for text in dict.fromkeys(CORRUPTORS[record.task](record, rng, values or {})):
        if text == record.reference_response or not text.strip():
            continue
        scores = verifiers.verify(record, text)
        failed = [k for k, s in enumerate(scores) if s.score < 1.0]
        if failed and (len(failed) == 1 or record.task in CASCADES):
            by_reward[failed[0]].append(text)
            feedback[text] = [(s.name, s.feedback) for s in scores]
    corruptions = [t for group in by_reward for t in group]
    alternatives = [alt for alt in (as_reference(record, t) for t in corruptions) if alt is not None]
    return Pool(record, names, corruptions, by_reward, feedback, alternatives)


def as_reference(record: TaskRecord, response: str) -> TaskRecord | None:
    """The record with `response` as its reference (so the feedback quotes it), or None when the
    task's feedback quotes no reference (instructions) or `response` cannot be one.

    Trained on, these counterfactual records make the question alone insufficient: the target is
    predictable only by reading the feedback, which is what teaches the policy to copy from it.
    """
    if record.task == "sql":
        query, _ = verifiers.sql.extract_query(response)
        spec = query and dataclasses.replace(record.spec, reference_sql=query.strip())
    elif record.task == "tools":
        calls, problem = verifiers.tools.parse_calls(response)
        spec = None if problem or not calls else dataclasses.replace(record.spec, reference_calls=tuple(calls))
    else:
        return None
    if not spec:
        return None
    alt = dataclasses.replace(record, id=f"{record.id}~alt", reference_response=response, spec=spec)
    try:
        ok = all(s.score >= 1.0 for s in verifiers.verify(alt, response))
    except RecordError:  # the altered reference query does not run
        return None
    return alt if ok else None


def changed_span(reference: str, response: str) -> tuple[int, int]:
    """[start, end) of `response`'s characters that differ from `reference` (one edit region).

    A pure deletion gives the one character after it (or the end-of-sequence slot at len(response)),
    where the response goes on differently from the reference.
    """
    blocks = difflib.SequenceMatcher(None, reference, response, autojunk=False).get_matching_blocks()
    head = blocks[0].size if blocks[0].a == 0 and blocks[0].b == 0 else 0
    last = blocks[-2] if len(blocks) > 1 else blocks[-1]
    tail = last.size if last.a + last.size == len(reference) and last.b + last.size == len(response) else 0
    return head, max(head + 1, len(response) - tail)


@dataclass(frozen=True)
class Recipe:
    p_reference: float = 0.55  # (a): the sampling error rate is 1 - p_reference, spread over rewards
    n_sampling: int = 4  # (a) examples per record
    n_all: int = 4  # (b) examples per record
    p_recover: float = 0.2  # (b): share whose target is a masked corruption
    p_counterfactual: float = 0.5  # (b): share on a record whose reference is one of its corruptions
    n_drop: int = 2  # (c) examples per record and reward
    p_drop_corrupt: float = 0.5  # (c): share whose target is a corruption of reward k


def _any_response(pool: Pool, rng: random.Random) -> str:
    return pool.record.reference_response if rng.random() < 0.3 or not pool.corruptions else rng.choice(pool.corruptions)


def _sampling_target(pool: Pool, rng: random.Random, recipe: Recipe) -> str:
    groups = [g for g in pool.by_reward if g]
    if rng.random() < recipe.p_reference or not groups:
        return pool.record.reference_response
    return rng.choice(rng.choice(groups))  # every reward's corruptions equally likely


def record_examples(pool: Pool, rng: random.Random, recipe: Recipe = Recipe()) -> list[Example]:
    """The (a), (b) and (c) examples of one record."""
    r, ref = pool.record, pool.record.reference_response
    out = [Example(sampling_prompt(r.prompt), _sampling_target(pool, rng, recipe)) for _ in range(recipe.n_sampling)]
    for _ in range(recipe.n_all):
        prompt = replay_prompt(r.prompt, pool.feedback[_any_response(pool, rng)])
        if pool.alternatives and rng.random() < recipe.p_counterfactual:
            alt = rng.choice(pool.alternatives)
            shown = rng.choice([alt.reference_response, ref, _any_response(pool, rng)])
            out.append(Example(replay_prompt(r.prompt, sections_of(alt, shown)), alt.reference_response))
        elif pool.corruptions and rng.random() < recipe.p_recover:
            wrong = rng.choice(pool.corruptions)
            out.append(Example(prompt, wrong, *changed_span(ref, wrong)))
        else:
            out.append(Example(prompt, ref))
    for k, group in enumerate(pool.by_reward):
        for _ in range(recipe.n_drop):
            prompt = replay_prompt(r.prompt, pool.feedback[_any_response(pool, rng)], drop=k)
            target = rng.choice(group) if group and rng.random() < recipe.p_drop_corrupt else ref
            out.append(Example(prompt, target))
    return out


def build_examples(records: list[TaskRecord], seed: int, recipe: Recipe = Recipe()) -> list[Example]:
    """All examples of the train-split records, shuffled; deterministic in `seed`."""
    rng = random.Random(seed)
    values = argument_values(records)
    examples = []
    for record in records:
        if record.split != "train":
            continue
        examples += record_examples(build_pool(record, rng, values), rng, recipe)
    rng.shuffle(examples)
    return examples


def tokenizer_corpus(records: list[TaskRecord], seed: int) -> Iterator[str]:
    """Texts the tokenizer is trained on: prompts, references, corruptions and their feedback."""
    rng = random.Random(seed)
    values = argument_values(records)
    for record in records:
        pool = build_pool(record, rng, values)
        yield record.prompt
        yield from pool.feedback  # the reference and every corruption
        for sections in pool.feedback.values():
            yield replay_prompt(record.prompt, sections)
    yield json.dumps({"_": "{}[]:,\""})
