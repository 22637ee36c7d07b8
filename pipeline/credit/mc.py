"""Monte-Carlo credit `mc` from tree-sampled groups (method.md section 3b).

A tree-sampled group's leaves are both its training responses and the rollouts that value the prefixes they
share. For reward k, V_k(node) is the mean of r[i,k] over the valid leaves i below the node (mask), V_k(x) the
group's mean, and a leaf's own value is r[i,k]. Every token of a leaf's segment (parent -> node) gets

    A_mc[i,k,t] = (V_k(node) - V_k(base)) / (std_g r[.,k] + eps)

where `base` is the segment's parent, except that an empty segment (a root when the tree branches at token 0)
carries no tokens and passes its change on: `base` is the nearest ancestor whose segment holds tokens, x for
the first. The group statistics, eps, ddof, the zero-variance gating (0 on every token of reward k when the
group has no variance in it) and the `single` rule are GDPO's (`advantages.gdpo`, the same `GdpoOptions`).
Hence: along one leaf the segment values telescope to GDPO's A[i,k]; a flat group (each leaf its own root,
branch at token 0, L = 1) gives A[i,k] on every token, bit for bit; siblings share their common segments'
values; a group's values depend on its own leaves only (never on the shard); a group where every leaf scores
the same gets 0. Rewards combine as GDPO's: S[i,t] = sum_k w_k A_mc[i,k,t] in `sum_rewards`' order, before
the batch step; the consumer applies the run's c (S - m), as for MRTPO's `mrtpo_sum`.

Shapes: N leaves of a batch (any number of groups), K reward slots, D segments on the longest path (root
first, the leaf's own segment last), T tokens of the longest response.

    rewards [N, K] float, mask [N, K] bool, group [N] long     as for `advantages.gdpo`
    node    [N, D] long   the node of leaf i's segment d: an index shared by every leaf below that node,
                          -1 past the end of a shorter path
    bounds  [N, D + 1] long   segment d of leaf i holds tokens [bounds[i,d], bounds[i,d+1]): 0 first,
                          non-decreasing, T_i last (repeated past the end of the path)

`tree_tensors` builds node and bounds from the samples' `Segment` paths and checks them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokencredit.schemas.records import Sample

from tokencredit.pipeline.credit.advantages import (PRESETS, GdpoOptions, check_rewards, group_step, reward_weights,
                                                   sum_rewards)

NEEDS_TREE = "mc needs tree-sampled groups (--tree R,L)"


@dataclass(frozen=True)
class McResult:
    token_adv: torch.Tensor  # [N, K, T] A_mc[i,k,t], rewards' dtype; 0 where masked, gated or past T_i
    summed: torch.Tensor  # [N, T] sum_k w_k A_mc[i,k,t], before GDPO's batch step; 0 past T_i


def tree_tensors(samples: Sequence[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples' `segments` -> (node [N, D] long, bounds [N, D + 1] long) of the module docstring.

    Node indices follow the order of first appearance. Raises ValueError naming the response and node when
    a sample has no segments, a path is not contiguous over [0, T) or its parents do not chain, or two
    leaves disagree on a node they share (its parent, tokens or prompt group).
    """
    index: dict[str, int] = {}
    seen: dict[str, tuple] = {}
    paths = []
    for s in samples:
        if not s.segments:
            raise ValueError(f"{NEEDS_TREE}: response {s.response_id!r} (record {s.group_id!r}) has no segments")
        _check_path(s)
        for d, seg in enumerate(s.segments):
            leaf = d == len(s.segments) - 1
            shape = (seg.parent_id, seg.start, seg.end, s.group_id, leaf)
            first = seen.setdefault(seg.node_id, (*shape, s.response_id))
            if first[:5] != shape or (leaf and first[5] != s.response_id):
                raise ValueError(f"response {s.response_id!r}: segments: node {seg.node_id!r} (parent, start, end, "
                                 f"record, leaf) = {shape} but response {first[5]!r} has {first[:5]}; leaves "
                                 f"share a node only as the same prefix of one group, and a leaf is one response")
            index.setdefault(seg.node_id, len(index))
        paths.append(s.segments)
    D = max((len(p) for p in paths), default=1)
    node = torch.full((len(samples), D), -1, dtype=torch.long)
    bounds = torch.empty((len(samples), D + 1), dtype=torch.long)
    for i, path in enumerate(paths):
        node[i, : len(path)] = torch.tensor([index[seg.node_id] for seg in path])
        bounds[i, 0] = 0
        bounds[i, 1:] = path[-1].end
        bounds[i, 1: len(path) + 1] = torch.tensor([seg.end for seg in path])
    return node, bounds


def _check_path(s: Sample) -> None:
    end, parent = 0, None
    for seg in s.segments:
        if seg.start != end or seg.end < seg.start or seg.parent_id != parent:
            raise ValueError(f"response {s.response_id!r}: segments: {seg} does not follow (start {end}, parent "
                             f"{parent!r}); a path runs root to leaf over contiguous token ranges")
        end, parent = seg.end, seg.node_id
    if end != len(s.token_ids):
        raise ValueError(f"response {s.response_id!r}: segments end at token {end}, the response has "
                         f"{len(s.token_ids)}")


def _check_tree(node: torch.Tensor, bounds: torch.Tensor, group: torch.Tensor) -> None:
    N = group.shape[0]
    if node.dim() != 2 or node.shape[0] != N or node.dtype != torch.long or bounds.shape != (N, node.shape[1] + 1):
        raise ValueError(f"node {tuple(node.shape)} ({node.dtype}) and bounds {tuple(bounds.shape)} must be "
                         f"[N, D] long and [N, D + 1] for N = {N}")
    on_path = node >= 0
    if (node < -1).any() or not on_path[:, :1].all() or (on_path[:, 1:] & ~on_path[:, :-1]).any():
        raise ValueError("node: each leaf's path starts at depth 0 and is padded with -1 after its end only")
    steps = bounds.diff(dim=1)
    if (bounds[:, 0] != 0).any() or (steps < 0).any() or (~on_path & (steps != 0)).any():
        raise ValueError("bounds: each leaf's segments start at token 0, never go backwards and hold no "
                         "tokens past the end of its path")
    ids = node[on_path]
    groups = group[:, None].expand_as(node)[on_path]
    if len(ids):
        M = int(ids.max()) + 1
        low = torch.full((M,), N, dtype=torch.long).scatter_reduce(0, ids, groups, "amin")
        high = torch.full((M,), -1, dtype=torch.long).scatter_reduce(0, ids, groups, "amax")
        if (low[ids] != high[ids]).any():
            raise ValueError(f"node {int(ids[low[ids] != high[ids]][0])} has leaves in two groups; a node's "
                             f"value is a mean within its own group")


def _path_values(r: torch.Tensor, mask: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """[N, D, K] float64: V_k of each node on leaf i's path (mean over its valid leaves), the leaf's own r[i,k]
    at its last node. Past the path's end: the leaf's value (those segments hold no tokens)."""
    N, D = node.shape
    on_path = node >= 0
    M = int(node.max()) + 1 if node.numel() else 0
    ids = node.clamp(min=0)
    leaf_r = torch.where(mask, r, 0.0)[:, None, :].expand(N, D, -1)
    valid = (mask[:, None, :] & on_path[:, :, None]).double()
    totals = r.new_zeros(M, r.shape[1]).index_add_(0, ids[on_path], (leaf_r * valid)[on_path])
    counts = r.new_zeros(M, r.shape[1]).index_add_(0, ids[on_path], valid[on_path])
    values = (totals / counts.clamp(min=1))[ids]
    beyond_inner = torch.arange(D)[None, :] >= on_path.sum(1, keepdim=True) - 1  # the leaf and past it
    return torch.where(beyond_inner[:, :, None], r[:, None, :], values)


def mc_advantages(rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor, node: torch.Tensor,
                  bounds: torch.Tensor, options: GdpoOptions = PRESETS["method"], *,
                  weights: torch.Tensor | None = None) -> McResult:
    """Monte-Carlo token credit of tree-sampled groups (module docstring for the shapes and the rule).

    weights: w_k as [K] or [N, K] (None: all 1), as for `advantages.gdpo`.
    """
    check_rewards(rewards, mask, group)
    _check_tree(node, bounds, group)
    N, K = rewards.shape
    D = node.shape[1]
    prompt_value, spread, varied = group_step(rewards, mask, group, options)  # V_k(x) and GDPO's std + eps
    values = _path_values(rewards.double(), mask, node)
    holds_tokens = bounds.diff(dim=1) > 0  # [N, D]
    base, segments = prompt_value, []
    for d in range(D):
        segments.append((values[:, d] - base) / spread)
        base = torch.where(holds_tokens[:, d, None], values[:, d], base)
    segment_adv = torch.where(varied[:, :, None], torch.stack(segments, -1), 0.0).to(rewards.dtype)  # [N, K, D]

    T = int(bounds[:, -1].max()) if N else 0
    positions = torch.arange(T).expand(N, T).contiguous()
    segment_of = torch.searchsorted(bounds[:, 1:].contiguous(), positions, right=True).clamp(max=max(D - 1, 0))
    in_response = positions < bounds[:, -1:]
    token_adv = segment_adv.gather(2, segment_of[:, None, :].expand(N, K, T))
    token_adv = torch.where(mask[:, :, None] & in_response[:, None, :], token_adv, 0.0)
    w = reward_weights(weights, rewards)
    summed = sum_rewards(torch.where(mask[:, :, None], w[:, :, None] * token_adv, 0.0), dim=1)
    return McResult(token_adv=token_adv, summed=summed)
