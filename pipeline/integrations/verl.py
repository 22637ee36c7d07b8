"""verl integration: tokencredit's verifiers as a verl reward function and MRTPO as a verl advantage
estimator (`adv_estimator=mrtpo`), for verl 0.9.1.

A verl user adds two config lines (tokencredit registers itself as a `verl.plugins` entry point, so
every verl process imports this module):

    algorithm.adv_estimator=mrtpo
    reward.custom_reward_function.path=pkg://tokencredit.pipeline.integrations.verl

and, for the replay, the local policy folder to replay with (without it, beta is 0: GDPO):

    +algorithm.mrtpo_replay_model=/path/to/policy     # +algorithm.mrtpo_beta=0.5 is the default

The dataset is tokencredit's verl export (`tokencredit export RUN --format verl`, or any Parquet
with `data_source` "tokencredit/<task>" and the task record as JSON in `extra_info.record`). A
plugin task's rows name its verifiers in `extra_info.verifiers` (from the run's manifest), which
every verl process imports by their target, as annotate's Dask workers do.

`compute_score` verifies one response and returns verl's dict form: "score" (the mean of the
rewards, verl's scalar reward) plus one key per reward, named as the verifier names it (`format`,
`c0_char_count`: README, "One vocabulary"), and "reward_names", "feedback" and "observed" (JSON lists),
which verl keeps per response in the batch's non-tensor data. verl needs every response of a batch to
return the same keys, so each row carries the export file's whole key set (`extra_info.reward_keys`);
a reward the record does not have is 0, constant within the record's group, so that verl's own `gdpo`
over those keys (`algorithm.gdpo_reward_keys`) gives it no advantage, as `mrtpo` does. The `mrtpo`
estimator reads them there: GDPO with verl's options
(`preset("verl")`: sample std per group, then `masked_whiten` over the tokens), and MRTPO's per-token
reallocation from the leave-one-out replay of each response's feedback.

Limits: `mrtpo` needs verl's legacy trainer, `trainer.use_v1=false`: the v1 trainer (verl 0.9.1's
default) hands its advantage step only uid, masks and scores, so `mrtpo` stops there saying so
(`V1_BATCH`). verl 0.9.1 hands the batch's non-tensor data only to its own `gdpo` estimator
(trainer/ppo/ray_trainer.py, `compute_advantage`, line 261); importing this module wraps
`compute_advantage` so that `mrtpo` receives it too, and changes nothing for other estimators.
The replay runs in the trainer's driver process with the model at `mrtpo_replay_model` (loaded once),
not with the actor's current weights, which live in verl's Ray workers.
"""
from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from tokencredit.schemas.records import TASKS, RewardScore, Sample, TaskRecord, VerifiedSample
from tokencredit.verifiers import isolation, plugins

from tokencredit.pipeline.config import AnnotateConfig
from tokencredit.pipeline.credit.advantages import batch_statistics, preset
from tokencredit.pipeline.credit.assign import CreditConfig, assign_credit
from tokencredit.pipeline.dataset.export import record_from_json, refs_from_json

SOURCE_PREFIX = "tokencredit/"
DATA_SOURCES = tuple(f"{SOURCE_PREFIX}{task}" for task in TASKS)  # and tokencredit/<plugin task>
RESERVED = ("score", "reward_names", "feedback", "observed")  # compute_score's own keys
# (seconds, bytes) of each plugin call where the row does not say: annotate's --verifier-timeout and --verifier-memory
# defaults
BOUNDS = (AnnotateConfig.verifier_timeout_s, AnnotateConfig.verifier_memory_bytes)
# verl 0.9.1's v1 trainer reads only these fields from its TransferQueue for the advantage step
# (trainer/ppo/v1/trainer_base.py, `_compute_advantage`): no token ids, records or feedback to replay
V1_BATCH = ("adv_estimator=mrtpo cannot run under verl's v1 trainer (trainer.use_v1=true, verl 0.9.1's default): "
            "its advantage step gets only uid, masks, scores and log-probs, not the responses, task records and "
            "feedback the replay needs; set trainer.use_v1=false")


@functools.lru_cache(maxsize=4096)
def _row(record: str, refs: str | None) -> tuple[TaskRecord, tuple[plugins.PluginRef, ...]]:
    verifier_refs = refs_from_json(refs)
    return record_from_json(json.loads(record), plugins.tasks_of(verifier_refs)), verifier_refs


def row_record(extra_info: dict) -> tuple[TaskRecord, tuple[plugins.PluginRef, ...]]:
    """The task record and plugin verifiers of an exported row's `extra_info`."""
    return _row(extra_info["record"], extra_info.get("verifiers"))


def compute_score(data_source: str, solution_str: str, ground_truth: str | None = None,
                  extra_info: dict | None = None, **_: Any) -> dict[str, Any]:
    """verl's reward function: tokencredit's verifiers on one response (module docstring)."""
    if not data_source.startswith(SOURCE_PREFIX):
        raise ValueError(f"compute_score: data_source {data_source!r} is not tokencredit's; expected "
                         f"{SOURCE_PREFIX}<task>, such as {', '.join(DATA_SOURCES)} "
                         "(tokencredit export RUN --format verl writes them)")
    if not extra_info or "record" not in extra_info:
        raise ValueError(f"compute_score: extra_info of a {data_source!r} row needs 'record' (the task record "
                         f"as JSON), as the verl export writes it")
    record, refs = row_record(extra_info)
    # plugins in a worker, under the bounds the run was annotated with (an export of an older version has none)
    bounds = json.loads(extra_info.get("verifier_bounds") or "null") or BOUNDS
    scores = isolation.verify(record, solution_str, refs, *bounds)
    clash = [s.name for s in scores if s.name in RESERVED]
    if clash:
        raise ValueError(f"compute_score: record {record.id!r} has a reward named {clash[0]!r}, one of verl's keys "
                         f"{', '.join(RESERVED)}; rename that plugin reward")
    values = {s.name: s.score for s in scores}
    keys = json.loads(extra_info.get("reward_keys") or "[]")
    return {"score": sum(values.values()) / len(values), **{key: 0.0 for key in keys}, **values,
            "reward_names": json.dumps([s.name for s in scores]), "feedback": json.dumps([s.feedback for s in scores]),
            "observed": json.dumps([s.observed for s in scores])}


@functools.lru_cache(maxsize=2)
def _replay_model(path: str):
    from tokencredit.pipeline.models.loading import load_policy

    model, tokenizer = load_policy(path, device="cuda" if torch.cuda.is_available() else "cpu")
    return model.eval(), tokenizer


def _verified(non_tensor_batch: dict, batch, response_mask: torch.Tensor, index) -> tuple[list, dict]:
    """VerifiedSamples and task records (keyed by verl's prompt uid) from a verl batch."""
    prompts, attention = batch["prompts"], batch["attention_mask"]
    verified, records = [], {}
    for i in range(len(response_mask)):
        names = json.loads(non_tensor_batch["reward_names"][i])
        feedback = json.loads(non_tensor_batch["feedback"][i])
        observed = json.loads(non_tensor_batch["observed"][i]) if "observed" in non_tensor_batch else [""] * len(names)
        rewards = [RewardScore(n, float(non_tensor_batch[n][i]), f, o) for n, f, o in zip(names, feedback, observed)]
        group = str(index[i])
        records[group] = row_record(non_tensor_batch["extra_info"][i])[0]
        prompt = prompts[i][attention[i, : prompts.shape[1]].bool()].tolist()
        tokens = batch["responses"][i][response_mask[i].bool()].tolist()
        sample = Sample(response_id=str(i), group_id=group, task=records[group].task, prompt="", prompt_token_ids=prompt,
                        response="", token_ids=tokens, sample_logprobs=[], model="verl", seed=0)
        verified.append(VerifiedSample(sample, rewards))
    return verified, records


@register_adv_est("mrtpo")
def compute_mrtpo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
                            config=None, non_tensor_batch: dict | None = None, batch=None,
                            **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """MRTPO per-token advantages [bs, response_length] (advantages, returns), verl's estimator signature.

    config (verl's `algorithm` section): `mrtpo_beta` (default 0.5) and `mrtpo_replay_model` (a local
    policy folder; without it beta is 0 and the result is verl's GDPO).
    """
    if batch is not None and "responses" not in batch.keys():
        raise ValueError(V1_BATCH)
    if non_tensor_batch is None or batch is None or "feedback" not in non_tensor_batch:
        raise ValueError("adv_estimator=mrtpo needs each response's reward scores and feedback: set "
                         "reward.custom_reward_function.path=pkg://pipeline.integrations.verl, and import "
                         "tokencredit.pipeline.integrations.verl in the trainer process (its verl.plugins entry point does); "
                         "with verl's v1 trainer (trainer.use_v1=true, the default) also set trainer.use_v1=false")
    config = config or {}
    replay_model = config.get("mrtpo_replay_model", None)
    beta = float(config.get("mrtpo_beta", 0.5)) if replay_model else 0.0
    verified, records = _verified(non_tensor_batch, batch, response_mask, index)
    credit = CreditConfig(kinds=("gdpo", "mrtpo") if beta > 0 else ("gdpo",), beta=beta, gdpo=preset("verl"))
    policy, tokenizer = _replay_model(replay_model) if beta > 0 else (None, None)
    annotated, _ = assign_credit(verified, records, credit, policy, tokenizer)
    lengths = response_mask.sum(-1).long().cpu()
    scale, shift = batch_statistics(torch.tensor([a.gdpo_sum for a in annotated], dtype=torch.float64),
                                    torch.ones(len(annotated), dtype=torch.bool), credit.gdpo, lengths)
    advantages = torch.zeros(response_mask.shape, dtype=torch.float64)
    for i, a in enumerate(annotated):
        n = int(lengths[i])
        summed = (torch.tensor(a.credit.mrtpo_sum, dtype=torch.float64) if beta > 0
                  else torch.full((n,), a.gdpo_sum, dtype=torch.float64))
        advantages[i, response_mask[i].bool().cpu()] = scale * (summed - shift)
    advantages = advantages.to(token_level_rewards.dtype).to(response_mask.device) * response_mask
    return advantages, advantages


def _pass_batch_to_mrtpo() -> None:
    """Wrap verl's `compute_advantage` so that the `mrtpo` estimator gets the batch (verl passes it to
    `gdpo` only); every other estimator goes to verl's own function unchanged."""
    from verl.trainer.ppo import ray_trainer

    original = ray_trainer.compute_advantage
    if getattr(original, "tokencredit", False):
        return

    @functools.wraps(original)
    def compute_advantage(data, adv_estimator, *args, config=None, **kwargs):
        if str(getattr(adv_estimator, "value", adv_estimator)) != "mrtpo":
            return original(data, adv_estimator, *args, config=config, **kwargs)
        if "response_mask" not in data.batch.keys():
            data.batch["response_mask"] = ray_trainer.compute_response_mask(data)
        advantages, returns = compute_mrtpo_advantage(
            token_level_rewards=data.batch["token_level_rewards"], response_mask=data.batch["response_mask"],
            index=data.non_tensor_batch["uid"], config=config, non_tensor_batch=data.non_tensor_batch,
            batch=data.batch)
        data.batch["advantages"], data.batch["returns"] = advantages, returns
        return data

    compute_advantage.tokencredit = True
    ray_trainer.compute_advantage = compute_advantage
    try:  # the v1 trainer's module holds its own reference when it was imported first
        from verl.trainer.ppo.v1 import utils as v1_utils
    except ImportError:  # its TransferQueue is not installed: the v1 trainer cannot run here anyway
        return
    v1_utils.compute_advantage = compute_advantage


_pass_batch_to_mrtpo()
