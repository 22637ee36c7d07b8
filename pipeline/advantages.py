"""Response-level advantages: GRPO and GDPO (method.md section 1).

Shapes: N responses of one batch, K_max reward slots. `rewards [N, K]` float, `mask [N, K]` bool
(True where response i has reward k: instruction prompts carry 2-6 constraints, so K differs per
group), `group [N]` long (which prompt each response answers; any non-negative ids).

All statistics are population statistics (ddof = 0), computed in float64 with scatter ops over
groups and returned in the rewards' dtype. A group has "no variance" in reward k when its
population std is <= EPS; identical scores give a std of a few ulps, far below that.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import torch

EPS = 1e-6


@dataclass(frozen=True)
class GdpoResult:
    reward_adv: torch.Tensor  # [N, K] A[i,k], 0 where masked or the group has no variance in k
    total: torch.Tensor  # [N] A_gdpo[i] = scale * (S[i] - shift)
    scale: torch.Tensor  # 0-dim: c = 1 / (std_b S + eps)
    shift: torch.Tensor  # 0-dim: m = mean_b S


def sum_rewards(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Sum over the reward axis `dim`, k = 0, 1, ... in order.

    One fixed summation order for GDPO's S[i] and MRTPO's per-token sum is what makes
    MRTPO with beta = 0 equal GDPO bit for bit (torch's own reductions may reorder).
    """
    shape = list(x.shape)
    del shape[dim]
    return reduce(torch.add, x.unbind(dim), x.new_zeros(shape))


def _check(rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor) -> None:
    if rewards.dim() != 2 or mask.shape != rewards.shape or mask.dtype != torch.bool:
        raise ValueError(f"rewards {tuple(rewards.shape)} and mask {tuple(mask.shape)} ({mask.dtype}) "
                         f"must both be [N, K], mask bool")
    if group.shape != (rewards.shape[0],) or group.dtype != torch.long or (group < 0).any():
        raise ValueError(f"group {tuple(group.shape)} ({group.dtype}) must be [N] = "
                         f"[{rewards.shape[0]}] non-negative long")
    bad = (mask & ~torch.isfinite(rewards)).nonzero()
    if len(bad):
        i, k = bad[0].tolist()
        raise ValueError(f"rewards: response {i}, reward {k} is {rewards[i, k].item()}, not finite")


def _group_stats(values: torch.Tensor, valid: torch.Tensor, group: torch.Tensor):
    """Per-group mean and population std of `values [N, ...]` over valid entries.

    Returns (mean, std) gathered back to [N, ...], float64.
    """
    G = int(group.max()) + 1 if len(group) else 0
    v = torch.where(valid, values.double(), 0.0)
    w = valid.double()
    count = torch.zeros((G,) + v.shape[1:], dtype=torch.float64, device=v.device).index_add_(0, group, w)
    total = torch.zeros_like(count).index_add_(0, group, v)
    mean = (total / count.clamp(min=1))[group]
    centered = torch.where(valid, v - mean, 0.0)  # two passes: no catastrophic cancellation
    var = torch.zeros_like(count).index_add_(0, group, centered * centered) / count.clamp(min=1)
    return mean, var.sqrt()[group]


def grpo(rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """GRPO: s[i] = sum_k r[i,k] over valid k, then (s - mean_g s) / (std_g s + eps) -> [N]."""
    _check(rewards, mask, group)
    s = torch.where(mask, rewards.double(), 0.0).sum(1)
    valid = torch.ones_like(s, dtype=torch.bool)
    mean, std = _group_stats(s, valid, group)
    return ((s - mean) / (std + EPS)).to(rewards.dtype)


def group_has_variance(rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """[N, K] bool: True where mask[i,k] and response i's group has std > EPS in reward k."""
    _check(rewards, mask, group)
    _, std = _group_stats(rewards, mask, group)
    return mask & (std > EPS)


def gdpo(rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor) -> GdpoResult:
    """GDPO: per-reward group normalization, sum over rewards, batch normalization."""
    _check(rewards, mask, group)
    mean, std = _group_stats(rewards, mask, group)
    varied = mask & (std > EPS)
    reward_adv = torch.where(varied, (rewards.double() - mean) / (std + EPS), 0.0).to(rewards.dtype)
    S = sum_rewards(reward_adv)
    shift = S.mean()
    scale = 1.0 / (S.std(correction=0) + EPS)
    return GdpoResult(reward_adv=reward_adv, total=scale * (S - shift), scale=scale, shift=shift)
