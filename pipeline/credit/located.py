"""Verifier-located relevance (method.md section 2): where a verifier says which characters break a reward,
d[t] = 1 on the tokens that overlap one of its spans and 0 elsewhere; MRTPO's weights and reallocation then
apply unchanged (mean 1, mass preserved, beta 0 = GDPO).

A pair (response, reward) is located only where its advantage A[i,k] is negative: the spans mark what is
wrong, so they say where a penalty belongs; a positive advantage concentrated there would credit the
violation itself. A pair whose spans overlap no token (a span inside a special token's empty text) is not
located either.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from tokencredit.schemas.records import VerifiedSample

from tokencredit.pipeline.sample.detokenize import token_spans


def span_relevance(spans: Sequence[tuple[int, int]], starts: Sequence[int], ends: Sequence[int]) -> torch.Tensor:
    """[T] float32: 1 where token [starts[t], ends[t]) overlaps a span, else 0 (an empty token overlaps none)."""
    d = torch.zeros(len(starts))
    for t, (s, e) in enumerate(zip(starts, ends)):
        d[t] = float(any(s < b and a < e for a, b in spans))
    return d


def verifier_relevance(ok: Sequence[VerifiedSample], reward_adv: torch.Tensor, T: int,
                       tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(relevance [N, K, T] float32, NaN where not located; located [N, K] bool) from the rewards' spans.

    reward_adv: [N, K] GDPO's A[i,k]; the tokens' character spans come from `tokenizer` (as the credits table's).
    """
    N, K = reward_adv.shape
    distance = torch.full((N, K, T), float("nan"))
    located = torch.zeros(N, K, dtype=torch.bool)
    for i, v in enumerate(ok):
        wanted = [k for k, r in enumerate(v.rewards) if r.spans and reward_adv[i, k] < 0]
        if not wanted:
            continue
        _, starts, ends = token_spans(tokenizer, v.sample.token_ids)
        for k in wanted:
            d = span_relevance(v.rewards[k].spans, starts, ends)
            if d.sum() > 0:
                distance[i, k, : len(d)] = d
                located[i, k] = True
    return distance, located
