"""Prompt text for sampling and for MRTPO's leave-one-out replay (method.md section 2).

The task prompt is a shared prefix of the sampling prompt, `P_all` and every `P_\\k`:
the feedback block sits after the task prompt and before the response marker.

    <task prompt>
    ### Feedback
    [format] The query must sit between <sql> and </sql>.
    [execution] The reference query is: SELECT ...
    ### Response
    <response tokens, teacher-forced>

The shipped tiny policy is trained on exactly this layout, so changing it means a new
`TEMPLATE_VERSION` and retrained models.
"""
from __future__ import annotations

from collections.abc import Sequence

TEMPLATE_VERSION = "replay-v1"
FEEDBACK_HEADER = "### Feedback\n"
RESPONSE_MARKER = "### Response\n"


def sampling_prompt(task_prompt: str) -> str:
    """The text the policy continues when it samples a response."""
    return f"{task_prompt.rstrip()}\n{RESPONSE_MARKER}"


def feedback_section(reward_name: str, feedback: str) -> str:
    return f"[{reward_name}] {' '.join(feedback.split())}\n"


def replay_prompt(task_prompt: str, sections: Sequence[tuple[str, str]], drop: int | None = None) -> str:
    """`P_all` (drop=None) or `P_\\k` (drop=k): task prompt, feedback block, response marker.

    sections: (reward_name, feedback) in the verifier's fixed reward order.
    """
    kept = [feedback_section(name, text) for k, (name, text) in enumerate(sections) if k != drop]
    block = FEEDBACK_HEADER + "".join(kept) if kept else ""
    return f"{task_prompt.rstrip()}\n{block}{RESPONSE_MARKER}"
