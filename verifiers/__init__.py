"""Verifiers: one score in [0, 1] and one feedback text per reward.

    records, rejected = load_tasks(path)          # validated TaskRecords + bad lines
    scores = verify(record, response_text)        # list[RewardScore], fixed reward order
    names = reward_names(record)                  # the same order, without a response
    spans = response_parts(record, response_text) # [(char_start, char_end, part)] for analysis
    kind, index = stored_reward(task, name)       # ("keyword_include", 2) for "c2_keyword_include"

`verify` never raises on any response string; a malformed task record raises
`schemas.records.RecordError` naming the record id and the field.
"""
from __future__ import annotations

from schemas.records import RewardScore, TaskRecord

from . import instructions, sql, tools
from .tasks import Rejected, load_tasks, parse_record

_BY_TASK = {"sql": sql, "instructions": instructions, "tools": tools}


def verify(record: TaskRecord, response: str) -> list[RewardScore]:
    return _BY_TASK[record.task].verify(record, response)


def reward_names(record: TaskRecord) -> list[str]:
    return _BY_TASK[record.task].reward_names(record)


def response_parts(record: TaskRecord, response: str) -> list[tuple[int, int, str]]:
    return _BY_TASK[record.task].response_parts(record, response)


def stored_reward(task: str, name: str) -> tuple[str, int | None]:
    """(reward, constraint_index) as the dataset stores a reward name: instruction rewards
    `c{i}_{kind}` become (kind, i); the other tasks' names stay as they are, with no index."""
    return instructions.split_reward_name(name) if task == "instructions" else (name, None)


__all__ = ["Rejected", "load_tasks", "parse_record", "verify", "reward_names", "response_parts", "stored_reward"]
