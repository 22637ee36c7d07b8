"""TRL integration: tokencredit's per-token credit inside TRL's `GRPOTrainer`, online and offline.

Online (the MRTPO paper's setting): `MRTPOTrainer` is a `trl.GRPOTrainer` whose rewards are
tokencredit's verifiers, built-in and plugins (one TRL reward function per reward name, see
`verifier_rewards`; a TRL reward function becomes a verifier with `trl_verifier`) and whose
advantages are, each step, GDPO + MRTPO (optionally P2T) per token, with the replay run by the
current policy. Only the advantages change: TRL's generation, clipping, KL and loss stay TRL's.

    from tokencredit.pipeline.integrations.trl import MRTPOTrainer, prompt_dataset   # instead of GRPOTrainer
    trainer = MRTPOTrainer(model=model, records=records, args=GRPOConfig(...),
                           train_dataset=prompt_dataset(records, tokenizer), processing_class=tokenizer,
                           verifiers=[("haiku", haiku)])   # or "haiku=my_rewards.py:haiku", as annotate's --verifier

Each step: TRL samples and scores (our reward functions verify every completion once, keeping each
reward's feedback; a completion its verifiers fail on gets None rewards and a warning, as annotate
marks it a verifier_error, and no advantage); then `tokencredit.pipeline.credit.assign.assign_credit` computes, per prompt group, GDPO's A[i,k]
(TRL's options: `preset("trl")`) and MRTPO's per-token A[i,k,t] from the policy's leave-one-out
replay; GDPO's batch step is taken over the step's batch (as TRL does) and the (B, T) advantages go
to TRL's `_compute_loss`. With beta = 0 they equal TRL's own `normalize_then_sum` GDPO advantages.

Offline: `TokenWeightedSFTTrainer` trains on a run's `training` view with token-weighted SFT
(method.md section 5): `sft_dataset(run_dir)` gives the rows, `weighted_collator` pads them.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from math import nan
from typing import Any

import datasets
import torch
import transformers
from trl import GRPOConfig, GRPOTrainer

from tokencredit import verifiers
from tokencredit.schemas.records import PluginSpec, RewardScore, Sample, TaskRecord, VerifiedSample
from tokencredit.verifiers import isolation
from tokencredit.verifiers.plugins import PluginError, PluginRef, of_object
from tokencredit.verifiers.trl_rewards import assistant_text, trl_verifier

from tokencredit.pipeline.config import AnnotateConfig
from tokencredit.pipeline.credit.advantages import batch_statistics, preset
from tokencredit.pipeline.credit.assign import CreditConfig, assign_credit
from tokencredit.pipeline.train.losses import token_weighted_sft_loss
from tokencredit.pipeline.credit.mc import NEEDS_TREE
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


RECORD_ID = ("record_id names the task record each prompt was made from, so that the reward functions "
             "know which record's verifiers score its completions; prompt_dataset(records, tokenizer) adds it")

Verifier = str | PluginRef | tuple[str, Any] | Any
# (seconds, bytes) of each call of an importable plugin, run in a worker process as annotate runs it
# (--verifier-timeout, --verifier-memory defaults); a verifier object runs in this process
BOUNDS = (AnnotateConfig.verifier_timeout_s, AnnotateConfig.verifier_memory_bytes)


def plugin_refs(items: Sequence[Verifier]) -> tuple[PluginRef, ...]:
    """Plugin verifiers as Python gives them: annotate's `--verifier` specs (`[TASK=]TARGET`, entry
    points too), refs, or verifier objects (a callable record, response -> rewards, e.g. a
    `trl_verifier`), alone for every record or in a `(task, verifier)` pair."""
    if isinstance(items, (str, PluginRef)) or callable(items):
        raise TypeError(f"verifiers={items!r}: expected a list of verifiers, e.g. [('haiku', haiku)]")
    return tuple(_ref(item) for item in items)


def _ref(item: Verifier) -> PluginRef:
    if isinstance(item, PluginRef):
        return item
    if isinstance(item, str):  # imported in a worker process, as annotate imports it
        return isolation.resolve([item], BOUNDS[1])[0]
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
        return of_object(item[1], item[0])
    if isinstance(item, tuple):
        raise TypeError(f"verifiers: {item!r} is not a (task, verifier) pair")
    return of_object(item)


class VerifierRewards:
    """tokencredit's verifiers (built-in, then `plugin_refs`) as TRL reward functions, one per reward
    name (TRL logs each by its name): `functions[k]` returns each completion's reward named
    `names[k]`, None where its record has no such reward (TRL then leaves it out, as GDPO's mask does).
    Each batch is verified once; `last` keeps its RewardScores (score and feedback) for the credit
    and each completion's status: "ok", or "verifier_error: ..." where a verifier failed on it (its
    rewards are None then, and a warning names the record and the error: annotate's policy)."""

    def __init__(self, records: dict[str, TaskRecord], plugin_refs: Sequence[PluginRef] = ()):
        self.records, self.plugin_refs = records, tuple(plugin_refs)
        self.names = _reward_names(records.values(), self.plugin_refs)
        self.last: tuple[tuple, list[list[RewardScore]], list[str]] | None = None
        self.functions = [self._reward(name) for name in self.names]

    def verify(self, completions: Sequence[Any], record_id: Sequence[str]) -> list[list[RewardScore]]:
        key = tuple(zip(record_id, map(assistant_text, completions)))
        if self.last is None or self.last[0] != key:
            missing = sorted(set(record_id) - set(self.records))
            if missing:
                raise KeyError(f"reward functions: record ids {missing} are not among the trainer's records")
            results = [self._verify_one(rid, text) for rid, text in key]
            self.last = (key, [scores for scores, _ in results], [status for _, status in results])
        return self.last[1]

    def _verify_one(self, record_id: str, text: str) -> tuple[list[RewardScore], str]:
        try:
            scores = isolation.verify(self.records[record_id], text, self.plugin_refs, *BOUNDS)
            unknown = [s.name for s in scores if s.name not in self.names]
            if unknown:
                raise PluginError(f"rewards {unknown} are not among {self.names}, the names the verifiers gave "
                                  "the first record of each task: a plugin must give every record of a task the "
                                  "same reward names")
            return scores, "ok"
        except Exception as error:  # noqa: BLE001 - as annotate: one completion's verifier bug must not stop training
            # a plugin's failure in its worker reads as annotate's status; an in-process error says its type
            reason = str(error) if isinstance(error, isolation.VerifierFailed) else f"{type(error).__name__}: {error}"
            notes = "".join(f" ({note})" for note in getattr(error, "__notes__", ()))
            logger.warning(f"record {record_id!r}: the verifiers failed on a completion, whose rewards are None: "
                           f"{reason}{notes}")
            return [], f"verifier_error: {reason}"

    def _reward(self, name: str):
        def reward(completions, record_id=None, **_):
            if record_id is None:
                raise ValueError(f"reward function {name!r}: the dataset has no record_id column; {RECORD_ID}")
            return [next((s.score for s in scores if s.name == name), None)
                    for scores in self.verify(completions, record_id)]
        reward.__name__ = name
        return reward


def _reward_names(records: Iterable[TaskRecord], refs: Sequence[PluginRef]) -> list[str]:
    """The reward names in order of appearance: each record's built-in ones, and the plugins' as they
    name the first record of each task, so that a plugin is called once per task, not per record
    (`VerifierRewards` refuses a record's reward of another name)."""
    names, probed = [], set()
    for record in records:
        if record.task not in probed:
            probed.add(record.task)
            names += [s.name for s in isolation.verify(record, record.reference_response or "", refs, *BOUNDS)]
        elif not isinstance(record.spec, PluginSpec):
            names += verifiers.reward_names(record)
    return list(dict.fromkeys(names))


def verifier_rewards(records: Sequence[TaskRecord], verifiers: Sequence[Verifier] = ()) -> list:
    """TRL reward functions (one per reward name) scoring with tokencredit's verifiers and the plugin
    `verifiers` (as `plugin_refs` takes them), for any TRL trainer; they take completions as strings
    or conversational messages, and the dataset needs a `record_id` column (`prompt_dataset` has it)."""
    return VerifierRewards({r.id: r for r in records}, plugin_refs(verifiers)).functions


class MRTPOTrainer(GRPOTrainer):
    """`GRPOTrainer` with tokencredit's per-token advantages (module docstring).

    records: the task records the dataset's `record_id` column names. verifiers: plugin verifiers
    for them (in place of TRL's `reward_funcs`), as `plugin_refs` takes them: `("haiku", haiku)`
    pairs of a task and a verifier object, annotate's `--verifier` specs (`"haiku=my_rewards.py:haiku"`,
    entry-point names) or `PluginRef`s; a TRL reward function becomes one with `trl_verifier`. credit: what to compute
    (kinds, beta, GDPO options: TRL's by default). advantage: the per-token advantage handed to the
    loss: "mrtpo", "gdpo", "p2t" or a mix like "mrtpo:0.5,p2t:0.5". warmup_steps: beta ramps up by
    smoothstep over these optimizer steps (method.md section 2). reward_model: P2T's reward model.
    """

    def __init__(self, model, records: Sequence[TaskRecord], args: GRPOConfig | None = None, *,
                 credit: CreditConfig = CreditConfig(gdpo=preset("trl")), advantage: str = "mrtpo",
                 warmup_steps: int = 10, reward_model=None, verifiers: Sequence[Verifier] = (), **kwargs):
        if "reward_funcs" in kwargs:
            raise TypeError("MRTPOTrainer scores with tokencredit's verifiers, not reward_funcs: pass records= and "
                            "verifiers=[(task, verifier), ...] (a TRL reward function wrapped as "
                            "trl_verifier(fn, feedback=...), a verifier object, or a 'task=module:name' spec)")
        _check_record_id(kwargs.get("train_dataset"), "train_dataset")
        _check_record_id(kwargs.get("eval_dataset"), "eval_dataset")
        self.verifier = VerifierRewards({r.id: r for r in records}, plugin_refs(verifiers))
        self.credit, self.mix, self.warmup_steps = credit, parse_advantage(advantage), warmup_steps
        self.credit_reward_model = reward_model
        if "mc" in credit.kinds:
            raise ValueError(f"MRTPOTrainer: {NEEDS_TREE}, and TRL samples flat groups; train on an annotated tree "
                             f"run's `mc` offline instead (tokencredit train --advantage mc, sft_dataset, export)")
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
        for i, (example, rewards, status) in enumerate(zip(inputs, scores, self.verifier.last[2])):
            group = f"{example['record_id']}#{(offset + i) // G}"  # TRL's groups: consecutive completions
            records[group] = self.verifier.records[example["record_id"]]
            tokens = ids[i][mask[i]].tolist()
            sample = Sample(response_id=str(i), group_id=group, task=records[group].task, prompt="",
                            prompt_token_ids=output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist(),
                            response="", token_ids=tokens, sample_logprobs=[], model="policy", seed=0)
            verified.append(VerifiedSample(sample, rewards, status))
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
        """GDPO's batch step over this step's completions (all processes), then the chosen mix; a
        completion its verifiers failed on (no credit) is left out and gets 0, as TRL gives an unscorable one."""
        summed = torch.tensor([nan if a.gdpo_sum is None else a.gdpo_sum for a in annotated], dtype=torch.float64)
        lengths = torch.tensor([len(a.verified.sample.token_ids) for a in annotated])
        gathered = self.accelerator.gather(summed.to(self.accelerator.device)).cpu()
        gathered_lengths = self.accelerator.gather(lengths.to(self.accelerator.device)).cpu()
        scale, shift = batch_statistics(gathered, ~gathered.isnan(), config.gdpo, gathered_lengths)
        out = torch.zeros(shape, dtype=torch.float64)
        for i, a in enumerate(annotated):
            if a.credit is None:
                continue
            n = len(a.verified.sample.token_ids)
            gdpo = scale * (a.gdpo_sum - shift)
            per_kind = {"gdpo": torch.full((n,), float(gdpo), dtype=torch.float64)}
            if "mrtpo" in self.mix:
                per_kind["mrtpo"] = scale * (torch.tensor(a.credit.mrtpo_sum, dtype=torch.float64) - shift)
            if "p2t" in self.mix:
                per_kind["p2t"] = p2t_advantages(gdpo, torch.tensor(a.credit.p2t_reward), a.credit.p2t_alpha).double()
            out[i, :n] = sum(coef * per_kind[kind] for kind, coef in self.mix.items())
        return out.float()


def _check_record_id(dataset, argument: str) -> None:
    columns = getattr(dataset, "column_names", None)  # a dict of eval datasets or a stream may not say
    if isinstance(columns, list) and "record_id" not in columns:
        raise ValueError(f"MRTPOTrainer: {argument} has no record_id column (its columns: {', '.join(columns)}); "
                         f"{RECORD_ID}")


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
