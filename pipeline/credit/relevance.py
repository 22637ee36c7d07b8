"""Which tokens each reward's feedback is about: per-token relevance from a replay (method.md section 2).

With `p_t = pi(. | P_all, y_<t)` and `q_t = pi(. | P_\\k, y_<t)` (feedback section k removed or nulled):

    js              JS(p_t, q_t)                               the paper's score; unsigned, full vocabulary
    logprob_drop    max(0, log q_t(y_t) - log p_t(y_t))        the feedback made the emitted token less likely
    logprob_abs     |log p_t(y_t) - log q_t(y_t)|              it moved the emitted token either way
    logprob_signed  max(0, s_k (log p_t(y_t) - log q_t(y_t)))  it moved the emitted token the way the
                                                               reward's advantage points: s_k = +1 (credit)
                                                               where the feedback made it more likely,
                                                               s_k = -1 (penalty) where less likely; a
                                                               section that points at the response (it
                                                               quotes what the verifier found, see
                                                               `prompts.feedback_sections`) makes the
                                                               tokens it quotes more likely: s_k = +1

A pair whose mean relevance over the response is below `floor` carries no signal worth amplifying: its
relevance is zeroed, so `mrtpo.replay_weights` gives it uniform weights, and it is reported as floored.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from tokencredit.pipeline.config import DEFAULT_FLOORS, RELEVANCES  # noqa: F401 - the option names and floors, defined without torch
from tokencredit.pipeline.credit.replay import ReplayOutput


def signs(reward_adv: torch.Tensor, points: Sequence[bool]) -> torch.Tensor:
    """s_k of `logprob_signed`: +1 for a section that points at the response, else the sign of A[k]."""
    return torch.where(torch.tensor(list(points), dtype=torch.bool), 1.0, torch.sign(reward_adv.float()))


def relevance(kind: str, replayed: ReplayOutput, sign: torch.Tensor | None = None) -> torch.Tensor:
    """[K, T] float32 relevance of one replayed response (NaN rows where a reward was not replayed).

    sign: [K] +1 / -1 per reward, needed by `logprob_signed` (the sign of the reward's advantage).
    """
    if kind == "js":
        if replayed.js is None:
            raise ValueError("relevance 'js' needs a replay run with js=True")
        return replayed.js
    gain = replayed.logprob_all[None, :] - replayed.logprob_drop  # log p - log q: what the feedback added
    if kind == "logprob_drop":
        return (-gain).clamp(min=0.0)
    if kind == "logprob_abs":
        return gain.abs()
    if kind == "logprob_signed":
        if sign is None or sign.shape != gain.shape[:1]:
            raise ValueError(f"relevance 'logprob_signed' needs one sign per reward ({gain.shape[0]}), got "
                             f"{None if sign is None else tuple(sign.shape)}")
        return (sign.to(gain.dtype)[:, None] * gain).clamp(min=0.0)
    raise ValueError(f"unknown relevance {kind!r}; choose from {', '.join(RELEVANCES)}")


def apply_floor(values: torch.Tensor, floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero the rows of values [K, T] whose mean is below `floor` -> (values, floored [K] bool).

    NaN rows (not replayed) stay NaN and are not floored.
    """
    if floor < 0:
        raise ValueError(f"relevance floor must be >= 0, got {floor}")
    mean = values.mean(-1) if values.shape[-1] else torch.zeros(values.shape[0])
    floored = mean < floor  # False for NaN rows
    return torch.where(floored[:, None], 0.0, values), floored
