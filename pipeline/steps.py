"""The annotate stage from Python: `Pipeline(config)` with its steps sample -> verify -> credit -> write.

Each step calls the function that `run_annotation` (the CLI's `tokencredit annotate`) calls for it,
shard by shard (`config.shard_size` prompts, as the CLI splits them), so the steps one after the
other write the same rows as `Pipeline.run` and the CLI. Each step takes and returns plain records
(`tokencredit.schemas.records`), so one can be inspected, or replaced by a function of your own that returns
the same type:

    pipe = Pipeline(AnnotateConfig(prompts="demo", limit=1))
    records, rejected = pipe.load()                # list[TaskRecord], list[verifiers.Rejected]
    samples = pipe.sample(records)                 # list[Sample]: n per record
    verified = pipe.verify(records, samples)       # list[VerifiedSample]: RewardScores per sample
    credited = pipe.credit(records, verified)      # Credited: AnnotatedResponses, stats per shard
    run = pipe.write("runs/py", records, credited, rejected)  # Run: path, manifest
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokencredit import verifiers
from tokencredit.schemas.records import AnnotatedResponse, Sample, TaskRecord, VerifiedSample

from tokencredit.pipeline.annotate import (Models, code_version, finish_run, load_models, load_prompt_set, open_run, run_annotation,
                       replay_engine, shard_tables, shards_of, use_cpu_threads, verify_samples)
from tokencredit.pipeline.config import AnnotateConfig
from tokencredit.pipeline.credit.assign import assign_credit


@dataclass
class Credited:
    """The credit step's output: every response with its credit (input order), and the credit
    stage's counts of each shard (responses, replays done and skipped, ...; the manifest sums them)."""

    responses: list[AnnotatedResponse]
    shard_stats: list[dict[str, Any]]


@dataclass
class Run:
    """A written run: its directory (`tokencredit query/report/train PATH`) and its manifest."""

    path: Path
    manifest: dict[str, Any]


class Pipeline:
    """sample -> verify -> credit -> write on the settings of one `AnnotateConfig` (or its keyword
    arguments: `Pipeline(prompts="demo", limit=1)`). The models load on the first step that needs them."""

    def __init__(self, config: AnnotateConfig | None = None, **options: Any):
        if config is not None and options:
            raise TypeError("Pipeline: give an AnnotateConfig or its keyword arguments, not both")
        self.config = config or AnnotateConfig(**options)

    @functools.cached_property
    def models(self) -> Models:
        use_cpu_threads(self.config)
        return load_models(self.config)

    def load(self) -> tuple[list[TaskRecord], list[verifiers.Rejected]]:
        """The prompt records of `config.prompts` (tasks, split and limit applied) and those rejected."""
        return load_prompt_set(self.config)

    def sample(self, records: Sequence[TaskRecord]) -> list[Sample]:
        """`config.sampling.n` responses per record (record order, then sample index)."""
        sampler = self.models.sampler
        return [s for shard in self._shards(records) for s in sampler.sample(shard, self.config.sampling)]

    def verify(self, records: Sequence[TaskRecord], samples: Sequence[Sample]) -> list[VerifiedSample]:
        """Each sample's rewards from the built-in and `config.verifiers` verifiers; a verifier that fails
        on a sample marks it `verifier_error: ...` (it keeps its row, without credit)."""
        return verify_samples(samples, _by_id(records), self.config.verifiers, self.config.verifier_timeout_s,
                              self.config.verifier_memory_bytes)

    def credit(self, records: Sequence[TaskRecord], verified: Sequence[VerifiedSample]) -> Credited:
        """GDPO, MRTPO and P2T credit (`config.credit`), per shard of prompts as the CLI computes it."""
        by_id, m = _by_id(records), self.models
        responses, shard_stats = [], []
        for shard in self._shards(records):
            ids = {r.id for r in shard}
            annotated, stats = assign_credit([v for v in verified if v.sample.group_id in ids], by_id,
                                             self.config.credit, m.policy, m.tokenizer, m.reward_model,
                                             reward_tokenizer=m.reward_tokenizer, replay_engine=replay_engine(m))
            responses += annotated
            shard_stats.append(stats)
        return Credited(responses, shard_stats)

    def write(self, out: str | Path, records: Sequence[TaskRecord], credited: Credited,
              rejected: Sequence[verifiers.Rejected] = ()) -> Run:
        """Write the credited responses as the run directory `out` (Parquet shards, manifest recording
        `config`). A step you replaced is not in that config: the manifest says what the config did."""
        shards = self._shards(records)
        if len(shards) != len(credited.shard_stats):
            raise ValueError(f"{len(credited.shard_stats)} shards were credited, the records make {len(shards)}")
        by_id = _by_id(records)
        writer = open_run(self.config, str(out), records, len(shards), rejected)
        try:
            for s, (shard, stats) in enumerate(zip(shards, credited.shard_stats)):
                ids = {r.id for r in shard}
                annotated = [a for a in credited.responses if a.verified.sample.group_id in ids]
                writer.write_shard(s, shard_tables(annotated, by_id, s, self.models.tokenizer), stats,
                                   code_version=code_version())
            return Run(Path(out), finish_run(writer, len(shards), rejected))
        finally:
            writer.unlock()

    def run(self, out: str | Path, progress: bool = True) -> Run:
        """Every step on `config.prompts`, written to `out`: `tokencredit annotate --runner none`
        (shards already written there are kept)."""
        return Run(Path(out), run_annotation(self.config, str(out), progress=progress))

    def _shards(self, records: Sequence[TaskRecord]) -> list[list[TaskRecord]]:
        return shards_of(records, self.config.shard_size)


def _by_id(records: Sequence[TaskRecord]) -> dict[str, TaskRecord]:
    return {r.id: r for r in records}
