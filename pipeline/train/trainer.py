"""Token-credited training from a run directory (method.md section 5), on `transformers.Trainer`.

    run dir --DuckDB `training` view--> Examples --StepSampler, collate--> micro-batches
            --CreditTrainer.compute_loss--> AdamW (Trainer's loop, accelerate, callbacks, checkpoints)

Objectives: `pg`, the clipped offline policy gradient on per-token advantages (any kind of the
view, or a mix such as "mrtpo:0.5,gdpo:0.5"), and `sft`, token-weighted SFT whose weights are
the view's `sft_weight` (advantage=None) or the positive part of the chosen advantage, and `rs`,
rejection sampling: SFT with weight 1 on the responses that pass every reward (`passed_all`). Each
may add `kl_coef` x KL to the frozen initial policy (`kl_penalty`); `grad_accum` micro-batches of
`batch_size` make one optimizer step (the same gradient as one batch of their union: each
micro-batch's loss is divided by the step's total tokens or SFT weight, not by its own); `bf16`
runs the forwards under bf16 autocast (CUDA; CPU works too, slowly); `lora` trains adapters.
The optimizer is torch's AdamW with its defaults (weight decay 0.01 on every trainable parameter)
at a constant learning rate, without gradient clipping. `train_step` is the same step without
Trainer, for a plain loop. Both stop (ValueError, one line naming the step) at the first loss or gradient that
holds NaN or an infinity, before the optimizer applies it: no checkpoint or final folder holds such a step.

The advantages are the dataset's: GDPO's batch step taken over the whole run (schemas/views.sql).
A trainer that prefers to normalize over its own batch, as TRL and verl do, reads `gdpo_sum` and
`mrtpo_sum` (or `mc_sum`) from the `responses` view and applies `advantages.batch_statistics` per batch.

The output directory holds

    out/checkpoint-{step}/   Trainer's checkpoint: the weights (LoRA: the adapter only), tokenizer,
                             trainer_state.json, rng_state.pth, train_config.json (written last);
                             optimizer.pt (AdamW's moments) only with `save_optimizer`
    out/final/               weights (LoRA: the adapter) (safetensors), tokenizer, train_config.json
    out/metrics.csv          step, loss, kl, mean_advantage, tokens (one row per optimizer step)
    out/metrics.png          those curves

Every `save_every` steps and at the last one Trainer saves a checkpoint; `save_total_limit` keeps
only the newest ones. Re-running with the same `out` resumes from the latest complete checkpoint
(one with its train_config.json) through Trainer's `resume_from_checkpoint`: weights, step, RNG
state and, when saved, AdamW's moments are restored, and the batch of each step is a pure function
of (seed, step), so the resumed run sees the batches an uninterrupted run would have seen. A resume
with other settings (RESUME_KEYS) is refused. `report_to` hands the logs (loss, kl, mean_advantage,
tokens) to Trainer's logging integrations (tensorboard, wandb, ...).
"""
from __future__ import annotations

import csv
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from torch import Tensor

from tokencredit.pipeline import interrupts
from tokencredit.pipeline.config import check_lr
from tokencredit.pipeline.progress import Phase
from tokencredit.pipeline.train.losses import IGNORE_INDEX, kl_penalty, policy_gradient_loss
from tokencredit.pipeline.models.loading import load_policy
from tokencredit.pipeline.dataset.derived import run_identity
from tokencredit.pipeline.dataset.query import connect
from tokencredit.pipeline.dataset.training import check_aligned, parse_advantage, read_training
from tokencredit.pipeline.dataset.writer import run_files

OBJECTIVES = ("pg", "sft", "rs")
CONFIG_FILE = "train_config.json"
METRICS = ("step", "loss", "kl", "mean_advantage", "tokens")
# Config fields that shape the training trajectory: a resume must not change them.
RESUME_KEYS = ("data", "advantage", "objective", "model", "batch_size", "lr", "clip_eps", "seed", "lora",
               "grad_accum", "kl_coef")


@dataclass
class TrainConfig:
    data: str  # run directory written by annotate
    out: str  # checkpoint folder
    advantage: str | None = "mrtpo"  # gdpo | mrtpo | p2t | mc | "mrtpo:0.5,gdpo:0.5"; None: sft_weight (sft only)
    objective: str = "pg"  # pg | sft | rs (rejection sampling: SFT on the responses that pass every reward)
    model: str | None = None  # registry name or local policy folder; None = the model the run was sampled with
    steps: int = 50
    batch_size: int = 16
    lr: float = 1e-4
    clip_eps: float = 0.2
    seed: int = 0
    device: str = "cpu"
    lora: bool = False  # LoRA adapters via `peft` (the `lora` extra); checkpoints then hold only the adapter
    save_every: int = 25
    save_total_limit: int | None = None  # keep only the newest N checkpoints (None: all)
    save_optimizer: bool = False  # AdamW's moments in each checkpoint (twice the weights' size) for an exact resume
    grad_accum: int = 1  # micro-batches of batch_size per optimizer step
    kl_coef: float = 0.0  # weight of KL(pi || pi_ref), pi_ref = the initial policy (LoRA: the base model)
    bf16: bool = False  # bf16 autocast of the forward passes
    allow_incomplete: bool = False  # train on a run whose annotation has not finished
    report_to: str = "none"  # Trainer's logging integrations: "tensorboard", "wandb", "all", ...

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"TrainConfig.objective: {self.objective!r} is not one of {OBJECTIVES}")
        if self.advantage is None and self.objective == "pg":
            raise ValueError("TrainConfig.advantage: objective 'pg' needs an advantage kind")
        if self.advantage is not None and self.objective == "rs":
            raise ValueError("TrainConfig.advantage: objective 'rs' weighs every token of a passing response 1; "
                             "pass advantage=None")
        if self.advantage is not None:
            parse_advantage(self.advantage)
        check_lr(self.lr, "TrainConfig.lr")
        if self.kl_coef < 0:
            raise ValueError(f"TrainConfig.kl_coef must be >= 0, got {self.kl_coef}")
        for name in ("steps", "batch_size", "save_every", "grad_accum", "save_total_limit"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class Example:
    """One response to train on; `credit` and `sample_logprobs` align with `token_ids`."""

    response_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    sample_logprobs: list[float]
    credit: list[float]  # per-token advantage (pg) or SFT weight (sft)


def load_examples(data: str | Path, advantage: str | None, objective: str,
                  allow_incomplete: bool = False) -> list[Example]:
    """The run's responses as Examples. Responses without tokens are dropped, and for `sft` also those
    whose weights are all zero: they add nothing to the numerator or the denominator of the loss."""
    examples = []
    for row in read_training(data, advantage, allow_incomplete):
        if objective == "pg":
            credit = row["advantages"]
            if row["sample_logprobs"] is None:
                raise ValueError(f"run dir {data}: response {row['response_id']!r}: field 'sample_logprobs' "
                                 f"is NULL; objective 'pg' needs the sampling log-probabilities")
            check_aligned(row, data, "sample_logprobs")
        elif objective == "rs":
            credit = [float(row["passed_all"])] * len(row["token_ids"])
        else:
            credit = row["sft_weight"] if advantage is None else [max(a, 0.0) for a in row["advantages"]]
        if not row["prompt_token_ids"]:
            raise ValueError(f"run dir {data}: response {row['response_id']!r}: field 'prompt_token_ids' is "
                             f"empty; the first response token needs a prompt to be predicted from")
        if not row["token_ids"] or (objective != "pg" and not any(credit)):
            continue
        examples.append(Example(row["response_id"], row["prompt_token_ids"], row["token_ids"],
                                row["sample_logprobs"] or [0.0] * len(credit), credit))
    if not examples:
        raise ValueError(f"run dir {data}: no response has tokens to train on with objective "
                         f"{objective!r} and advantage {advantage!r}")
    return examples


# --- tensors --------------------------------------------------------------------------------------


def collate(examples: list[Example], pad_id: int) -> dict[str, Tensor]:
    """Right-padded prompt + response batch, every tensor [B, L] with L = the longest prompt + response.

    input_ids (pad_id past the end), attention_mask (1 = real token), labels (the response token ids
    at their own positions, IGNORE_INDEX on prompt and padding: Hugging Face's unshifted layout),
    and, aligned with labels (0 elsewhere), credit and sample_logprobs.
    """
    length = max(len(e.prompt_ids) + len(e.token_ids) for e in examples)
    shape = (len(examples), length)
    batch = {"input_ids": torch.full(shape, pad_id, dtype=torch.long),
             "attention_mask": torch.zeros(shape, dtype=torch.long),
             "labels": torch.full(shape, IGNORE_INDEX, dtype=torch.long),
             "credit": torch.zeros(shape), "sample_logprobs": torch.zeros(shape)}
    for b, e in enumerate(examples):
        P, T = len(e.prompt_ids), len(e.token_ids)
        batch["input_ids"][b, :P + T] = torch.tensor(e.prompt_ids + e.token_ids)
        batch["attention_mask"][b, :P + T] = 1
        batch["labels"][b, P:P + T] = torch.tensor(e.token_ids)
        batch["credit"][b, P:P + T] = torch.tensor(e.credit)
        batch["sample_logprobs"][b, P:P + T] = torch.tensor(e.sample_logprobs)
    return batch


def token_logprobs(logits: Tensor, labels: Tensor) -> Tensor:
    """log pi(labels[:, t + 1] | ...) from logits[:, t]: [B, L, V], [B, L] -> [B, L - 1] float32,
    0 where the label is IGNORE_INDEX. cross_entropy avoids a [B, L, V] log-softmax copy."""
    targets = labels[:, 1:]
    nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), targets.clamp(min=0), reduction="none")
    return torch.where(targets != IGNORE_INDEX, -nll, 0.0)


def _logprobs(model, batch: dict[str, Tensor], bf16: bool) -> Tensor:
    device_type = batch["input_ids"].device.type
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return token_logprobs(logits, batch["labels"])


def step_totals(micro: list[dict[str, Tensor]]) -> tuple[int, float]:
    """(response tokens, their summed credit) over one optimizer step's micro-batches: the
    denominators of the step's pg/KL and SFT losses."""
    masks = [b["labels"][:, 1:] != IGNORE_INDEX for b in micro]
    return (sum(int(m.sum()) for m in masks),
            sum(float(b["credit"][:, 1:][m].sum()) for b, m in zip(micro, masks)))


def refuse_non_finite(where: str, what: str, value: Tensor) -> None:
    """ValueError (one line) when `value` holds NaN or an infinity: AdamW would carry it into every weight (a NaN
    policy that still scores, as a result), so the first one ends the training."""
    if not bool(torch.isfinite(value).all()):
        shown = value.item() if value.numel() == 1 else "NaN or inf"
        raise ValueError(f"{where}: {what} is not finite ({shown}); training stopped before the optimizer applied it "
                         f"and no checkpoint holds it; lower the learning rate, or check the policy's weights and "
                         f"the run's advantages")


def refuse_non_finite_gradients(where: str, model) -> None:
    """refuse_non_finite of every parameter's gradient, naming the first non-finite one. One device sync, not one a
    parameter: the test runs on per-tensor flags."""
    named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    if not named:
        return
    bad = torch.stack([~torch.isfinite(grad).all() for _, grad in named])
    if bool(bad.any()):
        name, grad = named[int(bad.nonzero()[0])]
        refuse_non_finite(where, f"the gradient of {name}", grad)


def micro_batch_loss(model, batch: dict[str, Tensor], objective: str, totals: tuple[int, float],
                     clip_eps: float = 0.2, reference=None, kl_coef: float = 0.0,
                     bf16: bool = False) -> tuple[Tensor, dict[str, float]]:
    """One micro-batch's part of its step's loss (scalar tensor) and its figures (loss, kl, credit sum).

    `totals` = step_totals of the whole step: pg and KL are token means and SFT a weighted mean over
    the union of the step's micro-batches, so the parts' gradients add up to the union's.
    `objective` is "pg" or "sft" (rs is SFT on 0/1 weights).
    """
    tokens, weight_sum = totals
    if objective == "sft" and weight_sum <= 0:
        raise ValueError("the SFT weights of the step's labelled tokens sum to zero")
    mask = batch["labels"][:, 1:] != IGNORE_INDEX
    share = int(mask.sum()) / tokens
    logprobs = _logprobs(model, batch, bf16)
    credit = batch["credit"][:, 1:]
    if objective == "sft":
        loss = -(credit * logprobs).sum() / weight_sum  # token_weighted_sft_loss over the union
    else:
        loss = policy_gradient_loss(logprobs, batch["sample_logprobs"][:, 1:], credit, mask, clip_eps) * share
    kl = 0.0
    if kl_coef:
        with torch.no_grad():
            ref = reference(batch)
        kl_term = kl_penalty(logprobs, ref, mask) * share
        loss = loss + kl_coef * kl_term
        kl = kl_term.item()
    return loss, {"loss": loss.item(), "kl": kl, "credit": float(credit[mask].sum())}


def step_figures(parts: list[dict[str, float]], tokens: int) -> dict[str, float]:
    """A step's metrics row from its micro-batches' figures: loss (objective + kl_coef * kl), kl,
    mean_advantage (mean credit over the response tokens: the advantage for pg, the SFT weight for
    sft) and tokens (number of response tokens)."""
    return {"loss": sum(p["loss"] for p in parts), "kl": sum(p["kl"] for p in parts),
            "mean_advantage": sum(p["credit"] for p in parts) / tokens, "tokens": tokens}


def train_step(model, batch: dict[str, Tensor] | list[dict[str, Tensor]], objective: str,
               optimizer: torch.optim.Optimizer, clip_eps: float = 0.2, *, reference=None, kl_coef: float = 0.0,
               bf16: bool = False) -> dict[str, float]:
    """One optimizer step on a collate() batch, or on a list of them (micro-batches, on the model's device),
    without Trainer: the step `train` takes, for a plain loop.

    The micro-batches' gradients accumulate (micro_batch_loss), so the step equals one on their union.
    `reference(batch)` gives log pi_ref of the labels ([B, L - 1]) for the `kl_coef` term. Returns the
    step_figures row; ValueError, the optimizer untouched, where a loss or a gradient is not finite.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {OBJECTIVES}")
    if kl_coef and reference is None:
        raise ValueError("train_step: kl_coef > 0 needs a reference policy")
    micro = batch if isinstance(batch, list) else [batch]
    totals = step_totals(micro)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    parts = []
    for b in micro:
        loss, figures = micro_batch_loss(model, b, "sft" if objective == "rs" else objective, totals, clip_eps,
                                         reference, kl_coef, bf16)
        refuse_non_finite("train_step", "the loss", loss)
        loss.backward()
        parts.append(figures)
    refuse_non_finite_gradients("train_step", model)
    optimizer.step()
    return step_figures(parts, totals[0])


def reference_policy(config: TrainConfig, model):
    """log pi_ref for the KL term, as a function of a batch: the frozen initial policy (config.model,
    also on resume), or with LoRA the base model itself with its adapters switched off."""
    if config.lora:
        def with_adapters_off(batch):
            with model.disable_adapter():
                return _logprobs(model, batch, config.bf16)
        return with_adapters_off
    frozen, _ = load_policy(config.model, device=config.device)
    frozen.eval().requires_grad_(False)
    return lambda batch: _logprobs(frozen, batch, config.bf16)


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Example indices of 0-based step `step`: consecutive slices of a stream of per-epoch
    permutations seeded by (seed, epoch), so the batch depends on (seed, step) only."""
    positions = range(step * batch_size, (step + 1) * batch_size)
    perms = {epoch: np.random.default_rng([seed, epoch]).permutation(n)
             for epoch in {pos // n for pos in positions}}
    return [int(perms[pos // n][pos % n]) for pos in positions]


class StepSampler(torch.utils.data.Sampler):
    """The example indices of `steps` optimizer steps of `per_step` examples each, step after step
    (batch_indices): Trainer's dataloader cuts them into micro-batches, so a resumed run that skips
    the first k steps' batches continues with the batches of step k."""

    def __init__(self, n: int, per_step: int, steps: int, seed: int):
        self.n, self.per_step, self.steps, self.seed = n, per_step, steps, seed

    def __len__(self) -> int:
        return self.per_step * self.steps

    def __iter__(self):
        for step in range(self.steps):
            yield from batch_indices(self.n, self.per_step, self.seed, step)


class CreditTrainer(transformers.Trainer):
    """`transformers.Trainer` with tokencredit's objectives (TrainConfig.objective) as compute_loss,
    the StepSampler's batches, torch's AdamW, and a metrics row (step_figures) in every training log.

    `reference` is reference_policy's function (for kl_coef > 0). `train_dataset` is a list of
    Examples, `data_collator` collate with the tokenizer's pad id.
    """

    def __init__(self, *args, config: TrainConfig, reference=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.config, self.reference = config, reference
        self.objective = "sft" if config.objective == "rs" else config.objective  # rs: SFT on its 0/1 weights
        self._totals: tuple[int, float] = (0, 0.0)
        self._parts: list[dict[str, float]] = []
        # compute_loss divides by the whole step's tokens or weight; Trainer must not divide by grad_accum again
        self.model_accepts_loss_kwargs = True
        self.add_callback(FiniteGradients())

    def _get_train_sampler(self, train_dataset=None):
        c = self.config
        n = len(self.train_dataset if train_dataset is None else train_dataset)
        return StepSampler(n, c.batch_size * c.grad_accum, c.steps, c.seed)

    def create_optimizer(self, model=None):
        if self.optimizer is None:  # torch's AdamW defaults on every trainable parameter, as `train_step` users do
            params = [p for p in (model or self.model).parameters() if p.requires_grad]
            self.optimizer = torch.optim.AdamW(params, lr=self.args.learning_rate)
        return self.optimizer

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._totals = step_totals(batches)
        return batches, num_items if num_items is not None else self._totals[0]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        c = self.config
        loss, figures = micro_batch_loss(model, inputs, self.objective, self._totals, c.clip_eps, self.reference,
                                         c.kl_coef, c.bf16)
        refuse_non_finite(f"step {self.state.global_step + 1}", "the loss", loss)
        self._parts.append(figures)
        return (loss, {}) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._parts:  # a training step's log (logging_steps=1): this step's figures
            logs.update(step_figures(self._parts, self._totals[0]))
            self._parts = []
        super().log(logs, start_time)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if self.config.save_optimizer:  # else a resume starts AdamW's moments (and the constant LR) afresh
            super()._save_optimizer_and_scheduler(output_dir)


class FiniteGradients(transformers.TrainerCallback):
    """Ends the training (refuse_non_finite_gradients) before the optimizer step of a gradient that is not finite."""

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        refuse_non_finite_gradients(f"step {state.global_step + 1}", model)


class MetricsCSV(transformers.TrainerCallback):
    """Appends each training log's step_figures to metrics.csv, and marks each checkpoint complete by
    writing its train_config.json last (latest_checkpoint only takes marked ones)."""

    def __init__(self, out: Path, config: TrainConfig):
        self.out, self.config = out, config

    def on_log(self, args, state, control, logs=None, **kwargs):
        interrupts.hold()  # an interrupted step's figures are not written
        if logs and "tokens" in logs:
            with (self.out / "metrics.csv").open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=METRICS).writerow(
                    {"step": state.global_step, **{k: logs[k] for k in METRICS[1:]}})

    def on_save(self, args, state, control, **kwargs):
        interrupts.hold()  # a checkpoint saved while an interrupt kills the process stays unmarked (incomplete)
        write_config(self.config, self.out / f"checkpoint-{state.global_step}")


class StepLines(transformers.TrainerCallback):
    """Each optimizer step's figures as a line of their own on stderr ('train: step 3/10, loss 0.123, ...'), in place
    of Trainer's bar and its printed dictionaries; `phase` hears of each line (its heartbeat waits 5 s from it)."""

    def __init__(self, phase: Phase):
        self.phase = phase

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "tokens" in logs:
            figures = ", ".join(f"{k.replace('_', ' ')} {logs[k]:.4g}" for k in METRICS[1:])
            print(f"train: step {state.global_step}/{state.max_steps}, {figures}", file=sys.stderr, flush=True)
            self.phase.mark()


# --- model, checkpoints, metrics --------------------------------------------------------------------


def load_model(config: TrainConfig, checkpoint: Path | None):
    """(model, tokenizer) from the latest checkpoint, else from config.model (or the shipped policy)."""
    if not config.lora:
        return load_policy(checkpoint or config.model, device=config.device)
    try:
        from peft import LoraConfig, PeftModel, get_peft_model
    except ImportError as err:
        raise ImportError("TrainConfig.lora=True needs the optional package `peft` (pip install peft)") from err
    model, tokenizer = load_policy(config.model, device=config.device)
    if checkpoint is not None:  # a LoRA checkpoint holds only the adapter
        return PeftModel.from_pretrained(model, str(checkpoint), is_trainable=True), tokenizer
    lora = LoraConfig(task_type="CAUSAL_LM", r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear")
    return get_peft_model(model, lora), tokenizer


def run_model(data: str | Path, allow_incomplete: bool = False) -> str | None:
    """The policy a run was sampled with, as its manifest records it (None: the shipped tiny policy)."""
    return run_files(str(data), allow_incomplete).manifest.get("config", {}).get("model")


def check_vocabulary(examples: list[Example], config: TrainConfig, sampled_with: str | None, model,
                     tokenizer) -> None:
    """Raise ValueError (one line, both models named) when the run's tokens are not this model's tokens:
    an id past the embedding table, or responses whose ids decode to other text."""
    sampled_with = sampled_with or "the shipped tiny policy"
    training = config.model or "the shipped tiny policy"
    size = model.get_input_embeddings().num_embeddings
    largest = max(max(e.prompt_ids + e.token_ids) for e in examples)
    texts = dict(read_responses(config.data, [e.response_id for e in examples[:8]], config.allow_incomplete))
    differ = [e.response_id for e in examples[:8] if texts.get(e.response_id)
              and not tokenizer.decode(e.token_ids, skip_special_tokens=True).startswith(texts[e.response_id][:20])]
    if largest >= size or differ:
        why = (f"token id {largest} is past its vocabulary of {size}" if largest >= size
               else f"response {differ[0]!r} decodes to other text with its tokenizer")
        raise ValueError(f"run dir {config.data} was sampled with {sampled_with}, but the model to train is "
                         f"{training}: {why}; pass --model with the run's model (or one sharing its tokenizer)")


def read_responses(data: str | Path, ids: list[str], allow_incomplete: bool) -> list[tuple[str, str]]:
    """(response_id, response text) for `ids`."""
    listed = ", ".join("'" + i.replace("'", "''") + "'" for i in ids)
    return connect(data, allow_incomplete=allow_incomplete).sql(
        f"SELECT response_id, response FROM responses WHERE response_id IN ({listed})").fetchall()


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint-N in `out` (its train_config.json written), or None."""
    steps = [int(p.parent.name.split("-", 1)[1]) for p in out.glob(f"checkpoint-*/{CONFIG_FILE}")
             if p.parent.name.split("-", 1)[1].isdigit()]
    return out / f"checkpoint-{max(steps)}" if steps else None


def _identity(config: TrainConfig) -> dict[str, Any]:
    fields = {key: getattr(config, key) for key in RESUME_KEYS}
    fields["data"] = str(Path(config.data).resolve())
    fields["run"] = run_identity(config.data, config.allow_incomplete)  # the run folder's content, not only its path
    return fields


def write_config(config: TrainConfig, folder: Path) -> None:
    (folder / CONFIG_FILE).write_text(json.dumps({**asdict(config), "identity": _identity(config)}, indent=2))


def check_resumable(checkpoint: Path, config: TrainConfig) -> int:
    """The step of a checkpoint written with the same trajectory settings; ValueError (one line) otherwise."""
    saved = json.loads((checkpoint / CONFIG_FILE).read_text())["identity"]
    now = _identity(config)
    run = now.pop("run")
    if "run" in saved and saved["run"] != run:  # (checkpoints written before runs were recorded have none)
        raise ValueError(f"{checkpoint.parent} holds checkpoints trained on an earlier or another run in {config.data} "
                         f"(run id {saved['run'].get('run_id')}, dataset {str(saved['run'].get('dataset_checksum'))[:12]}; "
                         f"it now holds run id {run['run_id']}, dataset {str(run['dataset_checksum'])[:12]}: written "
                         f"again since, e.g. by annotate --restart); use a new --out")
    defaults = {"grad_accum": 1, "kl_coef": 0.0}  # checkpoints written before these options existed
    changed = [f"{k}: saved {saved.get(k, defaults.get(k))!r}, now {v!r}" for k, v in now.items()
               if saved.get(k, defaults.get(k)) != v]
    if changed:
        raise ValueError(f"{checkpoint.parent} holds a run with another configuration ({'; '.join(changed)}); "
                         f"use a new out dir or the same settings")
    return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]


def save_final(model, tokenizer, config: TrainConfig, dest: Path) -> Path:
    """Weights (LoRA: the adapter; safetensors), tokenizer and train_config.json into `dest`, atomically
    (tmp folder + rename)."""
    tmp = dest.with_name(f"{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    write_config(config, tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def reset_metrics(path: Path, through_step: int) -> None:
    """Keep the rows of steps <= through_step (steps after the resumed checkpoint are redone)."""
    rows = []
    if path.exists():
        with path.open() as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) <= through_step]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=METRICS)
        writer.writeheader()
        writer.writerows(rows)


def plot_metrics(csv_path: Path, png_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    for ax, key in zip(axes, ("loss", "kl", "mean_advantage")):
        ax.plot(steps, [float(r[key] or "nan") for r in rows], marker=".")
        ax.set_xlabel("step")
        ax.set_title(key)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def training_arguments(config: TrainConfig) -> transformers.TrainingArguments:
    """TrainConfig as TrainingArguments: constant LR, no warm-up or clipping, a log every step, a
    checkpoint every save_every steps (and at the last), the collate() tensors kept as they are."""
    return transformers.TrainingArguments(
        output_dir=config.out, max_steps=config.steps, per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.grad_accum, learning_rate=config.lr, lr_scheduler_type="constant",
        warmup_steps=0, max_grad_norm=0.0, logging_steps=1, save_strategy="steps", save_steps=config.save_every,
        save_total_limit=config.save_total_limit, seed=config.seed, remove_unused_columns=False,
        use_cpu=config.device == "cpu", dataloader_pin_memory=False, report_to=config.report_to,
        disable_tqdm=True)  # StepLines prints each step


def train(config: TrainConfig, callbacks: Sequence[transformers.TrainerCallback] = ()) -> Path:
    """Train (or resume training) from config.data; returns the final checkpoint folder out/final.
    `callbacks` are extra TrainerCallbacks (progress, timing, ...)."""
    with Phase(f"train: reading {config.data} and loading the policy"):
        examples = load_examples(config.data, config.advantage, config.objective, config.allow_incomplete)
        out = Path(config.out)
        out.mkdir(parents=True, exist_ok=True)  # only once the data is usable: a refusal leaves no folder
        torch.manual_seed(config.seed)  # LoRA init; a resume then restores the saved RNG state
        checkpoint = latest_checkpoint(out)
        sampled_with = run_model(config.data, config.allow_incomplete)
        if config.model is None:
            config.model = sampled_with
        start = check_resumable(checkpoint, config) if checkpoint else 0
        model, tokenizer = load_model(config, checkpoint)
        check_vocabulary(examples, config, sampled_with, model, tokenizer)
        reference = reference_policy(config, model) if config.kl_coef else None
        reset_metrics(out / "metrics.csv", start)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if checkpoint:
        print(f"resuming from {checkpoint} (step {start} of {config.steps})")
    if start < config.steps:
        with Phase(f"train: steps {start + 1} to {config.steps}") as phase:
            trainer = CreditTrainer(model=model, args=training_arguments(config), train_dataset=examples,
                                    data_collator=lambda batch: collate(batch, pad_id), processing_class=tokenizer,
                                    callbacks=[MetricsCSV(out, config), StepLines(phase), *callbacks], config=config,
                                    reference=reference)
            trainer.remove_callback(transformers.PrinterCallback)  # its dictionaries: StepLines says the same
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    plot_metrics(out / "metrics.csv", out / "metrics.png")
    return save_final(model, tokenizer, config, out / "final")
