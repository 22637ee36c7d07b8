"""Typed records that the stages exchange: sample -> verify -> credit -> write.

Task records are read from JSONL (one JSON object per line). Every record has
`id`, `task` and `prompt`, and optionally `split` (train|test) and `reference_response`;
the rest depends on the task:

    sql           {"db": "concerts.sqlite", "reference_sql": "SELECT ..."}
                  `db` is a path inside the JSONL file's `databases/` folder (or the
                  folder given as `databases`); absolute paths and `../` escapes are refused.
    instructions  {"constraints": [{"kind": "keyword_include", "args": {...}}, ...]}
    tools         {"tools": [<JSON schema of each function>],
                   "reference_calls": [{"name": "...", "arguments": {...},
                                        "defaults": {...}, "alternatives": {...},
                                        "possible_answer": {...} (BFCL's, optional)}, ...]}
    any other     a task of a plugin verifier (`tokencredit.verifiers.plugins`): every other field of
                  the line reaches the verifier in the record dict.

`reference_response` is a correct response, optional (it trains the shipped tiny policy
and the feedback models; annotation never reads it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

TASKS = ("sql", "instructions", "tools")  # the built-in tasks; plugin verifiers add any other


class RecordError(ValueError):
    """A task record is malformed; the message names the record id and the field."""

    def __init__(self, record_id: str, field_name: str, reason: str):
        self.record_id = record_id
        self.field = field_name
        self.reason = reason
        super().__init__(f"record {record_id!r}: field {field_name!r}: {reason}")


@dataclass(frozen=True)
class SqlSpec:
    db_path: str
    reference_sql: str


@dataclass(frozen=True)
class Constraint:
    kind: str
    args: dict[str, Any]


@dataclass(frozen=True)
class InstructionSpec:
    constraints: tuple[Constraint, ...]
    # "tokencredit" (the project's own checks, partial credit), "ifeval" or "ifeval-loose"
    # (the IFEval reference's strict and loose checks); see `tokencredit.verifiers.instructions`
    semantics: str = "tokencredit"


@dataclass(frozen=True)
class ToolCall:
    """A call. As a reference: `arguments` must be passed, `defaults` may be left out (or passed
    with that value), `alternatives[name]` lists further accepted values of an argument.
    `possible_answer` is BFCL's own answer {parameter: [accepted values, "" = may be left out]}
    where the call came from BFCL (`--format bfcl`): the `bfcl` semantics judges by it, since
    BFCL reads it in ways the three fields above cannot say (see `tokencredit.verifiers.bfcl_rules`)."""

    name: str
    arguments: dict[str, Any]
    defaults: dict[str, Any] = field(default_factory=dict)
    alternatives: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    possible_answer: dict[str, list] | None = None


@dataclass(frozen=True)
class ToolSpec:
    tools: tuple[dict[str, Any], ...]
    reference_calls: tuple[ToolCall, ...]
    # "tokencredit" (exact strings) or "bfcl" (BFCL's string normalization and type rules)
    semantics: str = "tokencredit"


@dataclass(frozen=True)
class PluginSpec:
    """A record of a task that only plugin verifiers know: the whole JSON object of its line."""

    fields: dict[str, Any]


TaskSpec = Union[SqlSpec, InstructionSpec, ToolSpec, PluginSpec]


@dataclass(frozen=True)
class TaskRecord:
    id: str
    task: str
    prompt: str
    reference_response: str | None  # None when the prompt file has none
    spec: TaskSpec
    split: str = "train"  # "train" | "test": the shipped models never see "test" records


@dataclass(frozen=True)
class RewardScore:
    """One reward of one response: a score in [0, 1], what the verifier expected (`feedback`: the
    reference query, the expected call, the constraint; never the response's own tokens), what it
    found in the response (`observed`: may quote the response) and, where the verifier can say where
    the response violates the reward, those characters (`spans`: [start, end) offsets into the response,
    sorted, non-overlapping; `tokencredit.verifiers.spans`). Empty `spans`: the verifier does not say where."""

    name: str
    score: float
    feedback: str
    observed: str = ""
    spans: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Segment:
    """One node of a tree-sampled group, as one leaf sees it: the leaf's tokens [start, end) were sampled
    at this node. `node_id` is unique within the run ("<record id>/t<r>" for root r, "<record id>/t<r>.<l>"
    for its continuation l, ...); `parent_id` is None for a root (its parent is the prompt)."""

    node_id: str
    parent_id: str | None
    start: int  # token offset into the response, inclusive
    end: int  # exclusive


@dataclass
class Sample:
    """One sampled response. `token_ids` and `sample_logprobs` have length T (response tokens).
    `segments`: where the response is a leaf of a tree-sampled group (`SamplingConfig.tree`), its path
    from root to leaf, contiguous and covering [0, T); None for flat sampling."""

    response_id: str
    group_id: str
    task: str
    prompt: str
    prompt_token_ids: list[int]
    response: str
    token_ids: list[int]
    sample_logprobs: list[float]
    model: str
    seed: int
    segments: tuple[Segment, ...] | None = None


@dataclass
class VerifiedSample:
    sample: Sample
    rewards: list[RewardScore]
    status: str = "ok"  # "ok" | "verifier_error: <reason>"


@dataclass
class TokenCredit:
    """Per-token, per-reward credit of one response; arrays are [K, T] unless noted."""

    reward_names: list[str]
    reward_adv: list[float]  # [K] GDPO per-reward advantage A[i,k]
    distance: list[list[float] | None]  # [K][T] replay relevance d (the configured option, raw), None where gated
    weight: list[list[float]]  # [K][T] mean-1 replay weight
    advantage: list[list[float]]  # [K][T] A[i,k,t]
    beta: float
    js: list[list[float] | None] | None = None  # [K][T] JS distance when stored beside another relevance
    floored: list[bool] | None = None  # [K] relevance under the noise floor: uniform weights
    # [K] where MRTPO's relevance came from: 'verifier' | 'replay' | 'uniform'; 'rollout' when only mc ran;
    # None without either
    relevance_source: list[str] | None = None
    mrtpo_sum: list[float] | None = None  # [T] sum_k w_k A[i,k,t], before GDPO's batch step
    mc: list[list[float]] | None = None  # [K][T] Monte-Carlo A_mc[i,k,t] (method.md 3b); None without mc
    mc_sum: list[float] | None = None  # [T] sum_k w_k A_mc[i,k,t], before GDPO's batch step
    p2t_raw: list[float] | None = None  # [T] gradient x input
    p2t_reward: list[float] | None = None  # [T] token reward of the chosen form
    p2t_alpha: float | None = None  # A_p2t[i,t] = A_gdpo[i] + p2t_alpha * p2t_reward[t]


@dataclass
class AnnotatedResponse:
    verified: VerifiedSample
    adv_grpo: float
    gdpo_sum: float  # S[i] = sum_k w_k A[i,k], before GDPO's batch step (c, m are over the whole run)
    credit: TokenCredit | None = None
    extra: dict[str, Any] = field(default_factory=dict)
