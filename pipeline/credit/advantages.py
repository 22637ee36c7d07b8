"""Response-level advantages: GRPO and GDPO (method.md section 1).

Shapes: N responses of one batch, K_max reward slots. `rewards [N, K]` float, `mask [N, K]` bool
(True where response i has reward k: instruction prompts carry 2-6 constraints, so K differs per
group), `group [N]` long (which prompt each response answers; any non-negative ids).

Statistics are computed in float64 with scatter ops over groups and returned in the rewards'
dtype. By default (the method's definition) they are population statistics (ddof = 0) with
eps = 1e-6, and a group has "no variance" in reward k when its std is <= EPS (identical scores
give a std of a few ulps, far below that). `GdpoOptions` holds the knobs a user of another
trainer expects; `PRESETS["trl"]` and `PRESETS["verl"]` reproduce TRL 1.16's
`multi_objective_aggregation="normalize_then_sum"` and verl 0.9.1's `adv_estimator=gdpo`
(tests/test_advantages.py checks both against those libraries' own code).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

import torch

from tokencredit.pipeline.config import BATCH_STEPS, EPS, SINGLE, GdpoOptions  # noqa: F401 - re-exported; defined without torch

PRESETS = {
    "method": GdpoOptions(),
    # TRL 1.16 GRPOTrainer, multi_objective_aggregation="normalize_then_sum" (grpo_trainer.py, in
    # _generate_and_score_completions): nanstd (Bessel) per group and over the batch, + 1e-4.
    "trl": GdpoOptions(ddof=1, eps=1e-4, zero_std=0.0, batch="std", batch_ddof=1, batch_eps=1e-4),
    # verl 0.9.1 compute_gdpo_outcome_advantage (trainer/ppo/core_algos.py): compute_grpo_outcome_advantage
    # per reward (torch.std, + 1e-6; a group of one: mean 0, std 1), then masked_whiten over the tokens
    # (utils/torch_functional.py: unbiased variance, rsqrt(var + 1e-8)).
    "verl": GdpoOptions(ddof=1, eps=1e-6, zero_std=0.0, single="raw", batch="whiten", batch_ddof=1, batch_eps=1e-8),
}


def preset(name: str) -> GdpoOptions:
    if name not in PRESETS:
        raise ValueError(f"unknown GDPO preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class GdpoResult:
    reward_adv: torch.Tensor  # [N, K] A[i,k], 0 where masked or the group has no variance in k
    summed: torch.Tensor  # [N] S[i] = sum_k w_k A[i,k], before the batch step
    total: torch.Tensor  # [N] A_gdpo[i] = scale * (S[i] - shift); 0 for a response without rewards
    scale: torch.Tensor  # 0-dim: c
    shift: torch.Tensor  # 0-dim: m
    varied: torch.Tensor  # [N, K] bool: the pairs whose group was normalized (MRTPO replays these)


def sum_rewards(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Sum over the reward axis `dim`, k = 0, 1, ... in order.

    One fixed summation order for GDPO's S[i] and MRTPO's per-token sum is what makes
    MRTPO with beta = 0 equal GDPO bit for bit (torch's own reductions may reorder).
    """
    shape = list(x.shape)
    del shape[dim]
    return reduce(torch.add, x.unbind(dim), x.new_zeros(shape))


def check_rewards(rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor) -> None:
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


def _group_stats(values: torch.Tensor, valid: torch.Tensor, group: torch.Tensor, ddof: int = 0):
    """Per-group mean, std and count of `values [N, ...]` over valid entries.

    Returns (mean, std, count) gathered back to [N, ...], float64; std is 0 where count <= ddof.
    """
    G = int(group.max()) + 1 if len(group) else 0
    v = torch.where(valid, values.double(), 0.0)
    w = valid.double()
    count = torch.zeros((G,) + v.shape[1:], dtype=torch.float64, device=v.device).index_add_(0, group, w)
    total = torch.zeros_like(count).index_add_(0, group, v)
    mean = (total / count.clamp(min=1))[group]
    centered = torch.where(valid, v - mean, 0.0)  # two passes: no catastrophic cancellation
    squares = torch.zeros_like(count).index_add_(0, group, centered * centered)
    var = torch.where(count > ddof, squares / (count - ddof).clamp(min=1), 0.0)
    return mean, var.sqrt()[group], count[group]


def grpo(rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """GRPO: s[i] = sum_k r[i,k] over valid k, then (s - mean_g s) / (std_g s + eps) -> [N]."""
    check_rewards(rewards, mask, group)
    s = torch.where(mask, rewards.double(), 0.0).sum(1)
    valid = torch.ones_like(s, dtype=torch.bool)
    mean, std, _ = _group_stats(s, valid, group)
    return ((s - mean) / (std + EPS)).to(rewards.dtype)


def group_has_variance(rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """[N, K] bool: True where mask[i,k] and response i's group has std > EPS in reward k."""
    check_rewards(rewards, mask, group)
    _, std, _ = _group_stats(rewards, mask, group)
    return mask & (std > EPS)


def condition_on(rewards: torch.Tensor, mask: torch.Tensor, primary: int | torch.Tensor,
                 threshold: float) -> torch.Tensor:
    """GDPO's conditioned reward (its Eq. 8): the other rewards of response i count only when its
    primary reward reaches `threshold`, r[i,k] -> r[i,k] if r[i,p_i] >= threshold else 0 (k != p_i).

    primary: one column for every response, or [N] long per response (-1: no primary, unchanged).
    Returns the new rewards [N, K]; apply it before `gdpo`.
    """
    N, K = rewards.shape
    p = torch.full((N,), primary, dtype=torch.long) if isinstance(primary, int) else primary
    if p.shape != (N,) or (p >= K).any() or (p < -1).any():
        raise ValueError(f"primary must be a column in [0, {K}) (or -1 per response), got {primary}")
    has = p >= 0
    rows = torch.arange(N)
    reached = rewards[rows, p.clamp(min=0)] >= threshold
    if (has & ~mask[rows, p.clamp(min=0)]).any():
        i = int((has & ~mask[rows, p.clamp(min=0)]).nonzero()[0])
        raise ValueError(f"primary reward {int(p[i])} of response {i} is masked out")
    secondary = has[:, None] & (torch.arange(K)[None, :] != p[:, None]) & mask
    return torch.where(secondary & ~reached[:, None], torch.zeros_like(rewards), rewards)


def reward_weights(weights: torch.Tensor | None, rewards: torch.Tensor) -> torch.Tensor:
    if weights is None:
        return torch.ones_like(rewards)
    weights = torch.as_tensor(weights, dtype=rewards.dtype)
    if weights.shape not in (rewards.shape, rewards.shape[1:]) or not torch.isfinite(weights).all():
        raise ValueError(f"weights {tuple(weights.shape)} must be finite, [K] or [N, K] for rewards "
                         f"{tuple(rewards.shape)}")
    return weights.expand_as(rewards)


def batch_statistics(summed: torch.Tensor, valid: torch.Tensor, options: GdpoOptions = PRESETS["method"],
                     lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO's batch step: (c, m) of S[i] over the valid responses, as float64 0-dim tensors.

    summed, valid: [N]; lengths [N] token counts, needed by `batch="whiten"` (verl weighs each
    response by its tokens). The dataset's views compute the same over a whole run (schemas/views.sql).
    """
    if options.batch == "none":
        return torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
    if options.batch == "whiten" and lengths is None:
        raise ValueError("GdpoOptions.batch='whiten' weighs responses by their token count: pass lengths")
    S = summed.double()[valid]
    w = torch.ones_like(S) if options.batch == "std" else lengths.double()[valid]
    n = w.sum()
    shift = (w * S).sum() / n if n > 0 else S.new_tensor(0.0)
    dof = n - options.batch_ddof
    var = (w * (S - shift) ** 2).sum() / dof if dof > 0 else S.new_tensor(0.0)
    if options.batch == "std":
        return 1.0 / (var.sqrt() + options.batch_eps), shift
    return torch.rsqrt(var + options.batch_eps), shift


def group_step(rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor,
               options: GdpoOptions = PRESETS["method"]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GDPO's group step as (centre, spread, varied), each [N, K]: A[i,k] = (r[i,k] - centre) / spread where
    varied, else 0. centre, spread float64: the group's mean and std + eps; with `single="raw"` a group's lone
    score gets 0 and 1 + eps (verl's mean 0, std 1). varied: the pairs normalized at all (MRTPO replays them).
    The `mc` credit takes its statistics from here, so that it telescopes to GDPO's A[i,k] exactly."""
    mean, std, count = _group_stats(rewards, mask, group, options.ddof)
    varied = mask & (count > 1) & (std > options.zero_std)
    centre, spread = mean, std + options.eps
    if options.single == "raw":
        single = mask & (count == 1)
        centre = torch.where(single, 0.0, centre)
        spread = torch.where(single, 1.0 + options.eps, spread)
        varied = varied | single
    return centre, spread, varied


def gdpo(rewards: torch.Tensor, mask: torch.Tensor, group: torch.Tensor, options: GdpoOptions = PRESETS["method"],
         *, weights: torch.Tensor | None = None, lengths: torch.Tensor | None = None) -> GdpoResult:
    """GDPO: per-reward group normalization, weighted sum over rewards, batch normalization.

    weights: w_k as [K] or [N, K] (None: all 1); lengths: [N] token counts (for `batch="whiten"`).
    A response without any reward is left out of the batch step and gets a total of 0.
    """
    check_rewards(rewards, mask, group)
    centre, spread, varied = group_step(rewards, mask, group, options)
    reward_adv = torch.where(varied, (rewards.double() - centre) / spread, 0.0).to(rewards.dtype)
    summed = sum_rewards(torch.where(mask, reward_weights(weights, rewards) * reward_adv, 0.0))
    scored = mask.any(1)
    scale, shift = batch_statistics(summed, scored, options, lengths)
    scale, shift = scale.to(rewards.dtype), shift.to(rewards.dtype)
    total = torch.where(scored, scale * (summed - shift), 0.0)
    return GdpoResult(reward_adv=reward_adv, summed=summed, total=total, scale=scale, shift=shift, varied=varied)
