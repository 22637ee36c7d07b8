"""The credit stage: verified samples of one batch -> GRPO/GDPO, MRTPO and P2T advantages.

The batch is the unit of GDPO's batch normalization (method.md section 1), so a shard is
credited as a whole. Responses whose verifier failed keep their row but get no credit and do
not enter the normalization.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from schemas.records import AnnotatedResponse, TaskRecord, TokenCredit, VerifiedSample

from .advantages import gdpo, group_has_variance, grpo
from .config import CreditConfig
from .mrtpo import mrtpo_advantages
from .p2t import P2TStats, attribute, p2t_advantages, token_rewards
from .progress import Progress
from .replay import build_replay_item, replay_distances

def reward_tensors(verified: Sequence[VerifiedSample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rewards [N, K_max] float32, mask [N, K_max] bool, group [N] long (index of the prompt)."""
    k_max = max(len(v.rewards) for v in verified)
    rewards = torch.zeros(len(verified), k_max)
    mask = torch.zeros(len(verified), k_max, dtype=torch.bool)
    groups: dict[str, int] = {}
    group = torch.empty(len(verified), dtype=torch.long)
    for i, v in enumerate(verified):
        scores = [r.score for r in v.rewards]
        rewards[i, : len(scores)] = torch.tensor(scores)
        mask[i, : len(scores)] = True
        group[i] = groups.setdefault(v.sample.group_id, len(groups))
    return rewards, mask, group


def _padded(rows: Sequence[torch.Tensor], T: int, fill: float) -> torch.Tensor:
    out = torch.full((len(rows), rows[0].shape[0], T), fill)
    for i, row in enumerate(rows):
        out[i, :, : row.shape[1]] = row
    return out


def assign_credit(verified: Sequence[VerifiedSample], records: dict[str, TaskRecord], config: CreditConfig,
                  policy=None, tokenizer=None, reward_model=None,
                  progress: bool = True) -> tuple[list[AnnotatedResponse], dict]:
    """Credit every `ok` response of one batch; returns annotated responses (input order) and stats.
    `progress`: show the replay's and P2T's progress (pipeline.progress)."""
    ok = [v for v in verified if v.status == "ok"]
    annotated = {id(v): AnnotatedResponse(verified=v, adv_grpo=None, adv_gdpo=None) for v in verified}
    stats = {"responses": len(verified), "verifier_failures": len(verified) - len(ok)}
    if not ok:
        return [annotated[id(v)] for v in verified], stats
    rewards, mask, group = reward_tensors(ok)
    response_adv = grpo(rewards, mask, group)
    result = gdpo(rewards, mask, group)
    lengths = [len(v.sample.token_ids) for v in ok]
    T = max(max(lengths), 1)
    token_mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    ungated = group_has_variance(rewards, mask, group) & mask

    beta = config.beta if "mrtpo" in config.kinds else 0.0
    if "mrtpo" in config.kinds:
        items = [build_replay_item(tokenizer, records[v.sample.group_id].prompt,
                                   [(r.name, r.feedback) for r in v.rewards], v.sample.token_ids,
                                   ungated[i, : len(v.rewards)].tolist()) for i, v in enumerate(ok)]
        replay_tokens = sum(len(it.response_ids) * sum(p is not None for p in it.drop_prompt_ids) for it in items)
        with Progress("replay", total=replay_tokens, unit="token", enabled=progress and replay_tokens > 0) as bar:
            distances = replay_distances(policy, items, batch_size=config.replay_batch_size,
                                         chunk_size=config.chunk_size, on_progress=bar.update)
        k_max = rewards.shape[1]
        distance = _padded([torch.cat([d, torch.full((k_max - d.shape[0], d.shape[1]), float("nan"))])
                            for d in distances], T, float("nan"))
        stats.update(replays_done=int(ungated.sum()), replays_skipped=int((mask & ~ungated).sum()),
                     tokens_replayed=int((ungated.sum(1) * torch.tensor(lengths)).sum()))
    else:
        distance = torch.full((len(ok), rewards.shape[1], T), float("nan"))
    weights, token_adv, total = mrtpo_advantages(result.reward_adv, distance, token_mask, mask, beta,
                                                 result.scale, result.shift, config.max_second_moment)

    p2t = _p2t(ok, result.total, config, reward_model, progress) if "p2t" in config.kinds else None
    if p2t is not None:
        stats.update(p2t_responses=p2t[1].responses, p2t_near_flat=p2t[1].near_flat)

    for i, v in enumerate(ok):
        K, n = len(v.rewards), lengths[i]
        replayed = [bool(ungated[i, k]) and "mrtpo" in config.kinds for k in range(K)]
        item = annotated[id(v)]
        item.adv_grpo, item.adv_gdpo = float(response_adv[i]), float(result.total[i])
        item.credit = TokenCredit(
            reward_names=[r.name for r in v.rewards],
            reward_adv=result.reward_adv[i, :K].tolist(),
            distance=[distance[i, k, :n].tolist() if replayed[k] else None for k in range(K)],
            weight=weights[i, :K, :n].tolist(),
            advantage=token_adv[i, :K, :n].tolist(),
            beta=beta,
            adv_mrtpo=total[i, :n].tolist() if "mrtpo" in config.kinds else None,
            **(p2t[0][i] if p2t is not None else {}),
        )
    return [annotated[id(v)] for v in verified], stats


def _p2t(ok: Sequence[VerifiedSample], response_adv: torch.Tensor, config: CreditConfig, reward_model,
         progress: bool = True):
    """P2T token rewards and advantages per response (method.md section 3)."""
    with Progress("p2t", total=len(ok), unit="response", enabled=progress) as bar:
        attributions = attribute(reward_model, [v.sample.prompt_token_ids for v in ok],
                                 [v.sample.token_ids for v in ok], baseline=config.p2t_baseline,
                                 on_progress=bar.update)
    stats = P2TStats()
    columns = []
    for i, a in enumerate(attributions):
        rewards = token_rewards(a.score, a.raw, form=config.p2t_form, omega=config.p2t_omega)
        stats.add(a.raw)
        columns.append({"p2t_raw": a.raw.tolist(), "p2t_reward": rewards.tolist(),
                        "adv_p2t": p2t_advantages(float(response_adv[i]), rewards, config.p2t_alpha).tolist()})
    return columns, stats
