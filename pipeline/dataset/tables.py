"""Annotated responses -> the Arrow tables of `schemas` (responses, credits in long form, tree nodes)."""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

import pyarrow as pa

from tokencredit import verifiers
from tokencredit.schemas import CREDITS, NODES, RESPONSES
from tokencredit.schemas.records import AnnotatedResponse, TaskRecord

from tokencredit.pipeline.sample.detokenize import token_spans


def _parts(spans: list[tuple[int, int, str]], starts: Sequence[int], ends: Sequence[int]) -> list[str]:
    """Each token's labelled response part: the one holding its last character ("special" for a token of no
    characters, "other" outside every span). `spans` are sorted and disjoint, so a binary search finds it
    (a scan per token was tokens x spans: a response of 10^5 tags has 2 x 10^5 spans)."""
    los = [lo for lo, _, _ in spans]
    parts = []
    for start, end in zip(starts, ends):
        i = bisect.bisect_right(los, end - 1) - 1
        inside = end > start and i >= 0 and end - 1 < spans[i][1]
        parts.append(spans[i][2] if inside else "special" if end <= start else "other")
    return parts


def responses_table(annotated: Sequence[AnnotatedResponse], shard: int) -> pa.Table:
    rows = []
    for item in annotated:
        sample, credit = item.verified.sample, item.credit
        rows.append({
            "response_id": sample.response_id, "group_id": sample.group_id, "shard": shard,
            "task": sample.task, "prompt": sample.prompt, "response": sample.response,
            "prompt_token_ids": sample.prompt_token_ids, "token_ids": sample.token_ids,
            "sample_logprobs": sample.sample_logprobs,
            "reward_names": [verifiers.stored_reward(sample.task, r.name)[0] for r in item.verified.rewards],
            "rewards": [r.score for r in item.verified.rewards],
            "feedback": [r.feedback for r in item.verified.rewards],
            "observed": [r.observed for r in item.verified.rewards],
            "reward_advs": credit.reward_adv if credit else None,
            "adv_grpo": item.adv_grpo, "gdpo_sum": item.gdpo_sum,
            "mrtpo_sum": credit.mrtpo_sum if credit else None,
            "mc_sum": credit.mc_sum if credit else None,
            "p2t_raw": credit.p2t_raw if credit else None,
            "p2t_reward": credit.p2t_reward if credit else None,
            "p2t_alpha": credit.p2t_alpha if credit else None,
            "status": item.verified.status, "model": sample.model, "seed": sample.seed,
            "segments": None if sample.segments is None else [dataclasses.asdict(g) for g in sample.segments],
        })
    return pa.Table.from_pylist(rows, schema=RESPONSES)


def nodes_table(annotated: Sequence[AnnotatedResponse], shard: int) -> pa.Table:
    """One row per node of the shard's tree-sampled groups (none for flat samples), from the leaves' segments.
    ValueError when two leaves disagree on where a node they share lies (not one tree)."""
    nodes: dict[str, dict] = {}
    for item in annotated:
        sample = item.verified.sample
        for depth, segment in enumerate(sample.segments or ()):
            node = nodes.setdefault(segment.node_id, {
                "node_id": segment.node_id, "parent_id": segment.parent_id, "group_id": sample.group_id,
                "shard": shard, "depth": depth, "start": segment.start, "end": segment.end,
                "prefix_tokens": len(sample.prompt_token_ids) + segment.start, "leaves": 0})
            if (node["parent_id"], node["start"], node["end"], node["depth"]) != \
                    (segment.parent_id, segment.start, segment.end, depth):
                raise ValueError(f"response {sample.response_id!r}: node {segment.node_id!r} lies at {segment} "
                                 f"but at tokens [{node['start']}, {node['end']}) in another leaf of its group")
            node["leaves"] += 1
    return pa.Table.from_pylist(list(nodes.values()), schema=NODES)


def credits_table(annotated: Sequence[AnnotatedResponse], records: dict[str, TaskRecord], tokenizer) -> pa.Table:
    """One row per response x token x reward (responses whose verifier failed have none)."""
    columns: dict[str, list] = {name: [] for name in CREDITS.names}
    for item in annotated:
        sample, credit = item.verified.sample, item.credit
        if credit is None:
            continue
        texts, starts, ends = token_spans(tokenizer, sample.token_ids)
        spans = verifiers.response_parts(records[sample.group_id], sample.response)
        parts = _parts(spans, starts, ends)
        T = len(sample.token_ids)
        for k, name in enumerate(credit.reward_names):
            reward, constraint_index = verifiers.stored_reward(sample.task, name)
            distance = credit.distance[k]
            columns["response_id"] += [sample.response_id] * T
            columns["task"] += [sample.task] * T
            columns["position"] += range(T)
            columns["token_id"] += sample.token_ids
            columns["token_text"] += texts
            columns["char_start"] += starts
            columns["char_end"] += ends
            columns["part"] += parts
            columns["reward"] += [reward] * T
            columns["constraint_index"] += [constraint_index] * T
            columns["reward_adv"] += [credit.reward_adv[k]] * T
            columns["distance"] += distance if distance is not None else [None] * T
            js = credit.js[k] if credit.js is not None else None
            columns["js"] += js if js is not None else [None] * T
            columns["floored"] += [bool(credit.floored[k]) if credit.floored is not None else None] * T
            columns["relevance_source"] += [credit.relevance_source[k] if credit.relevance_source else None] * T
            columns["weight"] += credit.weight[k]
            columns["advantage"] += credit.advantage[k]
            columns["mc"] += credit.mc[k] if credit.mc is not None else [None] * T
            columns["beta"] += [credit.beta] * T
    return pa.Table.from_pydict(columns, schema=CREDITS)
