"""Token-credited training from a run directory (method.md section 5).

    run dir --DuckDB `training` view--> Examples --collate--> batch --train_step--> AdamW

Objectives: `pg`, the clipped offline policy gradient on per-token advantages (any kind of the
view, or a mix such as "mrtpo:0.5,gdpo:0.5"), and `sft`, token-weighted SFT whose weights are
the view's `sft_weight` (advantage=None) or the positive part of the chosen advantage, and `rs`,
rejection sampling: SFT with weight 1 on the responses that pass every reward (`passed_all`). Each
may add `kl_coef` x KL to the frozen initial policy (`kl_penalty`); `grad_accum` micro-batches of
`batch_size` make one optimizer step (the same gradient as one batch of their union); `bf16`
runs the forwards under bf16 autocast (CUDA; CPU works too, slowly); `lora` trains adapters.

The advantages are the dataset's: GDPO's batch step taken over the whole run (schemas/views.sql).
A trainer that prefers to normalize over its own batch, as TRL and verl do, reads `gdpo_sum` and
`mrtpo_sum` from the `responses` view and applies `advantages.batch_statistics` per batch.

The output directory holds

    out/checkpoint-{step}/   model (safetensors), tokenizer, trainer_state.pt, train_config.json
    out/final/               model (safetensors), tokenizer, train_config.json: weights only
    out/metrics.csv          step, loss, kl, mean_advantage, tokens (one row per optimizer step)
    out/metrics.png          those curves

A checkpoint is written to a temporary folder and renamed into place, so one that exists is
complete. Re-running with the same `out` resumes from the latest checkpoint: weights, AdamW
state, step and torch RNG state are restored, and the batch of each step is a pure function of
(seed, step), so the resumed run sees the batches an uninterrupted run would have seen.
"""
from __future__ import annotations

import csv
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from tokencredit.pipeline.train.losses import IGNORE_INDEX, kl_penalty, policy_gradient_loss
from tokencredit.pipeline.models.loading import load_policy
from tokencredit.pipeline.dataset.query import connect
from tokencredit.pipeline.dataset.training import check_aligned, parse_advantage, read_training
from tokencredit.pipeline.dataset.writer import run_files

OBJECTIVES = ("pg", "sft", "rs")
STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "train_config.json"
METRICS = ("step", "loss", "kl", "mean_advantage", "tokens")
# Config fields that shape the training trajectory: a resume must not change them.
RESUME_KEYS = ("data", "advantage", "objective", "model", "batch_size", "lr", "clip_eps", "seed", "lora",
               "grad_accum", "kl_coef")


@dataclass
class TrainConfig:
    data: str  # run directory written by annotate
    out: str  # checkpoint folder
    advantage: str | None = "mrtpo"  # gdpo | mrtpo | p2t | "mrtpo:0.5,gdpo:0.5"; None: sft_weight (sft only)
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
    save_optimizer: bool = False  # AdamW's moments in each checkpoint (twice the weights' size) for an exact resume
    grad_accum: int = 1  # micro-batches of batch_size per optimizer step
    kl_coef: float = 0.0  # weight of KL(pi || pi_ref), pi_ref = the initial policy (LoRA: the base model)
    bf16: bool = False  # bf16 autocast of the forward passes
    allow_incomplete: bool = False  # train on a run whose annotation has not finished

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
        if self.kl_coef < 0:
            raise ValueError(f"TrainConfig.kl_coef must be >= 0, got {self.kl_coef}")
        for name in ("steps", "batch_size", "save_every", "grad_accum"):
            if getattr(self, name) < 1:
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


def train_step(model, batch: dict[str, Tensor] | list[dict[str, Tensor]], objective: str,
               optimizer: torch.optim.Optimizer, clip_eps: float = 0.2, *, reference=None, kl_coef: float = 0.0,
               bf16: bool = False) -> dict[str, float]:
    """One optimizer step on a collate() batch, or on a list of them (micro-batches, on the model's device).

    The micro-batches' gradients accumulate, each weighted by its share of the step's tokens (pg, KL) or
    of its SFT weight (sft), so the step equals one on their union. `reference(batch)` gives log pi_ref
    of the labels ([B, L - 1]) for the `kl_coef` term. Returns loss (objective + kl_coef * kl), kl,
    mean_advantage (mean credit over the response tokens: the advantage for `pg`, the SFT weight for
    `sft`) and tokens (number of response tokens).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {OBJECTIVES}")
    if kl_coef and reference is None:
        raise ValueError("train_step: kl_coef > 0 needs a reference policy")
    micro = batch if isinstance(batch, list) else [batch]
    masks = [b["labels"][:, 1:] != IGNORE_INDEX for b in micro]
    tokens = sum(int(m.sum()) for m in masks)
    weight_sum = sum(float(b["credit"][:, 1:][m].sum()) for b, m in zip(micro, masks))
    if objective == "sft" and weight_sum <= 0:
        raise ValueError("train_step: the SFT weights of the batch's labelled tokens sum to zero")
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_total = kl_total = credit_total = 0.0
    for b, mask in zip(micro, masks):
        n = int(mask.sum())
        if n == 0:
            continue
        logprobs = _logprobs(model, b, bf16)
        credit = b["credit"][:, 1:]
        if objective == "sft":
            share = float(credit[mask].sum()) / weight_sum
            loss = -(credit * logprobs).sum() / weight_sum  # token_weighted_sft_loss over the union
        else:
            share = n / tokens
            loss = policy_gradient_loss(logprobs, b["sample_logprobs"][:, 1:], credit, mask, clip_eps) * share
        if kl_coef:
            with torch.no_grad():
                ref = reference(b)
            kl = kl_penalty(logprobs, ref, mask) * (n / tokens)
            loss = loss + kl_coef * kl
            kl_total += kl.item()
        if share or kl_coef:
            loss.backward()
        loss_total += loss.item()
        credit_total += float(credit[mask].sum())
    optimizer.step()
    return {"loss": loss_total, "kl": kl_total, "mean_advantage": credit_total / tokens, "tokens": tokens}


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
    steps = [int(p.name.split("-", 1)[1]) for p in out.glob("checkpoint-*") if p.name.split("-", 1)[1].isdigit()]
    return out / f"checkpoint-{max(steps)}" if steps else None


def _identity(config: TrainConfig) -> dict[str, Any]:
    fields = {key: getattr(config, key) for key in RESUME_KEYS}
    fields["data"] = str(Path(config.data).resolve())
    return fields


def save_checkpoint(model, tokenizer, optimizer, step: int, config: TrainConfig, dest: Path) -> Path:
    """Weights (safetensors), tokenizer and, unless `optimizer` is None, trainer state (step, RNG and,
    with `config.save_optimizer`, AdamW's moments) into `dest`, atomically (tmp folder + rename)."""
    tmp = dest.with_name(f"{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if optimizer is not None:
        state = {"step": step, "torch_rng": torch.get_rng_state()}
        if config.save_optimizer:
            state["optimizer"] = optimizer.state_dict()
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        torch.save(state, tmp / STATE_FILE)
    (tmp / CONFIG_FILE).write_text(json.dumps({**asdict(config), "identity": _identity(config)}, indent=2))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def restore(checkpoint: Path, config: TrainConfig, optimizer) -> int:
    """Load RNG and (when saved) optimizer state from a checkpoint of the same configuration; returns its step."""
    saved = json.loads((checkpoint / CONFIG_FILE).read_text())["identity"]
    defaults = {"grad_accum": 1, "kl_coef": 0.0}  # checkpoints written before these options existed
    changed = [f"{k}: saved {saved.get(k, defaults.get(k))!r}, now {v!r}" for k, v in _identity(config).items()
               if saved.get(k, defaults.get(k)) != v]
    if changed:
        raise ValueError(f"{checkpoint.parent} holds a run with another configuration ({'; '.join(changed)}); "
                         f"use a new out dir or the same settings")
    state = torch.load(checkpoint / STATE_FILE, weights_only=True)
    if "optimizer" in state:  # else AdamW's moments start again from zero
        optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return int(state["step"])


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


def train(config: TrainConfig) -> Path:
    """Train (or resume training) from config.data; returns the final checkpoint folder out/final."""
    examples = load_examples(config.data, config.advantage, config.objective, config.allow_incomplete)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)  # only once the data is usable: a refusal leaves no folder
    torch.manual_seed(config.seed)  # LoRA init; a resume then restores the saved RNG state
    checkpoint = latest_checkpoint(out)
    sampled_with = run_model(config.data, config.allow_incomplete)
    if config.model is None:
        config.model = sampled_with
    model, tokenizer = load_model(config, checkpoint)
    check_vocabulary(examples, config, sampled_with, model, tokenizer)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    start = restore(checkpoint, config, optimizer) if checkpoint else 0
    reference = reference_policy(config, model) if config.kl_coef else None
    metrics_csv = out / "metrics.csv"
    reset_metrics(metrics_csv, start)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    with metrics_csv.open("a", newline="") as f:
        log = csv.DictWriter(f, fieldnames=METRICS)
        progress = tqdm(range(start, config.steps), initial=start, total=config.steps, desc="train")
        for step in progress:
            indices = batch_indices(len(examples), config.batch_size * config.grad_accum, config.seed, step)
            micro = [collate([examples[i] for i in indices[m: m + config.batch_size]], pad_id)
                     for m in range(0, len(indices), config.batch_size)]
            objective = "sft" if config.objective == "rs" else config.objective  # rs: SFT on its 0/1 weights
            row = train_step(model, [{k: v.to(device) for k, v in b.items()} for b in micro], objective,
                             optimizer, config.clip_eps, reference=reference, kl_coef=config.kl_coef, bf16=config.bf16)
            log.writerow({"step": step + 1, **row})
            f.flush()
            progress.set_postfix(loss=f"{row['loss']:.4f}")
            if (step + 1) % config.save_every == 0 or step + 1 == config.steps:
                save_checkpoint(model, tokenizer, optimizer, step + 1, config, out / f"checkpoint-{step + 1}")
    plot_metrics(metrics_csv, out / "metrics.png")
    return save_checkpoint(model, tokenizer, None, max(start, config.steps), config, out / "final")
