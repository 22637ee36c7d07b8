"""Where does each reward's credit land on one response? MRTPO's replay for a single hand-made case.

    probe = replay_one(policy, tokenizer, record, "<sql>SELECT ... WHERE age >= 30</sql>")
    probe.top_tokens("execution")      # the tokens that reward's replay distance singles out

The response is tokenized as the sampler emits it (its tokens, then eos), verified, and every
reward is replayed (no gating: one response has no group), so each reward's mean-1 weights show
where the policy's next-token distributions move when that reward's feedback is removed. Used by
the localization tests and `bench/bench_localization.py`.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

import verifiers
from schemas.records import TaskRecord

from .mrtpo import replay_weights
from .replay import build_replay_item, replay_distances
from .tables import token_spans


@dataclass
class Probe:
    reward_names: list[str]
    scores: list[float]
    tokens: list[str]  # [T] token texts, eos last
    spans: list[tuple[int, int]]  # [T] [char_start, char_end) in the response
    distance: torch.Tensor  # [K, T] JS per reward and token
    weight: torch.Tensor  # [K, T] mean-1 replay weights

    def row(self, reward: str) -> torch.Tensor:
        return self.weight[self.reward_names.index(reward)]

    def top_tokens(self, reward: str, n: int = 3) -> list[int]:
        """Positions of the n largest weights of `reward`, largest first."""
        return self.row(reward).argsort(descending=True)[:n].tolist()

    def covering(self, start: int, end: int) -> list[int]:
        """Positions of the tokens that overlap characters [start, end) of the response."""
        return [t for t, (s, e) in enumerate(self.spans) if s < end and e > start]

    def mass(self, reward: str, positions: list[int]) -> float:
        """Share of `reward`'s weight held by `positions` (weights sum to T)."""
        row = self.row(reward)
        return float(row[positions].sum() / row.sum())


def replay_one(policy, tokenizer, record: TaskRecord, response: str, chunk_size: int = 128) -> Probe:
    scores = verifiers.verify(record, response)
    ids = list(tokenizer(response, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
    item = build_replay_item(tokenizer, record.prompt, [(s.name, s.feedback) for s in scores], ids,
                             [True] * len(scores))
    distance = replay_distances(policy, [item], chunk_size=chunk_size)[0]
    tokens, starts, ends = token_spans(tokenizer, ids)
    return Probe([s.name for s in scores], [s.score for s in scores], tokens, list(zip(starts, ends)), distance,
                 replay_weights(distance))


# ------------------------------------------------------------------------- crafted cases


@dataclass(frozen=True)
class Case:
    """A reference response with one edit that a given reward should be blamed for."""

    kind: str  # "operator" | "table" | "tool_value"
    record: TaskRecord
    response: str
    edit: tuple[int, int]  # [start, end) of the edited characters in `response`
    reward: str  # the failing reward whose credit should land on the edit


def _edit(record: TaskRecord, kind: str, reward: str, start: int, end: int, new: str) -> Case:
    ref = record.reference_response
    return Case(kind, record, ref[:start] + new + ref[end:], (start, start + len(new)), reward)


def crafted_cases(records: Sequence[TaskRecord]) -> Iterator[Case]:
    """Per record at most one case of each kind, as in the MRTPO paper's Figures 1, 3 and 7:

    operator    SQL `>` (`<`) in the WHERE clause written `>=` (`<=`)   blamed on `execution`
    table       SQL table after FROM misspelled (plural): no such table  blamed on `executable`
    tool_value  a tool call's integer argument off by one             blamed on `correctness`
    """
    for r in records:
        ref = r.reference_response
        if r.task == "sql":
            op = re.search(r" WHERE .*?( [<>] )", ref)
            if op:
                yield _edit(r, "operator", "execution", op.start(1) + 1, op.end(1) - 1, op.group(1).strip() + "=")
            table = re.search(r"\bFROM (\w+)", ref)
            if table:
                name = table.group(1)
                yield _edit(r, "table", "executable", table.start(1), table.end(1),
                            name[:-1] if name.endswith("s") else name + "s")
        elif r.task == "tools":
            value = re.search(r'": (\d+)[,}]', ref)
            if value:
                yield _edit(r, "tool_value", "correctness", value.start(1), value.end(1),
                            str(int(value.group(1)) + 1))
