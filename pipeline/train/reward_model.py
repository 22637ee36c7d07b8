"""`tokencredit rm train`: a scalar reward model from a run's verifier labels, for P2T's `--reward-model`.

Pairs: within one group (the responses of one prompt), every two responses whose MEAN reward differs,
the higher one chosen (ties give no pair). The mean is what GDPO's summed advantage ranks by and the one
order defined on every task; per-reward orders are measured on held-out pairs (`pairwise_accuracy`).
The split is by GROUP (prompt): a held-out fraction of the prompts, never pairs of one prompt on both sides.

Model: the base causal LM's backbone, frozen, with a linear score head, fit with the Bradley-Terry loss
-log sigmoid(r_chosen - r_rejected). The head reads the last token (HF's `*ForSequenceClassification`
pooling) or the mean over the response's tokens (`config.tokencredit_pooling = "response_mean"`, which
P2T reads; bench/bench_reward_model_features.py found it separates the labels better); the pooling and
the L2 penalty are chosen by cross-validation over the train prompts. A frozen backbone gives each response
one feature vector per pooling, so the backbone runs once per response and the head trains in seconds;
TRL's RewardTrainer (which runs the backbone every step of every epoch) does not fit a CPU budget and adds
nothing on a frozen backbone. `--train-layers N` then trains the top N decoder layers with the head on the
states cached entering them (`top_layers.py`), the epoch kept by a dev part of the train prompts.
The input layout is P2T's (`p2t.encode_for_reward_model`): the prompt rendered for the base's tokenizer,
then the response text.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from tokencredit.pipeline.interrupts import hold

MIN_PAIRS = 8  # fewer train or held-out pairs make the accuracy noise
L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # the head's L2 strengths tried by cross-validation on the train groups


@dataclass(frozen=True)
class RewardModelConfig:
    base: str = "smollm2-135m-instruct"
    heldout: float = 0.25  # fraction of the groups (prompts) held out
    seed: int = 0
    steps: int = 500  # full-batch optimizer steps on the cached features
    lr: float = 0.05
    batch_size: int = 8  # responses per backbone forward
    bootstrap: int = 1000  # resamples of the held-out groups for the accuracy's interval
    pooling: str = "auto"  # "last", "response_mean", or "auto": the one that cross-validates best
    train_layers: int = 0  # top decoder layers trained with the head (top_layers.py); 0: the head alone
    epochs: int = 2  # passes over the fit pairs when train_layers > 0
    layer_lr: float = 2e-5  # Adam's step size for the top layers, norm and head
    dev: float = 0.25  # fraction of the train groups that picks the epoch when train_layers > 0
    pair_batch: int = 16  # pairs per step when train_layers > 0

    def __post_init__(self) -> None:
        from tokencredit.pipeline.credit.p2t import POOLINGS

        if self.pooling not in ("auto", *POOLINGS):
            raise ValueError(f"--pooling must be one of {('auto', *POOLINGS)}, got {self.pooling!r}")
        if not 0 < self.heldout < 1:
            raise ValueError(f"--heldout must be in (0, 1), got {self.heldout}")
        if self.train_layers < 0 or self.epochs < 0:
            raise ValueError(f"--train-layers and --epochs must be >= 0, got {self.train_layers}, {self.epochs}")
        if not 0 < self.dev < 1:
            raise ValueError(f"--dev must be in (0, 1), got {self.dev}")
        for name in ("steps", "batch_size", "pair_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


@dataclass
class Response:
    response_id: str
    group_id: str
    prompt: str  # the task prompt (the record's), not the policy's rendered one
    text: str
    reward_names: list[str]
    rewards: list[float]

    @property
    def mean(self) -> float:
        return sum(self.rewards) / len(self.rewards)


@dataclass
class Pairs:
    """chosen[j], rejected[j]: indices into `responses`; `heldout`: the held-out group ids."""

    responses: list[Response]
    chosen: list[int]
    rejected: list[int]
    heldout: set[str] = field(default_factory=set)

    def split(self, heldout: bool) -> list[tuple[int, int]]:
        return [(c, r) for c, r in zip(self.chosen, self.rejected)
                if (self.responses[c].group_id in self.heldout) == heldout]


def read_responses(run: str, allow_incomplete: bool = False) -> list[Response]:
    """The run's verified responses with their task prompts (`status = 'ok'`, rewards present); of the shards
    written so far when `allow_incomplete` (each shard holds whole groups)."""
    from tokencredit.pipeline.dataset.export import run_records
    from tokencredit.pipeline.dataset.query import connect

    rows = connect(run, allow_incomplete=allow_incomplete).execute(
        "select response_id, group_id, response, reward_names, rewards from responses "
        "where status = 'ok' and len(rewards) > 0 order by response_id").fetchall()
    records = run_records(run)[0]
    return [Response(rid, gid, records[gid].prompt, text, list(names), list(rewards))
            for rid, gid, text, names, rewards in rows]


def mean_reward_pairs(responses: Sequence[Response]) -> tuple[list[int], list[int]]:
    """(chosen, rejected) index lists: every two responses of one group whose mean reward differs."""
    chosen, rejected, by_group = [], [], {}
    for i, r in enumerate(responses):
        by_group.setdefault(r.group_id, []).append(i)
    for members in by_group.values():
        for a in members:
            for b in members:
                if responses[a].mean > responses[b].mean:
                    chosen.append(a)
                    rejected.append(b)
    return chosen, rejected


def heldout_groups(groups: Sequence[str], fraction: float, seed: int) -> set[str]:
    """A fixed `fraction` of the groups (at least one, never all), chosen by a hash of (seed, group id)."""
    ranked = sorted(set(groups), key=lambda g: hashlib.sha256(f"{seed}\x00{g}".encode()).digest())
    count = min(max(1, round(fraction * len(ranked))), len(ranked) - 1)
    return set(ranked[:count])


def make_pairs(run: str, config: RewardModelConfig, allow_incomplete: bool = False) -> Pairs:
    """The run's preference pairs, split by group; ValueError (naming the run) when either side is too small."""
    responses = read_responses(run, allow_incomplete)
    chosen, rejected = mean_reward_pairs(responses)
    groups = sorted({responses[c].group_id for c in chosen})
    if len(groups) < 2:
        raise ValueError(f"run {run}: {len(chosen)} preference pairs in {len(groups)} group(s) (a pair is two responses "
                         f"of one prompt whose mean reward differs); rm train needs pairs in at least 2 groups, to "
                         f"hold some out: sample more prompts or more responses per prompt (--n)")
    pairs = Pairs(responses, chosen, rejected, heldout_groups(groups, config.heldout, config.seed))
    for side in (False, True):
        found = len(pairs.split(side))
        if found < MIN_PAIRS:
            raise ValueError(f"run {run}: {found} {'held-out' if side else 'train'} preference pairs (of {len(chosen)} "
                             f"in {len(groups)} groups); rm train needs at least {MIN_PAIRS} on each side: sample more "
                             f"prompts or more responses per prompt (--n), or change --heldout")
    return pairs


def load_base(base: str, device: str = "cpu"):
    """(sequence classifier with one output on the base's backbone, its tokenizer): safetensors only, no
    remote code (`models.loading`); the score head is new (the causal LM has none)."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    from tokencredit.pipeline.models.loading import load_tokenizer, resolve_model_path

    folder = resolve_model_path(base, Path(base))
    tokenizer = load_tokenizer(folder)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the new head is "missing from the checkpoint" by design
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            folder, local_files_only=True, use_safetensors=True, trust_remote_code=False, num_labels=1,
            dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


def response_features(model, tokenizer, responses: Sequence[Response], batch_size: int,
                      on_progress: Callable[[int, int], None] | None = None,
                      cache_layer: int | None = None) -> tuple[dict[str, Tensor], list]:
    """({pooling: [N, h] float32} for each of P2T's poolings, cached): the backbone's last hidden state pooled
    by the weights P2T scores with (`p2t.pool_weights`), so a head w scores a response <w, feature> there too;
    `cached` holds, when `cache_layer` is given, each response's hidden states entering that decoder layer
    (`top_layers.Cached`), else nothing."""
    from tokencredit.pipeline.credit.p2t import POOLINGS, encode_for_reward_model, padded_batch, pool_weights
    from tokencredit.pipeline.train.top_layers import Cached

    pad = model.config.pad_token_id
    device = model.get_input_embeddings().weight.device
    encoded = [encode_for_reward_model(tokenizer, r.prompt, r.text) for r in responses]
    features: dict[str, list[Tensor]] = {pooling: [] for pooling in POOLINGS}
    cached = []
    for start in range(0, len(encoded), batch_size):
        batch = encoded[start:start + batch_size]
        ids, mask, is_response = padded_batch([p for p, _, _ in batch], [r for _, r, _ in batch], pad, device)
        with torch.no_grad():
            out = model.base_model(input_ids=ids, attention_mask=mask, output_hidden_states=cache_layer is not None)
        hidden = out.last_hidden_state.float()  # [B, L, h]
        for pooling in POOLINGS:
            weights = pool_weights(ids, mask, is_response, pad, pooling)
            features[pooling].append(torch.einsum("blh,bl->bh", hidden, weights).cpu())
        if cache_layer is not None:
            cached += [Cached(p + r, len(p), out.hidden_states[cache_layer][j, :len(p) + len(r)].float().cpu())
                       for j, (p, r, _) in enumerate(batch)]
        if on_progress is not None:
            on_progress(len(batch), sum(len(p) + len(r) for p, r, _ in batch))
    return {pooling: torch.cat(found) for pooling, found in features.items()}, cached


def fit_head(features: Tensor, pairs: Sequence[tuple[int, int]], config: RewardModelConfig, l2: float) -> Tensor:
    """Weights w [h] of score(x) = <w, x> minimizing the Bradley-Terry loss over (chosen, rejected) pairs
    plus l2 * |w|^2 on standardized features.

    The features are standardized while fitting and w is mapped back to raw features: a score's offset
    cancels in every pair, so <w / sd, x> ranks as the standardized head does.
    """
    mu, sd = features.mean(0), features.std(0).clamp(min=1e-6)
    x = (features - mu) / sd
    chosen = torch.tensor([c for c, _ in pairs])
    rejected = torch.tensor([r for _, r in pairs])
    generator = torch.Generator().manual_seed(config.seed)
    w = (0.01 * torch.randn(x.shape[1], generator=generator)).requires_grad_(True)
    optimizer = torch.optim.Adam([w], lr=config.lr)
    for _ in range(config.steps):
        optimizer.zero_grad()
        margin = (x[chosen] - x[rejected]) @ w
        (torch.nn.functional.softplus(-margin).mean() + l2 * w.square().sum()).backward()  # -log sigmoid(margin)
        optimizer.step()
    return w.detach() / sd


def choose_head(features: dict[str, Tensor], pairs: Sequence[tuple[int, int]], responses: Sequence[Response],
                config: RewardModelConfig) -> tuple[str, float]:
    """(pooling, L2 strength of L2_GRID) with the best cross-validated pairwise accuracy on the TRAIN groups
    (a frozen backbone's features outnumber a few hundred pairs: unpenalized, the head fits them all); the
    pooling is config.pooling unless that is "auto". Ties go to the earlier pooling and the weaker L2."""
    poolings = list(features) if config.pooling == "auto" else [config.pooling]
    return max(((pooling, l2) for pooling in poolings for l2 in L2_GRID),
               key=lambda c: cv_accuracy(features[c[0]], pairs, responses, config, c[1]))


def cv_accuracy(features: Tensor, pairs: Sequence[tuple[int, int]], responses: Sequence[Response],
                config: RewardModelConfig, l2: float, folds: int = 4,
                fit_groups: Callable[[list[str]], list[str]] | None = None) -> float:
    """Pairwise accuracy of heads fit on all but one of `folds` folds of the pairs' groups, on that fold's
    pairs, pooled over folds. `fit_groups` picks which of a fold's fit groups to fit on (all by default)."""
    groups = sorted({responses[c].group_id for c, _ in pairs})
    fold_of = {g: i % folds for i, g in enumerate(sorted(groups, key=lambda g: hashlib.sha256(
        f"{config.seed}\x01{g}".encode()).digest()))}
    right = total = 0.0
    for fold in range(folds):
        keep = {g for g in groups if fold_of[g] != fold}
        keep = set(fit_groups(sorted(keep))) if fit_groups is not None else keep
        fit = [p for p in pairs if responses[p[0]].group_id in keep]
        held = [p for p in pairs if fold_of[responses[p[0]].group_id] == fold]
        if fit and held:
            right += pairwise_accuracy(features @ fit_head(features, fit, config, l2), held) * len(held)
            total += len(held)
    return right / total if total else float("nan")


def pairwise_accuracy(scores: Tensor, pairs: Sequence[tuple[int, int]]) -> float:
    """Fraction of (chosen, rejected) pairs the scores order right (a tie counts half)."""
    if not pairs:
        return float("nan")
    diff = torch.tensor([float(scores[c] - scores[r]) for c, r in pairs])
    return float(((diff > 0).float() + 0.5 * (diff == 0).float()).mean())


def family_pairs(responses: Sequence[Response], groups: set[str]) -> dict[str, list[tuple[int, int]]]:
    """Per reward name: pairs of one group's responses where that reward passed (1) in one and failed (< 1)
    in the other, over `groups`; and "mean" (the training order). A reward name that a prompt holds twice
    (two constraints of one kind) is judged by its first."""
    by_group: dict[str, list[int]] = {}
    for i, r in enumerate(responses):
        if r.group_id in groups:
            by_group.setdefault(r.group_id, []).append(i)
    out: dict[str, list[tuple[int, int]]] = {"mean": []}
    for members in by_group.values():
        for a in members:
            for b in members:
                ra, rb = responses[a], responses[b]
                if ra.mean > rb.mean:
                    out["mean"].append((a, b))
                for name in dict.fromkeys(ra.reward_names):
                    k = ra.reward_names.index(name)
                    if ra.rewards[k] >= 1 > rb.rewards[k]:
                        out.setdefault(name, []).append((a, b))
    return out


def bootstrap_interval(scores: Tensor, pairs: Sequence[tuple[int, int]], responses: Sequence[Response],
                       resamples: int, seed: int) -> tuple[float | None, float | None]:
    """95% percentile interval of the pairwise accuracy over resampled held-out groups (pairs move with their group);
    (None, None) where the pairs come from one group (nothing to resample)."""
    by_group: dict[str, list[tuple[int, int]]] = {}
    for c, r in pairs:
        by_group.setdefault(responses[c].group_id, []).append((c, r))
    groups = sorted(by_group)
    if len(groups) < 2 or resamples < 1:
        return None, None
    right = {g: sum(float(scores[c] > scores[r]) + 0.5 * float(scores[c] == scores[r]) for c, r in by_group[g])
             for g in groups}
    counts = torch.tensor([len(by_group[g]) for g in groups], dtype=torch.float64)
    hits = torch.tensor([right[g] for g in groups], dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    draw = torch.randint(len(groups), (resamples, len(groups)), generator=generator)
    accuracy = hits[draw].sum(1) / counts[draw].sum(1)
    low, high = torch.quantile(accuracy, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return low, high


def save_reward_model(model, tokenizer, pooling: str, out: str | Path, report: dict) -> Path:
    """Write the folder `--reward-model` takes (safetensors, tokenizer, config with the pooling P2T reads, and
    `rm_train.json`: how it was made and its held-out accuracy), atomically: into a sibling folder, then
    renamed over `out`."""
    from tokencredit.pipeline.credit.p2t import POOLING_KEY

    out = Path(out)
    for stale in out.parent.glob(f".{out.name}.tmp-*"):  # left by a run killed while saving
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    setattr(model.config, POOLING_KEY, pooling)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "rm_train.json").write_text(json.dumps(report, indent=2) + "\n")
    hold()  # an interrupt being handled: the folder it cut short is not renamed into place
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def check_out(out: str | Path) -> None:
    """ValueError when OUT holds something other than a reward model this command wrote."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "rm_train.json").is_file())):
        raise ValueError(f"--out {out}: exists and is not a reward model folder of rm train; pick another path")


def train_reward_model(run: str, out: str | Path, config: RewardModelConfig = RewardModelConfig(),
                       device: str = "cpu", progress: bool = True, allow_incomplete: bool = False) -> dict:
    """Pairs from `run` -> features of the frozen base -> head (-> top layers) -> held-out accuracy -> the folder `out`.
    Returns the report (also in OUT/rm_train.json). Bad input raises ValueError before the base loads."""
    from tokencredit.pipeline.progress import Progress
    from tokencredit.pipeline.train.top_layers import all_scores, top_backbone

    check_out(out)
    pairs = make_pairs(run, config, allow_incomplete)
    train, heldout = pairs.split(False), pairs.split(True)
    model, tokenizer = load_base(config.base, device)
    layers = model.config.num_hidden_layers
    if config.train_layers:
        top_backbone(model, config.train_layers)  # a bad --train-layers is refused before the forward
    with Progress("rm features", total=len(pairs.responses), unit="response", enabled=progress) as bar:
        features, cached = response_features(model, tokenizer, pairs.responses, config.batch_size,
                                             lambda n, tokens: bar.update(n, tokens),
                                             layers - config.train_layers if config.train_layers else None)
    # with top layers to train, a dev quarter of the train groups is kept from the head too, so that epoch 0
    # (the head alone) is scored on dev as fairly as the epochs after it
    fit, dev = dev_split(train, pairs, config) if config.train_layers else (train, [])
    pooling, l2 = choose_head(features, fit, pairs.responses, config)
    weights = fit_head(features[pooling], fit, config, l2)
    with torch.no_grad():
        model.score.weight.copy_(weights.to(model.score.weight)[None])
    scores = features[pooling] @ weights
    dev_history = None
    if config.train_layers:
        check_top_layers(model, cached[:4], features[pooling][:4] @ weights, pooling, config)
        dev_history = train_layers(model, cached, fit, dev, pooling, config, progress)
        scores = all_scores(model, top_backbone(model, config.train_layers), cached, pooling, config.batch_size)
    trained = family_pairs(pairs.responses, {r.group_id for r in pairs.responses} - pairs.heldout)
    families = []
    for name, found in family_pairs(pairs.responses, pairs.heldout).items():
        low, high = bootstrap_interval(scores, found, pairs.responses, config.bootstrap, config.seed)
        families.append({"family": name, "pairs_train": len(trained.get(name, ())), "pairs_heldout": len(found),
                         "pairwise_accuracy": pairwise_accuracy(scores, found), "ci_low": low, "ci_high": high})
    report = {"run": str(run), "config": asdict(config), "pairs_train": len(train), "pairs_heldout": len(heldout),
              "pooling": pooling, "l2": l2, "groups_heldout": sorted(pairs.heldout),
              "pairs_dev": len(dev), "dev_accuracy_per_epoch": dev_history,
              "train_accuracy": pairwise_accuracy(scores, train), "families": families}
    save_reward_model(model, tokenizer, pooling, out, report)
    return report


def check_top_layers(model, cached: list, expected: Tensor, pooling: str, config: RewardModelConfig) -> None:
    """ValueError unless the top layers on cached states give the full forward's scores `expected` [B]: a
    decoder whose forward does more to `inputs_embeds` than run its layers (Gemma scales them) cannot train so."""
    from tokencredit.pipeline.train.top_layers import all_scores, top_backbone

    found = all_scores(model, top_backbone(model, config.train_layers), cached, pooling, config.batch_size)
    expected = expected.detach()
    if not torch.allclose(found, expected, rtol=1e-3, atol=1e-3):
        raise ValueError(f"--train-layers {config.train_layers}: base {config.base} does not reproduce its own scores "
                         f"from cached states (max difference {float((found - expected).abs().max()):.3g}); "
                         f"use --train-layers 0")


def dev_split(train: Sequence[tuple[int, int]], pairs: Pairs,
              config: RewardModelConfig) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(fit, dev): the train pairs split by group, a config.dev fraction of the train groups on the dev side."""
    dev_groups = heldout_groups(sorted({pairs.responses[c].group_id for c, _ in train}), config.dev, config.seed + 1)
    return ([p for p in train if pairs.responses[p[0]].group_id not in dev_groups],
            [p for p in train if pairs.responses[p[0]].group_id in dev_groups])


def train_layers(model, cached: list, fit: Sequence[tuple[int, int]], dev: Sequence[tuple[int, int]], pooling: str,
                 config: RewardModelConfig, progress: bool) -> list[float]:
    """Train the top config.train_layers layers with the head on the `fit` pairs, the epoch picked on `dev`
    (`top_layers.train_top_layers`). Returns the dev accuracy per epoch (0: the head alone)."""
    from tokencredit.pipeline.progress import Progress
    from tokencredit.pipeline.train.top_layers import train_top_layers

    with Progress("rm top layers", total=config.epochs * len(fit), unit="pair", enabled=progress) as bar:
        return train_top_layers(model, cached, fit, dev, pairwise_accuracy, pooling, config.train_layers, config.epochs,
                                config.layer_lr, config.pair_batch, config.seed, bar.update)
