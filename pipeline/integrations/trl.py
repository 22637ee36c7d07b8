"""TRL integration: tokencredit's per-token credit inside TRL's `GRPOTrainer`, online and offline.

Online (the MRTPO paper's setting): `MRTPOTrainer` is a `trl.GRPOTrainer` whose rewards are
tokencredit's verifiers, built-in and plugins (one TRL reward function per reward name, see
`verifier_rewards`; a TRL reward function becomes a verifier with `trl_verifier`) and whose
advantages are, each step, GDPO + MRTPO (optionally P2T) per token, with the replay run by the
current policy. Only the advantages change: TRL's generation, clipping, KL and loss stay TRL's.

    from tokencredit.pipeline.integrations.trl import MRTPOTrainer, prompt_dataset   # instead of GRPOTrainer
    trainer = MRTPOTrainer(model=model, records=records, args=GRPOConfig(...),
                           train_dataset=prompt_dataset(records, tokenizer), processing_class=tokenizer,
                           verifiers=["haiku=my_rewards.py:haiku"])   # as annotate's --verifier

Each step: TRL samples and scores (our reward functions verify every completion once, keeping each
reward's feedback); then `tokencredit.pipeline.credit.assign.assign_credit` computes, per prompt group, GDPO's A[i,k]
(TRL's options: `preset("trl")`) and MRTPO's per-token A[i,k,t] from the policy's leave-one-out
replay; GDPO's batch step is taken over the step's batch (as TRL does) and the (B, T) advantages go
to TRL's `_compute_loss`. With beta = 0 they equal TRL's own `normalize_then_sum` GDPO advantages.

Offline: `TokenWeightedSFTTrainer` trains on a run's `training` view with token-weighted SFT
(method.md section 5): `sft_dataset(run_dir)` gives the rows, `weighted_collator` pads them.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import datasets
import torch
import transformers
from trl import GRPOConfig, GRPOTrainer

from tokencredit import verifiers
from tokencredit.schemas.records import Sample, TaskRecord, VerifiedSample
from tokencredit.verifiers.plugins import PluginRef
from tokencredit.verifiers.trl_rewards import trl_verifier

from tokencredit.pipeline.credit.advantages import batch_statistics, preset
from tokencredit.pipeline.credit.assign import CreditConfig, assign_credit
from tokencredit.pipeline.train.losses import token_weighted_sft_loss
from tokencredit.pipeline.credit.mrtpo import smoothstep_beta
from tokencredit.pipeline.credit.p2t import p2t_advantages
from tokencredit.pipeline.sample.rows import render_prompt
from tokencredit.pipeline.train.trainer import Example, collate, load_examples
from tokencredit.pipeline.dataset.training import parse_advantage

logger = logging.getLogger(__name__)

__all__ = ["MRTPOTrainer", "TokenWeightedSFTTrainer", "prompt_dataset", "sft_dataset", "trl_verifier",
           "verifier_rewards", "weighted_collator"]


def prompt_dataset(records: Sequence[TaskRecord], tokenizer) -> datasets.Dataset:
    """A TRL prompt dataset: `prompt` (chat messages when the tokenizer has a chat template, else the
    text tokencredit samples from) and `record_id` (passed to the reward functions)."""
    chat = bool(getattr(tokenizer, "chat_template", None))
    return datasets.Dataset.from_list([
        {"prompt": [{"role": "user", "content": r.prompt}] if chat else render_prompt(tokenizer, r.prompt)[0],
         "record_id": r.id} for r in records])


def _text(completion: Any) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else completion


def plugin_refs(specs: Sequence[str | PluginRef]) -> tuple[PluginRef, ...]:
    """Plugin verifiers given as annotate's `--verifier` specs (`[TASK=]TARGET`, entry points too) or refs."""
    return tuple(s if isinstance(s, PluginRef) else verifiers.plugins.resolve([s])[0] for s in specs)


class VerifierRewards:
    """tokencredit's verifiers (built-in, then `plugin_refs`) as TRL reward functions, one per reward
    name (TRL logs each by its name): `functions[k]` returns each completion's reward named
    `names[k]`, None where its record has no such reward (TRL then leaves it out, as GDPO's mask does).
    Each batch is verified once; `last` keeps its RewardScores (score and feedback) for the credit."""

    def __init__(self, records: dict[str, TaskRecord], plugin_refs: Sequence[PluginRef] = ()):
        self.records, self.plugin_refs = records, tuple(plugin_refs)
        names = [n for r in records.values() for n in verifiers.reward_names(r, self.plugin_refs)]
        self.names = list(dict.fromkeys(names))
        self.last: tuple[tuple, list] | None = None
        self.functions = [self._reward(name) for name in self.names]

    def verify(self, completions: Sequence[Any], record_id: Sequence[str]) -> list:
        key = tuple(zip(record_id, map(_text, completions)))
        if self.last is None or self.last[0] != key:
            missing = sorted(set(record_id) - set(self.records))
            if missing:
                raise KeyError(f"reward functions: record ids {missing} are not among the trainer's records")
            self.last = (key, [verifiers.verify(self.records[rid], text, self.plugin_refs) for rid, text in key])
        return self.last[1]

    def _reward(self, name: str):
        def reward(completions, record_id, **_):
            return [next((s.score for s in scores if s.name == name), None)
                    for scores in self.verify(completions, record_id)]
        reward.__name__ = name
        return reward


def verifier_rewards(records: Sequence[TaskRecord], verifiers: Sequence[str | PluginRef] = ()) -> list:
    """TRL reward functions (one per reward name) scoring with tokencredit's verifiers and the plugin
    `verifiers` (annotate's `--verifier` specs or refs), for any TRL trainer; the dataset needs a
    `record_id` column (`prompt_dataset` has it)."""
    return VerifierRewards({r.id: r for r in records}, plugin_refs(verifiers)).functions


class MRTPOTrainer(GRPOTrainer):
    """`GRPOTrainer` with tokencredit's per-token advantages (module docstring).

    records: the task records the dataset's `record_id` column names. verifiers: plugin verifiers
    for them, as annotate's `--verifier` specs (`"haiku=my_rewards.py:haiku"`, entry-point names) or
    `PluginRef`s; a TRL reward function becomes one with `trl_verifier`. credit: what to compute
    (kinds, beta, GDPO options: TRL's by default). advantage: the per-token advantage handed to the
    loss: "mrtpo", "gdpo", "p2t" or a mix like "mrtpo:0.5,p2t:0.5". warmup_steps: beta ramps up by
    smoothstep over these optimizer steps (method.md section 2). reward_model: P2T's reward model.
    """

    def __init__(self, model, records: Sequence[TaskRecord], args: GRPOConfig | None = None, *,
                 credit: CreditConfig = CreditConfig(gdpo=preset("trl")), advantage: str = "mrtpo",
                 warmup_steps: int = 10, reward_model=None, verifiers: Sequence[str | PluginRef] = (), **kwargs):
        self.verifier = VerifierRewards({r.id: r for r in records}, plugin_refs(verifiers))
        self.credit, self.mix, self.warmup_steps = credit, parse_advantage(advantage), warmup_steps
        self.credit_reward_model = reward_model
        missing = [k for k in self.mix if k not in credit.kinds]
        if missing:
            raise ValueError(f"MRTPOTrainer: advantage {advantage!r} needs credit kinds {missing} "
                             f"(CreditConfig.kinds is {credit.kinds})")
        if args is not None and args.reward_weights is not None:
            raise ValueError("MRTPOTrainer: give reward weights by name in CreditConfig.reward_weights; "
                             "GRPOConfig.reward_weights only weighs TRL's own advantages, which it replaces")
        super().__init__(model=model, reward_funcs=self.verifier.functions, args=args, **kwargs)
        self._warn_short_warmup()

    def _warn_short_warmup(self) -> None:
        """A run no longer than the warm-up never reaches beta: say so, or a short run reads as MRTPO's."""
        steps = self.args.max_steps
        if 0 < steps <= self.warmup_steps and self.credit.beta > 0:
            last = smoothstep_beta(steps - 1, self.credit.beta, self.warmup_steps)
            logger.warning(f"MRTPOTrainer: beta warms up over {self.warmup_steps} steps and the run has {steps}: "
                           f"it reaches {last:.3g} of {self.credit.beta} at the last step (step 0 is plain GDPO); "
                           "pass warmup_steps= shorter than the run for MRTPO's credit")

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        output["advantages"] = self.token_advantages(inputs, output)
        return output

    def token_advantages(self, inputs: list[dict], output: dict) -> torch.Tensor:
        """(B, T) advantages for the step's completions (`output` of TRL's generation and scoring)."""
        ids, mask = output["completion_ids"], output["completion_mask"].bool()
        scores = self.verifier.last[1]
        G = self.num_generations if self.model.training else self.num_generations_eval
        offset = self.accelerator.process_index * len(inputs)
        records, verified = {}, []
        for i, (example, rewards) in enumerate(zip(inputs, scores)):
            group = f"{example['record_id']}#{(offset + i) // G}"  # TRL's groups: consecutive completions
            records[group] = self.verifier.records[example["record_id"]]
            tokens = ids[i][mask[i]].tolist()
            sample = Sample(response_id=str(i), group_id=group, task=records[group].task, prompt="",
                            prompt_token_ids=output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist(),
                            response="", token_ids=tokens, sample_logprobs=[], model="policy", seed=0)
            verified.append(VerifiedSample(sample, rewards))
        beta = smoothstep_beta(self.state.global_step, self.credit.beta, self.warmup_steps)
        config = dataclasses.replace(self.credit, beta=beta)
        policy = self.accelerator.unwrap_model(self.model)
        was_training = policy.training
        policy.eval()
        try:
            annotated, stats = assign_credit(verified, records, config, policy, self.processing_class,
                                             self.credit_reward_model)
        finally:
            policy.train(was_training)
        mode = "train" if self.model.training else "eval"
        for key in ("replays_done", "replays_skipped"):
            if key in stats:
                self._metrics[mode][f"mrtpo/{key}"].append(float(stats[key]))
        self._metrics[mode]["mrtpo/beta"].append(beta)
        return self._batch_step(annotated, ids.shape, config).to(ids.device)

    def _batch_step(self, annotated, shape, config: CreditConfig) -> torch.Tensor:
        """GDPO's batch step over this step's completions (all processes), then the chosen mix."""
        summed = torch.tensor([a.gdpo_sum for a in annotated], dtype=torch.float64)
        lengths = torch.tensor([len(a.verified.sample.token_ids) for a in annotated])
        gathered = self.accelerator.gather(summed.to(self.accelerator.device)).cpu()
        gathered_lengths = self.accelerator.gather(lengths.to(self.accelerator.device)).cpu()
        scale, shift = batch_statistics(gathered, torch.ones(len(gathered), dtype=torch.bool), config.gdpo,
                                        gathered_lengths)
        out = torch.zeros(shape, dtype=torch.float64)
        for i, a in enumerate(annotated):
            n = len(a.verified.sample.token_ids)
            gdpo = scale * (a.gdpo_sum - shift)
            per_kind = {"gdpo": torch.full((n,), float(gdpo), dtype=torch.float64)}
            if "mrtpo" in self.mix:
                per_kind["mrtpo"] = scale * (torch.tensor(a.credit.mrtpo_sum, dtype=torch.float64) - shift)
            if "p2t" in self.mix:
                per_kind["p2t"] = p2t_advantages(gdpo, torch.tensor(a.credit.p2t_reward), a.credit.p2t_alpha).double()
            out[i, :n] = sum(coef * per_kind[kind] for kind, coef in self.mix.items())
        return out.float()


# --- offline: token-weighted SFT on a run's training view ------------------------------------------


def sft_dataset(run_dir: str, advantage: str | None = None) -> datasets.Dataset:
    """The run's `training` view as rows of prompt_token_ids, token_ids and per-token sft_weight (the view's
    `sft_weight`, or the positive part of `advantage`); responses whose weights are all 0 are left out."""
    examples = load_examples(run_dir, advantage, "sft")
    return datasets.Dataset.from_list([{"prompt_token_ids": e.prompt_ids, "token_ids": e.token_ids,
                                        "sft_weight": e.credit} for e in examples])


def weighted_collator(pad_id: int):
    """A data collator for `sft_dataset` rows: input_ids, attention_mask, labels and `credit` (the weights)."""
    def collate_rows(rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = collate([Example("", r["prompt_token_ids"], r["token_ids"], [0.0] * len(r["token_ids"]),
                                 r["sft_weight"]) for r in rows], pad_id)
        del batch["sample_logprobs"]
        return batch
    return collate_rows


class TokenWeightedSFTTrainer(transformers.Trainer):
    """`transformers.Trainer` with the token-weighted SFT loss: - sum_t w_t log pi(y_t) / sum_t w_t.

    Use with `sft_dataset(run_dir)` and `data_collator=weighted_collator(tokenizer.pad_token_id)`
    (and `TrainingArguments(remove_unused_columns=False)`: the collator reads the raw columns)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        loss = token_weighted_sft_loss(logits, inputs["labels"], inputs["credit"])
        return (loss, {"logits": logits}) if return_outputs else loss
