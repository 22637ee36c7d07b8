"""The annotate stage: prompt set -> shards -> sample -> verify -> credit -> Parquet.

`annotate_shard` is the unit of work; `run_annotation` runs the shards in order in this process
(the Prefect flow in `flows/annotate.py` runs the same shards as tasks, locally or on Dask).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from tqdm.auto import tqdm

import verifiers
from schemas.records import TaskRecord, VerifiedSample

from .credit import CreditConfig, assign_credit
from .sampling import SamplingConfig, make_sampler
from .tables import credits_table, responses_table
from .writer import RunWriter


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


def code_version() -> str:
    """Hash of the package sources: identifies the code without needing a git checkout."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for package in ("pipeline", "verifiers", "schemas", "flows"):
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def load_prompt_set(config: AnnotateConfig) -> tuple[list[TaskRecord], list[verifiers.Rejected]]:
    records, rejected = verifiers.load_tasks(config.prompts)
    chosen, per_task = [], {}
    for record in records:
        if record.task not in config.tasks or (config.split and record.split != config.split):
            continue
        per_task[record.task] = per_task.get(record.task, 0) + 1
        if config.limit is None or per_task[record.task] <= config.limit:
            chosen.append(record)
    return chosen, rejected


def shards_of(records: Sequence[TaskRecord], shard_size: int) -> list[list[TaskRecord]]:
    return [list(records[i: i + shard_size]) for i in range(0, len(records), shard_size)]


@dataclass
class Models:
    sampler: Any
    policy: Any
    tokenizer: Any
    reward_model: Any = None


_LOAD_LOCK = threading.Lock()


def load_models(config: AnnotateConfig) -> Models:
    # One loader at a time: transformers builds models under a process-wide meta-device context,
    # so two threads loading at once get each other's empty (meta) weights.
    with _LOAD_LOCK:
        return _load_models(config.backend, config.model, config.reward_model if "p2t" in config.credit.kinds else None,
                            config.device, "p2t" in config.credit.kinds)


@functools.lru_cache(maxsize=2)
def _load_models(backend: str, model: str | None, reward_model: str | None, device: str, p2t: bool) -> Models:
    """Load once per process (a Dask worker loads its own copy); sampling and replay share the policy."""
    from .models import load_policy, load_reward_model

    policy, tokenizer = load_policy(model, device=device)
    sampler = make_sampler(backend, model, device=device, policy=(policy, tokenizer))  # one copy of the weights
    rm = None
    if p2t:
        rm, rm_tokenizer = load_reward_model(reward_model, device=device)
        if rm_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError("P2T needs a reward model that shares the policy's tokenizer "
                             f"(policy {model or 'default'}, reward model {reward_model or 'default'})")
    return Models(sampler, policy, tokenizer, rm)


def verify_samples(samples, records: dict[str, TaskRecord]) -> list[VerifiedSample]:
    """The verify stage; a verifier that crashes marks its response failed, never drops it."""
    verified = []
    for sample in samples:
        try:
            verified.append(VerifiedSample(sample, verifiers.verify(records[sample.group_id], sample.response)))
        except Exception as error:  # noqa: BLE001 - a verifier bug must not lose the batch
            verified.append(VerifiedSample(sample, [], status=f"verifier_error: {type(error).__name__}: {error}"))
    return verified


def annotate_shard(records: Sequence[TaskRecord], shard: int, config: AnnotateConfig,
                   models: Models) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """sample -> verify -> credit for one shard; returns its tables and stats."""
    if config.device == "cpu":
        torch.set_num_threads(config.cpu_threads)
    by_id = {r.id: r for r in records}
    samples = models.sampler.sample(records, config.sampling)
    verified = verify_samples(samples, by_id)
    annotated, stats = assign_credit(verified, by_id, config.credit, models.policy, models.tokenizer,
                                     models.reward_model)
    tables = {"responses": responses_table(annotated, shard),
              "credits": credits_table(annotated, by_id, models.tokenizer)}
    return tables, stats


def write_rejected(out: str, rejected: Sequence[verifiers.Rejected]) -> None:
    path = Path(out) / "rejected.jsonl"
    if "://" in out:
        return
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in rejected))
    tmp.replace(path)


def prepare_run(config: AnnotateConfig, out: str, run_id: str | None = None):
    """Load and split the prompt set, record the run in the manifest, write rejected records.

    Returns (writer, shards, rejected).
    """
    records, rejected = load_prompt_set(config)
    writer = RunWriter(out)
    writer.start(run_id or config.digest()[:12], config.to_dict(), config.digest(), code_version())
    write_rejected(out, rejected)
    return writer, shards_of(records, config.shard_size), rejected


def run_annotation(config: AnnotateConfig, out: str, run_id: str | None = None,
                   progress: bool = True) -> dict[str, Any]:
    """Annotate every shard not yet written under `out`, in this process; returns the manifest."""
    writer, shards, rejected = prepare_run(config, out, run_id)
    todo = [s for s in range(len(shards)) if not writer.is_complete(s)]
    models = load_models(config) if todo else None
    for s in tqdm(todo, desc="shards", unit="shard", disable=not progress):
        tables, stats = annotate_shard(shards[s], s, config, models)
        writer.write_shard(s, tables, stats)
    return writer.finish(len(shards), {"rejected": len(rejected)})
