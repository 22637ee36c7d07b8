"""MRTPO: reallocate each reward's advantage over tokens by replay distance (method.md section 2).

Per response: `distance [K, T]` (JS per reward and response token) -> mean-1 weights
`w [K, T]` -> `A[k, t] = A[k] * ((1 - beta) + beta * w[k, t])` -> total token advantage
`c * (sum_k A[k, t] - m)` with GDPO's batch scale c and shift m. `mrtpo_advantages` does the
same on a padded batch [N, K, T].
"""
from __future__ import annotations

import torch

from tokencredit.pipeline.credit.advantages import sum_rewards


def _first_bad(bad: torch.Tensor) -> str:
    return ", ".join(str(i) for i in bad.nonzero()[0].tolist())


def replay_weights(distance: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """w = d / mean_t d over valid tokens (mean 1); all 1 where mean_t d = 0.

    distance: [..., T] non-negative; token_mask: bool broadcastable to it (None: all valid).
    Returns [..., T] in distance's dtype, 0 at invalid tokens.
    """
    valid = torch.ones_like(distance, dtype=torch.bool) if token_mask is None else token_mask.expand_as(distance)
    bad = valid & ~(torch.isfinite(distance) & (distance >= 0))
    if bad.any():
        raise ValueError(f"distance: entry ({_first_bad(bad)}) is {distance[bad][0].item()}, "
                         f"expected a finite value >= 0")
    d = torch.where(valid, distance, 0.0)
    mean = d.sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)
    w = torch.where(mean > 0, d / torch.where(mean > 0, mean, 1.0), 1.0)
    return torch.where(valid, w, 0.0)


def constrain_second_moment(weights: torch.Tensor, max_second_moment: float,
                            token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scale w - 1 per row so that mean_t (w - 1)^2 <= max_second_moment; rows within it are untouched.

    weights: [..., T] mean-1 over valid tokens; the scaling keeps the mean at 1.
    """
    if max_second_moment < 0:
        raise ValueError(f"max_second_moment must be >= 0, got {max_second_moment}")
    valid = torch.ones_like(weights, dtype=torch.bool) if token_mask is None else token_mask.expand_as(weights)
    dev = torch.where(valid, weights - 1.0, 0.0)
    second = (dev * dev).sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)
    over = second > max_second_moment
    factor = torch.where(over, (max_second_moment / torch.where(over, second, 1.0)).sqrt(), 1.0)
    return torch.where(valid & over, 1.0 + dev * factor, weights)


def smoothstep_beta(step: float, beta_max: float = 0.5, warmup_steps: int = 10) -> float:
    """beta(s) = beta_max * u^2 (3 - 2u), u = clamp(s / warmup_steps, 0, 1).

    warmup_steps <= 0 means no warmup: beta_max from step 0.
    """
    u = 1.0 if warmup_steps <= 0 else min(1.0, max(0.0, step / warmup_steps))
    return beta_max * u * u * (3.0 - 2.0 * u)


def reallocate(reward_adv: torch.Tensor, weights: torch.Tensor, beta: float,
               max_second_moment: float | None = None) -> torch.Tensor:
    """A[..., k, t] = A[..., k] * ((1 - beta) + beta * w[..., k, t]).

    reward_adv: [..., K]; weights: [..., K, T] mean-1 per row. Returns [..., K, T].
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if max_second_moment is not None:
        weights = constrain_second_moment(weights, max_second_moment)
    return reward_adv[..., None] * ((1.0 - beta) + beta * weights)


def total_token_advantage(adv: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """c * (sum_k A[..., k, t] - m): [..., K, T] -> [..., T]."""
    return scale * (sum_rewards(adv, dim=-2) - shift)


def mrtpo_advantages(reward_adv: torch.Tensor, distance: torch.Tensor, token_mask: torch.Tensor,
                     reward_mask: torch.Tensor, beta: float, scale: torch.Tensor, shift: torch.Tensor,
                     max_second_moment: float | None = None):
    """MRTPO on a padded batch.

    reward_adv [N, K] (GDPO's A[i,k]); distance [N, K, T] (JS; a pair that was not replayed is
    NaN on all its tokens and gets uniform weights); token_mask [N, T] and reward_mask [N, K] bool.
    Returns (weights [N, K, T], adv [N, K, T], total [N, T]), all 0 outside the masks.
    """
    N, K, T = distance.shape
    if reward_adv.shape != (N, K) or reward_mask.shape != (N, K) or token_mask.shape != (N, T):
        raise ValueError(f"mrtpo_advantages: distance {(N, K, T)} needs reward_adv and reward_mask [N, K], "
                         f"token_mask [N, T]; got {tuple(reward_adv.shape)}, {tuple(reward_mask.shape)}, "
                         f"{tuple(token_mask.shape)}")
    valid = reward_mask[:, :, None] & token_mask[:, None, :]
    missing = (valid & torch.isnan(distance)).sum(-1)
    partial = (missing > 0) & (missing < valid.sum(-1))
    if partial.any():
        raise ValueError(f"distance: (response, reward) = ({_first_bad(partial)}) is NaN on some tokens "
                         f"only; a pair is either replayed on every token or not at all")
    replayed = reward_mask & (missing == 0)
    # a pair that was not replayed has d = 0 everywhere, hence uniform weights
    d = torch.where(replayed[:, :, None] & valid, distance, 0.0)
    weights = replay_weights(d, valid)
    if max_second_moment is not None:
        weights = constrain_second_moment(weights, max_second_moment, valid)
    adv = torch.where(valid, reallocate(reward_adv, weights, beta), 0.0)
    total = torch.where(token_mask, total_token_advantage(adv, scale, shift), 0.0)
    return weights, adv, total
