"""Token-weighted SFT loss (method.md section 5).

    loss = - sum_t w_t log pi(y_t | x, y_<t) / sum_t w_t

Causal shift: the logits at position t predict the token at position t + 1, so the
loss pairs `logits[:, :-1]` with `labels[:, 1:]` and `weights[:, 1:]` (the same
convention as Hugging Face's `labels=` argument). Positions labelled -100 (prompt,
padding) never count, whatever their weight.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100


def token_weighted_sft_loss(logits: Tensor, labels: Tensor, weights: Tensor) -> Tensor:
    """Scalar loss from logits [B, L, V], labels [B, L] (-100 = ignore) and weights [B, L] float.

    With all-ones weights this is the mean token negative log-likelihood (nats / token),
    i.e. Hugging Face's causal-LM loss.
    """
    if logits.shape[:2] != labels.shape or labels.shape != weights.shape:
        raise ValueError(f"shapes differ: logits {tuple(logits.shape)}, labels {tuple(labels.shape)}, "
                         f"weights {tuple(weights.shape)}")
    logits, labels, weights = logits[:, :-1], labels[:, 1:], weights[:, 1:]
    keep = labels != IGNORE_INDEX
    nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.clamp(min=0).reshape(-1),
                          reduction="none").view_as(labels)
    w = weights.float() * keep
    total = w.sum()
    if total <= 0:
        raise ValueError("token_weighted_sft_loss: the weights of the labelled tokens sum to zero")
    return (w * nll).sum() / total


def policy_gradient_loss(logprobs: Tensor, sample_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                         clip_eps: float = 0.2) -> Tensor:
    """Clipped offline policy-gradient surrogate (method.md section 5), a scalar.

    All inputs are [B, L] and already aligned token by token (no causal shift here):
    logprobs = log pi(y_t | x, y_<t) under the policy being trained (carries the gradient),
    sample_logprobs = the same under the sampling policy (stored in the dataset), advantages = A_t,
    mask = the response tokens that count (bool or 0/1).

        rho_t = exp(logprobs_t - sample_logprobs_t)
        loss  = - sum_{t in mask} min(rho_t A_t, clip(rho_t, 1 - e, 1 + e) A_t) / |mask|

    Normalization is one mean over all valid tokens of the batch (token-mean, as in DAPO), not
    GRPO's mean over responses of per-response token means: a response weighs in proportion to
    its length. The two agree when the responses have equal lengths. With A_t = A_i on every
    token of response i this is GDPO's / GRPO's clipped surrogate.
    """
    if not (logprobs.shape == sample_logprobs.shape == advantages.shape == mask.shape):
        raise ValueError(f"shapes differ: logprobs {tuple(logprobs.shape)}, sample_logprobs "
                         f"{tuple(sample_logprobs.shape)}, advantages {tuple(advantages.shape)}, "
                         f"mask {tuple(mask.shape)}")
    mask = mask.bool()
    n_tokens = mask.sum()
    if n_tokens == 0:
        raise ValueError("policy_gradient_loss: the mask selects no tokens")
    # Padding may hold anything; the clamp (as in verl) keeps exp() finite for very stale samples.
    log_ratio = torch.where(mask, logprobs.float() - sample_logprobs.float(), 0.0).clamp(-20.0, 20.0)
    rho = log_ratio.exp()
    adv = advantages.float()
    surrogate = torch.minimum(rho * adv, rho.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv)
    return -torch.where(mask, surrogate, 0.0).sum() / n_tokens


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Token-mean KL(pi || pi_ref) estimate over the masked tokens, a scalar >= 0.

    All inputs [B, L], aligned token by token. Per token the "k3" estimator
    exp(r) - r - 1 with r = ref_logprobs - logprobs (unbiased, always >= 0; the one TRL's GRPO
    and verl's `low_var_kl` use), averaged over the mask like `policy_gradient_loss`.
    """
    if not (logprobs.shape == ref_logprobs.shape == mask.shape):
        raise ValueError(f"shapes differ: logprobs {tuple(logprobs.shape)}, ref_logprobs "
                         f"{tuple(ref_logprobs.shape)}, mask {tuple(mask.shape)}")
    mask = mask.bool()
    if mask.sum() == 0:
        raise ValueError("kl_penalty: the mask selects no tokens")
    r = torch.where(mask, ref_logprobs.float() - logprobs.float(), 0.0).clamp(-20.0, 20.0)
    return torch.where(mask, r.exp() - r - 1.0, 0.0).sum() / mask.sum()
