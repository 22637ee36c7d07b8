"""The credit stage: verified samples of one batch -> GRPO/GDPO, MRTPO, P2T and Monte-Carlo (mc) credit.

Everything here stops before GDPO's batch step (method.md section 1): a response's values depend
only on its prompt group (group normalization, replay of its own feedback, the values of its own
tree), never on which other
groups share its shard, so a run's dataset does not depend on how it was split into shards. The
batch scale c and shift m are taken over the whole run by the dataset's views
(schemas/views.sql), or over a training batch by a trainer that wants that instead.
Responses whose verifier failed keep their row but get no credit.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from tokencredit.schemas.records import AnnotatedResponse, TaskRecord, TokenCredit, VerifiedSample

from tokencredit.pipeline.credit.advantages import condition_on, gdpo, grpo, sum_rewards
from tokencredit.pipeline.config import CREDIT_KINDS, CreditConfig  # noqa: F401 - CREDIT_KINDS re-exported
from tokencredit.pipeline.credit.mc import mc_advantages, tree_tensors
from tokencredit.pipeline.credit.mrtpo import mrtpo_advantages
from tokencredit.pipeline.credit.p2t import (P2TStats, attribute, attribute_across_tokenizers, shares_vocab,
                                             token_rewards)
from tokencredit.pipeline.progress import Progress
from tokencredit.pipeline.timing import SECONDS, Stages
from tokencredit.pipeline.sample.prompts import feedback_sections
from tokencredit.pipeline.credit.located import verifier_relevance
from tokencredit.pipeline.credit.relevance import apply_floor, relevance, signs
from tokencredit.pipeline.credit.engine_replay import engine_replay
from tokencredit.pipeline.credit.replay import ReplayStats, build_replay_item, replay

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


def _named(name: str, key: str) -> bool:
    return name == key or re.sub(r"^c[0-9]+_", "", name) == key


def reward_options(verified: Sequence[VerifiedSample], rewards: torch.Tensor, mask: torch.Tensor,
                   config: CreditConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards after the configured condition, weights [N, K]) from the reward names."""
    weights = torch.ones_like(rewards)
    for i, v in enumerate(verified):
        for k, r in enumerate(v.rewards):
            weights[i, k] = next((w for key, w in config.reward_weights if _named(r.name, key)), 1.0)
    if config.condition is not None:
        name, threshold = config.condition
        primary = torch.tensor([next((k for k, r in enumerate(v.rewards) if _named(r.name, name)), -1)
                                for v in verified])
        rewards = condition_on(rewards, mask, primary, threshold)
    return rewards, weights


def assign_credit(verified: Sequence[VerifiedSample], records: dict[str, TaskRecord], config: CreditConfig,
                  policy=None, tokenizer=None, reward_model=None,
                  progress: bool = True, reward_tokenizer=None,
                  replay_engine=None) -> tuple[list[AnnotatedResponse], dict]:
    """Credit every `ok` response of one batch; returns annotated responses (input order) and stats.
    `progress`: show the replay's and P2T's progress (pipeline.progress). `reward_tokenizer`: the reward
    model's, when it may differ from the policy's `tokenizer` (None: the reward model reads the policy's ids).
    `replay_engine`: the run's `VllmSampler`, which replays a log-prob relevance through its engine
    (`engine_replay`) in place of `policy`; JS (the relevance or `store_js`) is replayed by `policy`.

    The values stop before GDPO's batch step: `gdpo_sum` S[i], `credit.mrtpo_sum` and `credit.mc_sum`; a
    consumer applies c * (x - m) with c, m over the run (the views) or over its own batch (`batch_statistics`).
    `mc` needs every response to be a leaf of a tree-sampled group (`Sample.segments`): ValueError otherwise,
    before any replay. The stats' `seconds` hold each method's wall time (`credit_gdpo`, `credit_mrtpo`, `credit_mc`,
    `credit_p2t`) and the rows' (`credit_rows`).
    """
    ok = [v for v in verified if v.status == "ok"]
    stages = Stages()
    if "mc" in config.kinds:  # a failed leaf is still part of its tree: check every path
        with stages("credit_mc"):
            node, bounds = tree_tensors([v.sample for v in verified])
            keep = torch.tensor([v.status == "ok" for v in verified])
            node, bounds = node[keep], bounds[keep]
    annotated = {id(v): AnnotatedResponse(verified=v, adv_grpo=None, gdpo_sum=None) for v in verified}
    stats = {"responses": len(verified), "verifier_failures": len(verified) - len(ok), SECONDS: stages.seconds}
    if not ok:
        return [annotated[id(v)] for v in verified], stats
    with stages("credit_gdpo"):
        rewards, mask, group = reward_tensors(ok)
        response_adv = grpo(rewards, mask, group)
        conditioned, reward_weight = reward_options(ok, rewards, mask, config)
        lengths = [len(v.sample.token_ids) for v in ok]
        result = gdpo(conditioned, mask, group, config.gdpo, weights=reward_weight, lengths=torch.tensor(lengths))
        T = max(max(lengths), 1)
        token_mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
        ungated = result.varied

    beta = config.beta if "mrtpo" in config.kinds else 0.0
    if "mrtpo" in config.kinds:
        replay_stats = ReplayStats()
        with stages("credit_mrtpo"):
            distance, js, floored, source = _relevance(ok, records, mask, ungated, result.reward_adv, T, config,
                                                       policy, tokenizer, progress, replay_engine, replay_stats)
        replayed = source == SOURCES.index("replay")
        stats.update(replay_positions_computed=replay_stats.tokens_forwarded,
                     replay_positions_min=replay_stats.positions_min,
                     replay_positions_from_cache=replay_stats.tokens_from_cache,
                     replay_response_positions=replay_stats.response_positions)
        stats.update(replays_done=int(replayed.sum()), replays_skipped=int((mask & ~replayed).sum()),
                     replays_floored=int(floored.sum()),
                     verifier_located=int((source == SOURCES.index("verifier")).sum()),
                     tokens_replayed=int((replayed.sum(1) * torch.tensor(lengths)).sum()))
    else:
        distance = torch.full((len(ok), rewards.shape[1], T), float("nan"))
        js, floored, source = None, torch.zeros(len(ok), rewards.shape[1], dtype=torch.bool), None
    # floored pairs get uniform weights (their relevance is zeroed); the stored relevance stays raw
    with stages("credit_mrtpo" if beta else "credit_gdpo"):  # at beta 0 the token advantages are GDPO's
        weighted = torch.where(floored[:, :, None], 0.0, distance)
        one, zero = torch.tensor(1.0), torch.tensor(0.0)
        weights, token_adv, _ = mrtpo_advantages(result.reward_adv, weighted, token_mask, mask, beta, one, zero,
                                                 config.max_second_moment)
        # [N, T], S[i] on every token at beta 0
        mrtpo_sum = sum_rewards(reward_weight[:, :, None] * token_adv, dim=1)

    mc = p2t = None
    if "mc" in config.kinds:
        with stages("credit_mc"):
            mc = mc_advantages(conditioned, mask, group, node, bounds, config.gdpo, weights=reward_weight)
    if "p2t" in config.kinds:
        with stages("credit_p2t"):
            p2t = _p2t(ok, records, config, reward_model, tokenizer, reward_tokenizer, progress)
        stats.update(p2t_responses=p2t[1].responses, p2t_near_flat=p2t[1].near_flat)
    with stages("credit_rows"):  # the credit columns as lists: per token, per reward
        for i, v in enumerate(ok):
            K, n = len(v.rewards), lengths[i]
            sources = [SOURCES[source[i, k]] for k in range(K)] if source is not None else [None] * K
            relevant = [s in ("verifier", "replay") for s in sources]
            item = annotated[id(v)]
            item.adv_grpo, item.gdpo_sum = float(response_adv[i]), float(result.summed[i])
            item.credit = TokenCredit(
                reward_names=[r.name for r in v.rewards],
                reward_adv=result.reward_adv[i, :K].tolist(),
                distance=[distance[i, k, :n].tolist() if relevant[k] else None for k in range(K)],
                js=[js[i, k, :n].tolist() if sources[k] == "replay" and js is not None else None for k in range(K)],
                floored=[bool(floored[i, k]) for k in range(K)],
                relevance_source=sources if source is not None else ["rollout"] * K if mc is not None else None,
                weight=weights[i, :K, :n].tolist(),
                advantage=token_adv[i, :K, :n].tolist(),
                beta=beta,
                mrtpo_sum=mrtpo_sum[i, :n].tolist() if "mrtpo" in config.kinds else None,
                mc=mc.token_adv[i, :K, :n].tolist() if mc is not None else None,
                mc_sum=mc.summed[i, :n].tolist() if mc is not None else None,
                **(p2t[0][i] if p2t is not None else {}),
            )
    return [annotated[id(v)] for v in verified], stats


SOURCES = ("verifier", "replay", "uniform")  # where a pair's relevance came from (credits.relevance_source)


def _relevance(ok: Sequence[VerifiedSample], records: dict[str, TaskRecord], mask: torch.Tensor,
               ungated: torch.Tensor, reward_adv: torch.Tensor, T: int, config: CreditConfig, policy, tokenizer,
               progress: bool = True, replay_engine=None, replay_stats: ReplayStats | None = None):
    """MRTPO's relevance under `config.locate` -> (relevance [N, K, T] NaN where none, JS [N, K, T] or None,
    floored [N, K], source [N, K] long: an index of SOURCES). `both` replays only the ungated pairs the
    verifier does not locate: the spans are free, a replay costs forwards."""
    N, K = reward_adv.shape
    distance = torch.full((N, K, T), float("nan"))
    located = torch.zeros(N, K, dtype=torch.bool)
    if config.locate in ("verifier", "both"):
        distance, located = verifier_relevance(ok, reward_adv, T, tokenizer)
    to_replay = ungated & ~located if config.locate == "both" else ungated & (config.locate == "replay")
    js, floored = None, torch.zeros(N, K, dtype=torch.bool)
    if to_replay.any():
        replayed, js, floored = _replay_relevance(ok, records, to_replay, reward_adv, T, config, policy, tokenizer,
                                                  progress, replay_engine, replay_stats)
        distance = torch.where(to_replay[:, :, None], replayed, distance)
    source = torch.full((N, K), SOURCES.index("uniform"), dtype=torch.long)
    source[to_replay] = SOURCES.index("replay")
    source[located & mask] = SOURCES.index("verifier")
    return distance, js, floored & to_replay, source


def _replay_relevance(ok: Sequence[VerifiedSample], records: dict[str, TaskRecord], ungated: torch.Tensor,
                      reward_adv: torch.Tensor, T: int, config: CreditConfig, policy, tokenizer, progress: bool = True,
                      replay_engine=None, stats: ReplayStats | None = None):
    """Replay the ungated pairs -> (relevance [N, K, T], JS [N, K, T] or None, floored [N, K]); NaN where not
    replayed. `logprob_signed` is oriented by each reward's advantage (or +1 where its section points).
    Through `replay_engine` (`engine_replay`) when given and no JS is wanted, else with `policy`."""
    items, points = [], []
    for i, v in enumerate(ok):
        sections, pointing = feedback_sections(v.rewards, records[v.sample.group_id].prompt, config.feedback_style)
        items.append(build_replay_item(tokenizer, records[v.sample.group_id].prompt, sections, v.sample.token_ids,
                                       ungated[i, : len(v.rewards)].tolist(), config.ablation))
        points.append(pointing)
    want_js = config.relevance == "js" or config.store_js
    tokens = sum(len(it.response_ids) * sum(p is not None for p in it.drop_prompt_ids) for it in items)
    with Progress("replay", total=tokens, unit="token", enabled=progress and tokens > 0) as bar:
        if replay_engine is not None and not want_js:
            outputs = engine_replay(replay_engine, items, stats=stats, on_progress=bar.update)
        else:
            outputs = replay(policy, items, js=want_js, batch_size=config.replay_batch_size,
                             chunk_size=config.chunk_size, stats=stats, on_progress=bar.update)
    K = reward_adv.shape[1]
    distance = torch.full((len(ok), K, T), float("nan"))
    js = torch.full((len(ok), K, T), float("nan")) if want_js else None
    floored = torch.zeros(len(ok), K, dtype=torch.bool)
    for i, out in enumerate(outputs):
        k, n = out.logprob_drop.shape
        raw = relevance(config.relevance, out, signs(reward_adv[i, :k], points[i]))
        distance[i, :k, :n] = raw
        floored[i, :k] = apply_floor(raw, config.floor)[1]
        if js is not None:
            js[i, :k, :n] = out.js
    return distance, js, floored


def _p2t(ok: Sequence[VerifiedSample], records: dict[str, TaskRecord], config: CreditConfig, reward_model,
         tokenizer, reward_tokenizer, progress: bool = True):
    """P2T token rewards per response (method.md section 3); A_p2t = A_gdpo + alpha * reward needs c and m.
    A reward model of another tokenizer reads the task prompt and response text in its own tokens."""
    with Progress("p2t", total=len(ok), unit="response", enabled=progress) as bar:
        if shares_vocab(reward_tokenizer, tokenizer):
            attributions = attribute(reward_model, [v.sample.prompt_token_ids for v in ok],
                                     [v.sample.token_ids for v in ok], baseline=config.p2t_baseline,
                                     on_progress=bar.update)
        else:
            attributions = attribute_across_tokenizers(
                reward_model, reward_tokenizer, tokenizer, [records[v.sample.group_id].prompt for v in ok],
                [v.sample.token_ids for v in ok], baseline=config.p2t_baseline, on_progress=bar.update)
    stats = P2TStats()
    columns = []
    for a in attributions:
        rewards = token_rewards(a.score, a.raw, form=config.p2t_form, omega=config.p2t_omega)
        stats.add(a.raw)
        columns.append({"p2t_raw": a.raw.tolist(), "p2t_reward": rewards.tolist(), "p2t_alpha": config.p2t_alpha})
    return columns, stats
