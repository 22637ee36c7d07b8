"""A TRL reward function as a tokencredit verifier plugin.

TRL's reward functions score a batch: `f(completions, **kwargs) -> list[float]`, with the prompts
in `prompts` and every other dataset column as a list. tokencredit's verifiers also say what they
expected (the feedback that MRTPO's replay needs), so the adapter asks for that text:

    # my_rewards.py
    from tokencredit.verifiers.trl_rewards import trl_verifier

    def brevity_reward(completions, **kwargs):                  # the TRL function you already have
        return [float(len(c) <= 200) for c in completions]

    brevity = trl_verifier(brevity_reward, feedback="Answer in at most 200 characters.")
    topic = trl_verifier(topic_reward, feedback=lambda record: f"Mention the {record['topic']}.")

    tokencredit annotate --prompts poems.jsonl --verifier poem=my_rewards:brevity
    MRTPOTrainer(..., records=records, verifiers=["poem=my_rewards:brevity"])

A TRL function may score outside [0, 1]: `bounds=(low, high)` maps `low` to 0 and `high` to 1
linearly, clipped (`(80, 0)` for "shorter is better" on a length). The source hash in the run's
identity is that of the file defining the TRL function (`__wrapped__`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from tokencredit.verifiers.plugins import PluginError

Feedback = str | Callable[[dict], str]


class TrlRewardVerifier:
    """A verifier plugin (`tokencredit.verifiers.plugins`) that scores one response with a TRL reward function."""

    def __init__(self, fn: Callable[..., Sequence[float | None]], feedback: Feedback, name: str | None = None,
                 bounds: tuple[float, float] = (0.0, 1.0)):
        if not callable(fn):
            raise PluginError(f"trl_verifier: {fn!r} is not a callable reward function")
        if not callable(feedback) and not (isinstance(feedback, str) and feedback.strip()):
            raise PluginError(f"trl_verifier({_name(fn)}): feedback must be a non-empty string or a "
                              "callable record -> string saying what the reward expects")
        low, high = bounds
        if high == low:
            raise PluginError(f"trl_verifier({_name(fn)}): bounds {bounds} must differ")
        self.__wrapped__, self.feedback, self.bounds = fn, feedback, (float(low), float(high))
        self.name = name or _name(fn)

    def __call__(self, record: dict, response: str) -> list[tuple[str, float, str]]:
        columns = {key: [value] for key, value in record.items() if key != "prompt"}
        values = self.__wrapped__(completions=[response], prompts=[record.get("prompt", "")], **columns)
        if (not isinstance(values, Sequence) or len(values) != 1 or not isinstance(values[0], (int, float))
                or not math.isfinite(values[0])):
            raise PluginError(f"TRL reward function {self.name}: returned {values!r} for one completion; "
                              "expected a list of one number")
        low, high = self.bounds
        score = min(1.0, max(0.0, (float(values[0]) - low) / (high - low)))
        feedback = self.feedback(record) if callable(self.feedback) else self.feedback
        return [(self.name, score, feedback)]


def trl_verifier(fn: Callable[..., Sequence[float | None]], feedback: Feedback, *, name: str | None = None,
                 bounds: tuple[float, float] = (0.0, 1.0)) -> TrlRewardVerifier:
    """The verifier plugin for TRL reward function `fn`: its reward is named `name` (default the
    function's name), its feedback is `feedback` (or `feedback(record)`), its score `fn`'s mapped
    from `bounds` onto [0, 1]."""
    return TrlRewardVerifier(fn, feedback, name, bounds)


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)
