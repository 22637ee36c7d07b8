"""The settings that determine a dataset: sampling, credit, and the annotate run that holds both.

Plain dataclasses with no heavy imports, so that the command line can show their defaults in
`--help` without loading torch or transformers.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingConfig:
    n: int = 4  # responses per prompt
    max_new_tokens: int = 96
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()  # a response ends at the token that completes one of these strings
    seed: int = 0
    batch_size: int = 32  # rows (prompt x sample) per forward

    def __post_init__(self):
        object.__setattr__(self, "stop", tuple(self.stop))
        checks = {"n": self.n >= 1, "max_new_tokens": self.max_new_tokens >= 1, "temperature": self.temperature >= 0,
                  "top_p": 0 < self.top_p <= 1, "batch_size": self.batch_size >= 1,
                  "stop": all(isinstance(s, str) and s for s in self.stop)}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"SamplingConfig: invalid {', '.join(f'{b}={getattr(self, b)!r}' for b in bad)}")


CREDIT_KINDS = ("gdpo", "mrtpo", "p2t")


@dataclass(frozen=True)
class CreditConfig:
    kinds: tuple[str, ...] = ("gdpo", "mrtpo")
    beta: float = 0.5
    max_second_moment: float | None = None
    replay_batch_size: int = 16
    chunk_size: int = 128
    p2t_form: str = "paper"
    p2t_omega: float = 0.6
    p2t_alpha: float = 0.1
    p2t_baseline: str = "pad"

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(CREDIT_KINDS)
        if unknown or "gdpo" not in self.kinds:
            raise ValueError(f"credit kinds {self.kinds}: each must be one of {CREDIT_KINDS}, gdpo included")


@dataclass(frozen=True)
class AnnotateConfig:
    """Everything that determines the dataset (hashed into the run's identity)."""

    prompts: str = "demo"
    tasks: tuple[str, ...] = ("sql", "instructions", "tools")
    split: str | None = None  # None = all records
    limit: int | None = 16  # prompts per task; None = all
    backend: str = "transformers"
    model: str | None = None  # None = the shipped tiny policy
    reward_model: str | None = None  # None = the shipped tiny reward model
    device: str = "cpu"
    shard_size: int = 8  # prompts per shard
    # torch threads on CPU: float sums are split by thread, so the count changes the last bits of
    # every log-prob; fixing it makes a Dask worker (1 thread by default) write the same bytes.
    cpu_threads: int = 2
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    credit: CreditConfig = field(default_factory=CreditConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()
