"""Jensen-Shannon divergence between next-token distributions given as logits (method.md section 2).

JS(p, q) = KL(p || m) / 2 + KL(q || m) / 2 with m = (p + q) / 2, in nats, in [0, ln 2].
Both distributions are log-softmaxed in float32. With d = log q - log p per vocabulary entry,

    log p - log m = -log1p(expm1(d) / 2)        log q - log m = -log1p(expm1(-d) / 2)

which is exact at d = 0 (identical inputs give exactly 0) and accurate for nearly equal
distributions, where the textbook form subtracts nearly equal logarithms.
"""
from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)
# expm1 overflows float32 past ~88; beyond 80 the entry's own probability is below e^-80,
# so capping d there changes the sum by less than 1e-33.
_D_MAX = 80.0


def _js_rows(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """JS per row of two [R, V] logit tensors -> [R] float32."""
    lp = torch.log_softmax(logits_p.float(), dim=-1)
    lq = torch.log_softmax(logits_q.float(), dim=-1)
    # equal entries (both -inf included) must give d = 0, not inf - inf = nan
    d = torch.where(lp == lq, 0.0, lq - lp)
    kl_p = lp.exp() * -torch.log1p(0.5 * torch.expm1(d.clamp(max=_D_MAX)))
    kl_q = lq.exp() * -torch.log1p(0.5 * torch.expm1((-d).clamp(max=_D_MAX)))
    # 0 * log 0 = 0: a zero probability contributes nothing, whatever its log-ratio
    kl_p = torch.where(lp == -math.inf, 0.0, kl_p)
    kl_q = torch.where(lq == -math.inf, 0.0, kl_q)
    return (0.5 * (kl_p.sum(-1) + kl_q.sum(-1))).clamp(0.0, LN2)


def js_divergence(logits_p: torch.Tensor, logits_q: torch.Tensor, chunk_size: int = 128) -> torch.Tensor:
    """JS(softmax(logits_p), softmax(logits_q)) per position, in nats.

    logits_p, logits_q: [..., T, V], any float dtype (bf16, fp16, fp32), same shape and device.
    Returns [..., T] float32. Positions are processed `chunk_size` at a time, so the float32
    working set is O(chunk_size * V) whatever the batch and length.
    """
    if logits_p.shape != logits_q.shape:
        raise ValueError(f"js_divergence: logits_p {tuple(logits_p.shape)} and logits_q "
                         f"{tuple(logits_q.shape)} differ in shape")
    if logits_p.dim() < 1 or chunk_size < 1:
        raise ValueError(f"js_divergence: need [..., V] logits and chunk_size >= 1, got "
                         f"{tuple(logits_p.shape)} and chunk_size={chunk_size}")
    V = logits_p.shape[-1]
    flat_p, flat_q = logits_p.reshape(-1, V), logits_q.reshape(-1, V)
    out = torch.empty(flat_p.shape[0], dtype=torch.float32, device=logits_p.device)
    for start in range(0, flat_p.shape[0], chunk_size):
        stop = start + chunk_size
        out[start:stop] = _js_rows(flat_p[start:stop], flat_q[start:stop])
    return out.reshape(logits_p.shape[:-1])


def js_divergence_naive(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Reference: the textbook formula on the full [..., T, V] tensor in float32 -> [..., T]."""
    p = torch.softmax(logits_p.float(), dim=-1)
    q = torch.softmax(logits_q.float(), dim=-1)
    m = 0.5 * (p + q)
    kl_pm = (torch.special.xlogy(p, p) - torch.special.xlogy(p, m)).sum(-1)
    kl_qm = (torch.special.xlogy(q, q) - torch.special.xlogy(q, m)).sum(-1)
    return (0.5 * (kl_pm + kl_qm)).clamp(0.0, LN2)
