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
    MRTPOTrainer(..., records=records, verifiers=[("poem", brevity)])    # or "poem=my_rewards:brevity"

TRL passes a standard dataset's completions as strings and a conversational one's as messages
(`[{"role": "assistant", "content": text}]`, the prompts as message lists); `conversational=` says
which the function expects, and by default the first call finds out: a function that fails on a
string with what indexing a string as a message raises (TypeError, IndexError) is called again
with messages, and the form that worked is kept.

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


def _one_number(values: Any) -> float | None:
    """The finite number of a reward function's list for one completion, else None. float() comes before the
    check: a float subclass's `__float__` may say NaN for a value that compares as 0.5 (max(0.0, NaN) is 0.0)."""
    if not isinstance(values, Sequence) or len(values) != 1 or not isinstance(values[0], (int, float)):
        return None
    try:
        value = float(values[0])
    except Exception:  # the subclass's own code, or an int past float's range
        return None
    return value if math.isfinite(value) else None


class TrlRewardVerifier:
    """A verifier plugin (`tokencredit.verifiers.plugins`) that scores one response with a TRL reward function."""

    def __init__(self, fn: Callable[..., Sequence[float | None]], feedback: Feedback, name: str | None = None,
                 bounds: tuple[float, float] = (0.0, 1.0), conversational: bool | None = None):
        if not callable(fn):
            raise PluginError(f"trl_verifier: {fn!r} is not a callable reward function")
        if not callable(feedback) and not (isinstance(feedback, str) and feedback.strip()):
            raise PluginError(f"trl_verifier({_name(fn)}): feedback must be a non-empty string or a "
                              "callable record -> string saying what the reward expects")
        low, high = _one_number([bounds[0]]), _one_number([bounds[1]])
        if low is None or high is None or high == low or not math.isfinite(high - low):  # NaN or inf: every score 0
            raise PluginError(f"trl_verifier({_name(fn)}): bounds {bounds} must be two different finite numbers")
        if conversational not in (None, True, False):
            raise PluginError(f"trl_verifier({_name(fn)}): conversational must be True, False or None (find out), "
                              f"got {conversational!r}")
        self.__wrapped__, self.feedback, self.bounds = fn, feedback, (low, high)
        self.name, self.conversational = name or _name(fn), conversational

    def __call__(self, record: dict, response: str) -> list[tuple[str, float, str]]:
        values = self._values(record, response)
        value = _one_number(values)
        if value is None:
            raise PluginError(f"TRL reward function {self.name}: returned {values!r} for one completion; "
                              "expected a list of one number")
        low, high = self.bounds
        score = min(1.0, max(0.0, (value - low) / (high - low)))
        feedback = self.feedback(record) if callable(self.feedback) else self.feedback
        return [(self.name, score, feedback)]

    def _values(self, record: dict, response: str) -> Any:
        if self.conversational is not None:
            return self._call(record, response, self.conversational)
        try:
            values = self._call(record, response, conversational=False)
        except (TypeError, IndexError) as error:  # what `completions[0][0]["content"]` raises on a string
            try:
                values = self._call(record, response, conversational=True)
            except Exception:
                raise error from None  # not a conversational function either: its own error on a string
            self.conversational = True
            return values
        self.conversational = False
        return values

    def _call(self, record: dict, response: str, conversational: bool) -> Any:
        """`fn` on one completion, its record's fields as TRL passes a dataset's columns."""
        columns = {key: [value] for key, value in record.items() if key != "prompt"}
        prompt, completion = record.get("prompt", ""), response
        if conversational:
            prompt = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            completion = [{"role": "assistant", "content": response}]
        return self.__wrapped__(completions=[completion], prompts=[prompt], **columns)


def trl_verifier(fn: Callable[..., Sequence[float | None]], feedback: Feedback, *, name: str | None = None,
                 bounds: tuple[float, float] = (0.0, 1.0), conversational: bool | None = None) -> TrlRewardVerifier:
    """The verifier plugin for TRL reward function `fn`: its reward is named `name` (default the
    function's name), its feedback is `feedback` (or `feedback(record)`), its score `fn`'s mapped
    from `bounds` onto [0, 1]. `conversational`: whether `fn` takes TRL's conversational completions
    (message lists) or strings; None finds out on the first call (module docstring)."""
    return TrlRewardVerifier(fn, feedback, name, bounds, conversational)


def assistant_text(completion: Any) -> str:
    """A completion's text as TRL passes completions: a string, or the assistant messages of a
    conversational one (`[{"role": "assistant", "content": text}]`, more messages after tool calls)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                            for m in completion):
        return "".join(m["content"] for m in completion if m.get("role") == "assistant")
    raise TypeError(f"a completion {str(completion)[:60]!r}: expected a string or a list of chat messages "
                    "with string contents, as TRL passes completions")


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)
