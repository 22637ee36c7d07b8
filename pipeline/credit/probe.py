"""Where does each reward's credit land on one response? MRTPO's replay of a single hand-made response.

    probe = replay_one(policy, tokenizer, record, "<sql>SELECT ... WHERE age >= 30</sql>")
    probe.top_tokens("execution", "logprob_signed")   # the tokens that reward's relevance singles out

The response is tokenized as the sampler emits it (its tokens, then eos), verified, and every reward is
replayed (no gating: one response has no group). Without a group there is no advantage, so the sign a
`logprob_signed` relevance needs is taken from the score: +1 for a reward the response passes (a group
would credit it), -1 for one it fails (and +1 where the section points at the response, as in
`relevance.signs`). Used by the localization tests and benchmark.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tokencredit import verifiers
from tokencredit.schemas.records import TaskRecord

from tokencredit.pipeline.sample.prompts import feedback_sections
from tokencredit.pipeline.credit.relevance import apply_floor, relevance, signs
from tokencredit.pipeline.credit.replay import ReplayOutput, build_replay_item, replay
from tokencredit.pipeline.sample.detokenize import token_spans


@dataclass
class Probe:
    reward_names: list[str]
    scores: list[float]
    tokens: list[str]  # [T] token texts, eos last
    spans: list[tuple[int, int]]  # [T] [char_start, char_end) in the response
    points: list[bool]  # [K] the reward's section points at the response (`prompts.feedback_sections`)
    replayed: ReplayOutput

    def relevance(self, reward: str, kind: str = "js", floor: float = 0.0) -> torch.Tensor:
        """[T] relevance of `reward` (zeros when its mean is below `floor`)."""
        advantage = torch.tensor([1.0 if s >= 1.0 else -1.0 for s in self.scores])
        values, _ = apply_floor(relevance(kind, self.replayed, signs(advantage, self.points)), floor)
        return values[self.reward_names.index(reward)]

    def top_tokens(self, reward: str, kind: str = "js", n: int = 3, floor: float = 0.0) -> list[int]:
        """Positions of the n largest relevances of `reward`, largest first; [] when it is all zero
        (floored, or nothing moved): uniform weights single out no token."""
        row = self.relevance(reward, kind, floor)
        return [] if not bool((row > 0).any()) else row.argsort(descending=True, stable=True)[:n].tolist()

    def covering(self, start: int, end: int) -> list[int]:
        """Positions of the tokens that overlap characters [start, end) of the response."""
        return [t for t, (s, e) in enumerate(self.spans) if s < end and e > start]

    def mass(self, reward: str, positions: list[int], kind: str = "js", floor: float = 0.0) -> float:
        """Share of `reward`'s mean-1 weight held by `positions` (uniform weights when all zero)."""
        row = self.relevance(reward, kind, floor)
        if not bool((row > 0).any()):
            return len(positions) / len(row)
        return float(row[positions].sum() / row.sum())


def response_ids(tokenizer, response: str) -> list[int]:
    """The ids the sampler would have emitted for `response`: its tokens, then eos."""
    return list(tokenizer(response, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]


def replay_one(policy, tokenizer, record: TaskRecord, response: str, *, ablation: str = "drop",
               style: str = "auto", js: bool = True, chunk_size: int = 128) -> Probe:
    scores = verifiers.verify(record, response)
    ids = response_ids(tokenizer, response)
    sections, points = feedback_sections(scores, record.prompt, style)
    item = build_replay_item(tokenizer, record.prompt, sections, ids, [True] * len(scores), ablation)
    replayed = replay(policy, [item], js=js, chunk_size=chunk_size)[0]
    tokens, starts, ends = token_spans(tokenizer, ids)
    return Probe([s.name for s in scores], [s.score for s in scores], tokens, list(zip(starts, ends)), points,
                 replayed)
