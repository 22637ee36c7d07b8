"""What every sampling backend shares: a row's seed, its rendered prompt, the checks on its records, the
`Sample` it becomes, and (`Row`) its state while it is decoded. Response j of a record is one row."""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokencredit.schemas.records import RecordError, Sample, TaskRecord

from tokencredit.pipeline.sample.detokenize import StopChecker
from tokencredit.pipeline.sample.prompts import chat_prompt, encode_prompt, sampling_prompt


def row_seed(seed: int, record_id: str, j: int | str) -> int:
    """Seed of response j of a record: stable across processes (unlike Python's salted `hash`)."""
    digest = hashlib.sha256(f"{seed}\x00{record_id}\x00{j}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # < 2**63: fits every generator's seed


def node_seed(seed: int, record_id: str, node: str) -> int:
    """Seed of the draws of one node of a tree-sampled group ("t2" for root 2, "t2.1" for its continuation 1):
    the same hash as `row_seed`, keyed by the node's path (never a flat j, which has no "t")."""
    return row_seed(seed, record_id, node)


def render_prompt(tokenizer, task_prompt: str) -> tuple[str, list[int]]:
    """(prompt text, the exact token ids fed to the model): the chat template when the tokenizer has
    one, else the replay-compatible `sampling_prompt` layout; special tokens typed in the task prompt are
    text (`encode_prompt`)."""
    chat = bool(getattr(tokenizer, "chat_template", None))
    text = chat_prompt(tokenizer, task_prompt) if chat else sampling_prompt(task_prompt)
    return text, encode_prompt(tokenizer, text, task_prompt, chat)[0]


def check_records(records: Sequence[TaskRecord]) -> None:
    seen = set()
    for record in records:
        if not isinstance(record.prompt, str) or not record.prompt.strip():
            raise RecordError(record.id, "prompt", "must be a non-empty string to sample from")
        if record.id in seen:
            raise RecordError(record.id, "id", "appears twice in one sampling call; response ids would collide")
        seen.add(record.id)


def build_sample(record: TaskRecord, j: int, prompt: tuple[str, list[int]], token_ids: list[int],
                 logprobs: list[float], tokenizer, name: str, seed: int, segments=None) -> Sample:
    return Sample(response_id=f"{record.id}/{j}", group_id=record.id, task=record.task, prompt=prompt[0],
                  prompt_token_ids=list(prompt[1]), response=tokenizer.decode(token_ids, skip_special_tokens=True),
                  token_ids=token_ids, sample_logprobs=logprobs, model=name, seed=seed, segments=segments)


@dataclass
class Row:
    """One response being decoded: its own generator (its draws), stop checker, and the tokens so far.
    The row ends at eos, at a stop string, or once it holds `limit` tokens."""

    generator: torch.Generator  # noqa: F821 - annotation only: rows.py loads no torch
    stop: StopChecker
    limit: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
