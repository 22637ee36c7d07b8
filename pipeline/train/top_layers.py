"""`rm train --train-layers N`: the reward model's top N decoder layers trained with its score head.

The frozen backbone runs once per response (as for the linear head) and keeps each response's hidden state
entering layer L - N. Training then runs only the top N layers, the final norm and the head on those cached
states: on a CPU that is N / L of a full forward and backward per step, where LoRA through the whole backbone
(or TRL's RewardTrainer) would pay for all L layers every step.

The start is the linear head the frozen backbone chose (pooling, L2), so epoch 0 is the frozen model. Each
epoch is scored on a dev fraction of the TRAIN prompts (the held-out prompts are never read here); the epoch
with the best dev accuracy is kept, epoch 0 included, so training the layers can only be kept where it helped
on dev.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Cached:
    """One response as the top layers read it: ids [T] (prompt + response), prompt length, states [T, h]."""

    ids: list[int]
    prompt_len: int
    states: Tensor


def top_backbone(model, n: int):
    """A backbone holding the classifier's top n decoder layers, final norm and rotary embedding (the same
    modules, so training it trains them), run with `inputs_embeds` = the states entering layer L - n."""
    base = model.base_model
    layers = getattr(base, "layers", None)
    if layers is None or not hasattr(base, "norm") or not 1 <= n <= len(layers):
        count = len(layers) if layers is not None else 0
        raise ValueError(f"--train-layers {n}: the base needs 1..{count} decoder layers in `.layers` and a final "
                         f"`.norm` (Llama, Qwen2, Mistral have them)")
    config = copy.deepcopy(base.config)
    config.num_hidden_layers = n
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[-n:]
    with torch.device("meta"):  # the fresh modules are replaced by the classifier's own below
        top = type(base)(config)
    top.embed_tokens, top.layers, top.norm = base.embed_tokens, layers[-n:], base.norm
    if hasattr(base, "rotary_emb"):
        top.rotary_emb = base.rotary_emb
    return top


def scores(model, top, cached: Sequence[Cached], pooling: str) -> Tensor:
    """[B] the classifier's scores of the cached responses, through the top layers only."""
    from tokencredit.pipeline.credit.p2t import padded_batch, pool_weights

    pad = model.config.pad_token_id
    ids, mask, is_response = padded_batch([c.ids[:c.prompt_len] for c in cached],
                                          [c.ids[c.prompt_len:] for c in cached], pad)
    states = torch.zeros(*ids.shape, cached[0].states.shape[-1])
    for j, c in enumerate(cached):
        states[j, :len(c.ids)] = c.states
    hidden = top(inputs_embeds=states, attention_mask=mask, use_cache=False).last_hidden_state
    return (model.score(hidden)[..., 0].float() * pool_weights(ids, mask, is_response, pad, pooling)).sum(-1)


def all_scores(model, top, cached: Sequence[Cached], pooling: str, batch_size: int) -> Tensor:
    """[N] scores of every cached response, without gradients."""
    with torch.no_grad():
        return torch.cat([scores(model, top, cached[i:i + batch_size], pooling)
                          for i in range(0, len(cached), batch_size)])


def train_top_layers(model, cached: Sequence[Cached], fit: Sequence[tuple[int, int]], dev: Sequence[tuple[int, int]],
                     accuracy: Callable[[Tensor, Sequence[tuple[int, int]]], float], pooling: str, n: int,
                     epochs: int, lr: float, pair_batch: int, seed: int,
                     on_step: Callable[[int, int], None] | None = None) -> list[float]:
    """Train the top n layers, final norm and head on Bradley-Terry over `fit` pairs (indices into `cached`);
    keep the epoch (0 = as given) with the best accuracy(scores [N], pairs) on `dev`. Returns the dev accuracy
    per epoch. on_step(pairs, tokens) is called after each step (its pairs and the tokens of their responses)."""
    top = top_backbone(model, n)
    params = [*top.layers.parameters(), *top.norm.parameters(), *model.score.parameters()]
    optimizer = torch.optim.Adam(params, lr=lr)
    generator = torch.Generator().manual_seed(seed)
    dev_ids = sorted({i for pair in dev for i in pair})

    def dev_accuracy() -> float:
        found = all_scores(model, top, [cached[i] for i in dev_ids], pooling, 2 * pair_batch)
        score = torch.zeros(len(cached))
        score[dev_ids] = found
        return accuracy(score, dev)

    history = [dev_accuracy()]
    best = copy.deepcopy([p.detach() for p in params])
    for _ in range(epochs):
        order = torch.randperm(len(fit), generator=generator).tolist()
        for start in range(0, len(order), pair_batch):
            batch = [fit[j] for j in order[start:start + pair_batch]]
            members = sorted({i for pair in batch for i in pair})
            where = {i: j for j, i in enumerate(members)}
            found = scores(model, top, [cached[i] for i in members], pooling)
            margin = torch.stack([found[where[c]] - found[where[r]] for c, r in batch])
            optimizer.zero_grad()
            torch.nn.functional.softplus(-margin).mean().backward()  # -log sigmoid(margin)
            optimizer.step()
            if on_step is not None:
                on_step(len(batch), sum(len(cached[i].ids) for i in members))
        history.append(dev_accuracy())
        if history[-1] > max(history[:-1]):
            best = copy.deepcopy([p.detach() for p in params])
    with torch.no_grad():
        for p, kept in zip(params, best):
            p.copy_(kept)
    return history
