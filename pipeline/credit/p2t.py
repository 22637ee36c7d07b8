"""P2T: training-free token rewards from a sequence reward model (method.md section 3).

A scalar reward model R(x, y) is read out per response token by one forward and one
backward pass: with E the input embeddings and B a baseline embedding,
gradient-times-input gives a[t] = <dR/dE[t], E[t] - B[t]> on the response tokens.
Integrated gradients is the costlier reference (m forward/backward passes).

What `attribute` needs from the reward model (any HF `*ForSequenceClassification` built
on `GenericForSequenceClassification`, e.g. Llama, Qwen2, Mistral, satisfies it):
    get_input_embeddings()                      ids [B, L] -> embeddings [B, L, d]
    base_model(inputs_embeds=, attention_mask=) -> object with .last_hidden_state [B, L, h]
    score                                       hidden [B, L, h] -> per-position scores [B, L, 1]
    config.pad_token_id                         used for pooling and for the "pad" baseline
    config.tokencredit_pooling (optional)       "last" (the default) or "response_mean"
We call the backbone and the head ourselves instead of `model(...)` because HF's classifier,
given `inputs_embeds`, pools the LAST position (wrong for right padding); it only finds the
last real token from `input_ids`, and it refuses both at once. `pool_weights` reproduces HF's
rule exactly: the rightmost position whose id is not the pad id. A model that `rm train` saved
with `tokencredit_pooling = "response_mean"` scores the mean of the head over the response's
positions instead (a frozen backbone's last token separates verifier labels worse than the mean
does); plain HF code reading that folder pools the last token, so its scores differ from P2T's.

A reward model whose tokenizer differs from the policy's (`attribute_across_tokenizers`) reads the
response TEXT in its own tokens: a[s] is computed per reward-model token s, then carried to the policy's
tokens by character overlap (`carry_to_tokens`). The reward model reads the prompt rendered as the sampler
renders one for it (its chat template, else the plain layout), then the response text without special
tokens; `rm train` trains on the same layout (`encode_for_reward_model`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tokencredit.pipeline.sample.detokenize import token_spans
from tokencredit.pipeline.sample.rows import render_prompt

EPS = 1e-6
METHODS = ("grad_x_input", "integrated_gradients")
BASELINES = ("pad", "zero")
FORMS = ("paper", "completeness")
POOLINGS = ("last", "response_mean")
POOLING_KEY = "tokencredit_pooling"  # a config.json field of rm train's models; absent means HF's "last"


@dataclass
class Attribution:
    """One response: the reward model's scalar score and the raw attribution a [T] (float32, CPU)."""

    score: float
    raw: Tensor


def attribute(
    reward_model,
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    *,
    baseline: str = "pad",
    batch_size: int = 16,
    method: str = "grad_x_input",
    ig_steps: int = 32,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[Attribution]:
    """Attribute each response's reward-model score to its tokens.

    prompt_ids[i] and response_ids[i] are reward-model token ids; the model reads
    prompt + response. Returns one Attribution per response, in input order, with
    raw of length len(response_ids[i]). Sequences are right-padded and batched by length.

    baseline: "pad" (embedding of config.pad_token_id, as in the paper) or "zero".
    method: "grad_x_input" (one forward + one backward per batch) or
    "integrated_gradients": midpoint Riemann sum over ig_steps points
    alpha = (s + 0.5) / m on the straight line from B to E (Captum's "riemann_middle").
    Only the response embeddings are interpolated, the prompt embeddings stay fixed, so
    sum_t a[t] ~= R(E) - R(prompt, baseline response): credit is split among response
    tokens only, conditioned on the actual prompt.
    on_progress(responses, tokens) is called after each batch (its responses and response tokens).
    """
    _check_args(reward_model, prompt_ids, response_ids, baseline, batch_size, method, ig_steps)
    # longest first so that each batch pads to similar lengths
    order = sorted(range(len(prompt_ids)), key=lambda i: -(len(prompt_ids[i]) + len(response_ids[i])))
    out: list[Attribution | None] = [None] * len(order)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        batch = _attribute_batch(reward_model, [prompt_ids[i] for i in idx], [response_ids[i] for i in idx],
                                 baseline, method, ig_steps)
        for i, a in zip(idx, batch):
            out[i] = a
        if on_progress is not None:
            on_progress(len(idx), sum(len(response_ids[i]) for i in idx))
    return out


def shares_vocab(reward_tokenizer, policy_tokenizer) -> bool:
    """Whether the reward model reads the policy's token ids as they are (the direct path)."""
    return reward_tokenizer is None or reward_tokenizer.get_vocab() == policy_tokenizer.get_vocab()


def encode_for_reward_model(tokenizer, prompt: str, response: str) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """One (task prompt, response text) as a reward model reads it: (prompt ids, response ids, each response
    token's [char_start, char_end) in `response`). The prompt is rendered as the sampler renders it for this
    tokenizer; the response is its text without special tokens (needs a fast tokenizer, for the offsets).
    An empty response is the end-of-sequence token alone, of no characters."""
    prompt_ids = render_prompt(tokenizer, prompt)[1]
    if not response:
        return prompt_ids, [tokenizer.eos_token_id], [(0, 0)]
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"reward model tokenizer {type(tokenizer).__name__} is not a fast tokenizer; P2T across "
                         "tokenizers needs its character offsets (return_offsets_mapping)")
    encoded = tokenizer(response, add_special_tokens=False, return_offsets_mapping=True)
    return prompt_ids, encoded["input_ids"], [tuple(o) for o in encoded["offset_mapping"]]


def carry_to_tokens(raw: Tensor, source_spans: Sequence[tuple[int, int]], starts: Sequence[int],
                    ends: Sequence[int]) -> Tensor:
    """Attribution a [S] over reward-model tokens -> [T] over policy tokens, by characters.

    Each reward-model token s spreads a[s] evenly over its characters source_spans[s] = [start, end), and a
    policy token [starts[t], ends[t]) collects what lies on its characters: out[t] = sum_s a[s] * overlap(s, t)
    / len(s). So the total is kept whenever the policy's spans cover the text (they tile it), and a token
    of no characters on either side (a special token) gets or gives nothing.
    """
    src = torch.tensor(source_spans, dtype=torch.float32).reshape(-1, 2)  # [S, 2]
    lo = torch.tensor(starts, dtype=torch.float32)
    hi = torch.tensor(ends, dtype=torch.float32)
    overlap = (torch.minimum(src[:, 1:], hi[None]) - torch.maximum(src[:, :1], lo[None])).clamp(min=0)  # [S, T]
    width = (src[:, 1] - src[:, 0]).clamp(min=1)[:, None]
    return raw.float() @ (overlap / width)


def attribute_across_tokenizers(reward_model, reward_tokenizer, policy_tokenizer, prompts: Sequence[str],
                                response_ids: Sequence[Sequence[int]], **options) -> list[Attribution]:
    """P2T when the reward model has a tokenizer of its own: one Attribution per response whose raw [T] is
    over the policy's tokens response_ids[i] (`carry_to_tokens` of the reward-model tokens' attribution).

    prompts[i] is the task prompt (not the policy's rendered one); the response text is the policy's decode
    of response_ids[i] (skip_special_tokens), whose character spans `token_spans` gives. `options` go to
    `attribute` (baseline, batch_size, method, ig_steps, on_progress).
    """
    spans = [token_spans(policy_tokenizer, ids)[1:] for ids in response_ids]
    texts = [policy_tokenizer.decode(ids, skip_special_tokens=True) for ids in response_ids]
    encoded = [encode_for_reward_model(reward_tokenizer, p, text) for p, text in zip(prompts, texts)]
    found = attribute(reward_model, [e[0] for e in encoded], [e[1] for e in encoded], **options)
    return [Attribution(score=a.score, raw=carry_to_tokens(a.raw, e[2], *span))
            for a, e, span in zip(found, encoded, spans)]


def _check_args(model, prompt_ids, response_ids, baseline, batch_size, method, ig_steps) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if method == "integrated_gradients" and ig_steps < 1:
        raise ValueError(f"ig_steps must be >= 1, got {ig_steps}")
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"prompt_ids has {len(prompt_ids)} rows but response_ids has {len(response_ids)}")
    if model.config.pad_token_id is None:
        raise ValueError("reward model: field 'config.pad_token_id' is None; P2T pads batches with it")
    if getattr(model.config, "num_labels", 1) != 1:
        raise ValueError(f"reward model: field 'config.num_labels' must be 1, got {model.config.num_labels}")
    pooling_of(model)
    vocab = model.get_input_embeddings().num_embeddings
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        if len(r) == 0:
            raise ValueError(f"response {i}: field 'response_ids' is empty")
        for name, ids in (("prompt_ids", p), ("response_ids", r)):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"response {i}: field {name!r} has ids outside [0, {vocab}): {bad[:5]}")


def _attribute_batch(model, prompts, responses, baseline, method, ig_steps) -> list[Attribution]:
    pad_id = model.config.pad_token_id
    embed = model.get_input_embeddings()
    device = embed.weight.device
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    ids, mask, is_resp = padded_batch(prompts, responses, pad_id, device)

    with torch.no_grad():
        E = embed(ids)  # [B, L, d]
        b = embed.weight[pad_id] if baseline == "pad" else torch.zeros_like(embed.weight[0])
        # the baseline differs from E only on response positions
        B = torch.where(is_resp[..., None], b.expand_as(E), E)
    pool = pool_weights(ids, mask, is_resp, pad_id, pooling_of(model))

    if method == "grad_x_input":
        R, G = _score_and_grad(model, E, mask, pool)
    else:
        with torch.no_grad():
            R = _pooled_score(model, E, mask, pool)
        G = torch.zeros_like(E, dtype=torch.float32)
        for s in range(ig_steps):
            alpha = (s + 0.5) / ig_steps
            G += _score_and_grad(model, B + alpha * (E - B), mask, pool)[1].float()
        G /= ig_steps
    a = (G.float() * (E.float() - B.float())).sum(-1)  # [B, L]; zero outside the response
    return [
        Attribution(score=float(R[j]), raw=a[j, len(p):lengths[j]].detach().cpu())
        for j, p in enumerate(prompts)
    ]


def padded_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int,
                 device=None) -> tuple[Tensor, Tensor, Tensor]:
    """Rows prompt + response, right-padded: ids [B, L] long, attention mask [B, L] long, is_response [B, L] bool."""
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
    ids = torch.full((len(lengths), max(lengths)), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    is_response = torch.zeros_like(ids, dtype=torch.bool)
    for j, (p, r) in enumerate(zip(prompts, responses)):
        ids[j, :lengths[j]] = torch.tensor([*p, *r], dtype=torch.long, device=device)
        mask[j, :lengths[j]] = 1
        is_response[j, len(p):lengths[j]] = True
    return ids, mask, is_response


def pooling_of(model) -> str:
    """The reward model's pooling rule: config.tokencredit_pooling, "last" when absent (any HF classifier)."""
    pooling = getattr(model.config, POOLING_KEY, None) or "last"
    if pooling not in POOLINGS:
        raise ValueError(f"reward model: field 'config.{POOLING_KEY}' must be one of {POOLINGS}, got {pooling!r}")
    return pooling


def pool_weights(ids: Tensor, mask: Tensor, is_response: Tensor, pad_id: int, pooling: str) -> Tensor:
    """[B, L] float32 weights whose sum over positions of the head's per-position score is the reward.

    "last": 1 at the rightmost real token whose id is not the pad id (HF's pooling rule; position 0 if none);
    "response_mean": 1 / T_b on each of the row's T_b response positions (`is_response` [B, L] bool).
    """
    if pooling == "response_mean":
        weights = is_response.float()
        return weights / weights.sum(-1, keepdim=True).clamp(min=1)
    keep = ((ids != pad_id) & mask.bool()).to(torch.long)
    last = (torch.arange(ids.shape[1], device=ids.device) * keep).argmax(-1)
    return torch.nn.functional.one_hot(last, ids.shape[1]).float()


def _pooled_score(model, E: Tensor, mask: Tensor, pool: Tensor) -> Tensor:
    """[B] scalar score from embeddings E [B, L, d] under attention mask [B, L] and pool weights [B, L]."""
    hidden = model.base_model(inputs_embeds=E, attention_mask=mask).last_hidden_state
    logits = model.score(hidden)[..., 0]  # [B, L]
    return (logits.float() * pool).sum(-1)


def _score_and_grad(model, E: Tensor, mask: Tensor, pool: Tensor) -> tuple[Tensor, Tensor]:
    """Score [B] and dR/dE [B, L, d]. Grads are taken w.r.t. E only: parameters accumulate nothing.

    Summing R over the batch is exact: rows do not interact, and right padding sits after
    every position the pool weights read, so causal attention keeps padded positions out of R.
    """
    with torch.enable_grad():
        E = E.detach().requires_grad_(True)
        R = _pooled_score(model, E, mask, pool)
        (G,) = torch.autograd.grad(R.sum(), E)
    return R.detach(), G


def token_rewards(score: float, raw: Tensor, form: str = "paper", omega: float = 0.6) -> Tensor:
    """Token rewards [T] float32 from the score R and raw attribution a [T].

    "paper":        R2T[t] = R + omega * R * softmax(a)[t]   (sums to (T + omega) * R)
    "completeness": rho[t] = R * a[t] / sum_u a[u]           (sums to R; R / T when |sum a| <= eps)
    """
    a = raw.detach().float()
    if form == "paper":
        return score + omega * score * torch.softmax(a, dim=0)
    if form == "completeness":
        total = a.sum()
        if abs(float(total)) <= EPS:
            return torch.full_like(a, score / a.numel())
        return score * a / total
    raise ValueError(f"form must be one of {FORMS}, got {form!r}")


def p2t_advantages(response_adv: float | Tensor, token_reward: Tensor, alpha: float = 0.1) -> Tensor:
    """A_p2t[i, t] = A[i] + alpha * R2T[i, t].

    response_adv: a float (with token_reward [T]) or a [N] tensor (with token_reward [N, T]).
    alpha is 0.1 for short chains of thought, 1.0 for long ones (the paper's settings).
    """
    adv = torch.as_tensor(response_adv, dtype=torch.float32, device=token_reward.device)
    if adv.dim() != token_reward.dim() - 1:
        raise ValueError(f"response_adv has shape {tuple(adv.shape)} but token_reward has "
                         f"{tuple(token_reward.shape)}; expected [] with [T] or [N] with [N, T]")
    return adv[..., None] + alpha * token_reward.float()


def is_near_flat(raw: Tensor, ratio: float = 1.5) -> bool:
    """True when max/min of softmax(a) < ratio, i.e. P2T's paper form is nearly a constant shift."""
    a = raw.detach().float()
    # max/min of a softmax is exp(max a - min a): no need to normalize
    return float(a.max() - a.min()) < math.log(ratio)


@dataclass
class P2TStats:
    """How often P2T's softmax(a) is near-flat over a run."""

    responses: int = 0
    near_flat: int = 0

    def add(self, raw: Tensor, ratio: float = 1.5) -> None:
        self.responses += 1
        self.near_flat += is_near_flat(raw, ratio)

    @property
    def near_flat_fraction(self) -> float:
        return self.near_flat / self.responses if self.responses else 0.0
