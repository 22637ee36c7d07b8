"""Prefix repair (method.md section 2, after TTEL): credit checked on the model's own samples, and minimal-edit
preference pairs out of it.

For each failure of a run (a response and one reward it failed): cut the response just before the token with the largest penalty
on that reward (the most negative token advantage A[i,k,t] of the run's credit; ties go to the earliest token,
so a uniform credit resamples the whole response), keep y_<t*, resample the rest `n` times from the same policy
under the sampling prompt, verify, and keep the repairs: resamples that fix that reward (score 1) without
lowering another. A repair and its original are a preference pair (chosen, rejected).

    OUT/pairs/part-00003.parquet   the repairs of shard 3 (PAIRS): TRL's prompt, chosen, rejected and more;
                                   none for a shard without repairs
    OUT/_shards/shard-00003.json   its marker, written last: a shard counts as done only with its marker
    OUT/repair.json                the config and, per reward, the failures, how many were repaired and the
                                   repair rate, once every shard is written
    OUT/config.json                the run (path and identity) and config of OUT; another, or the same folder's
                                   run written again (annotate --restart), is refused

`cut="decisive"` (`repair --cut decisive --values DIR`) cuts instead at the start of the decisive segment of the
failure's value curve (`tokencredit values`: where V_k falls most), for the failures measured there.

Shards are the unit of writing and resuming, not of sampling: with the vllm engine a window of consecutive shards
(`RepairJob.windows`: as many as fill the engine's batch, fixed by the config and device) is resampled in one
engine call, then each shard is verified and written; with transformers a window is one shard, resampled in
batches of `batch_size` rows.

A resume skips the shards whose marker exists and whose part file matches the marker's checksum, so a killed
run ends with the same preference pairs as an uninterrupted one: the resamples of a failure depend only on
(seed, response, reward, j), as sampling's do (`sampling.row_seed`), and a window partly written is resampled
whole, its requests batched together as they were.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tokencredit.schemas.records import Sample, TaskRecord

from tokencredit.pipeline.config import AnnotateConfig, SamplingConfig
from tokencredit.pipeline.credit.penalty import penalty_cut
from tokencredit.pipeline.dataset.derived import (DerivedJob, DerivedKind, DerivedStore, check_derived_from,
                                                  run_derived, run_sampling)
from tokencredit.pipeline.dataset.writer import _read_json, _sha256, _write_atomic

PAIRS = pa.schema([
    pa.field("pair_id", pa.string(), nullable=False),  # RESPONSE_ID#K/J: reward k's j-th resample
    pa.field("response_id", pa.string(), nullable=False),  # the original (rejected) response
    pa.field("group_id", pa.string()),
    pa.field("task", pa.string()),
    pa.field("reward", pa.string()),  # the reward fixed, as the credits table names it
    pa.field("constraint_index", pa.int32()),  # which constraint of an instruction record; NULL elsewhere
    pa.field("cut_position", pa.int32()),  # t*: tokens kept from the original
    pa.field("cut_char", pa.int32()),  # characters of the original's text before t*
    pa.field("relevance_source", pa.string()),  # where the credit that chose t* came from (credits)
    pa.field("prompt", pa.string()),  # the sampling prompt as rendered (chat template included)
    pa.field("chosen", pa.string()),  # the repair
    pa.field("rejected", pa.string()),  # the original
    pa.field("prompt_token_ids", pa.list_(pa.int32())),
    pa.field("chosen_token_ids", pa.list_(pa.int32())),
    pa.field("rejected_token_ids", pa.list_(pa.int32())),
    pa.field("reward_names", pa.list_(pa.string())),
    pa.field("chosen_rewards", pa.list_(pa.float32())),
    pa.field("rejected_rewards", pa.list_(pa.float32())),
])
PART = "pairs/part-{:05d}.parquet"
CUTS = ("penalty", "decisive")
MARKER = "_shards/shard-{:05d}.json"


@dataclass(frozen=True)
class RepairConfig:
    n: int = 4  # resamples per failed (response, reward)
    seed: int = 0
    shard_size: int = 16  # failures per shard (the unit of resumption)
    batch_size: int = 32  # resampled rows per forward (transformers; the engine takes a window of shards at once)
    limit: int | None = None  # failures to repair, in response order (None: all)
    cut: str = "penalty"  # CUTS: before the credit's top penalty, or at the start of the decisive segment
    values: str | None = None  # the run's values folder (`tokencredit values`), for cut="decisive"

    def __post_init__(self) -> None:
        bad = [name for name, ok in (("n", self.n >= 1), ("shard_size", self.shard_size >= 1),
                                     ("batch_size", self.batch_size >= 1),
                                     ("limit", self.limit is None or self.limit >= 1),
                                     ("cut", self.cut in CUTS)) if not ok]
        if bad:
            raise ValueError(f"RepairConfig: invalid {', '.join(f'{b}={getattr(self, b)!r}' for b in bad)}")
        if self.cut == "decisive" and self.values is None:
            raise ValueError("repair --cut decisive needs --values DIR: the run's value curves "
                             "(tokencredit values RUN --out DIR)")


@dataclass(frozen=True)
class Target:
    """One failure (a response and one reward it failed) and where to cut it."""

    response_id: str
    group_id: str
    task: str
    prompt: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    response: str
    k: int  # the reward's position in the response's rewards
    reward_names: tuple[str, ...]
    rewards: tuple[float, ...]
    cut: int  # t*
    source: str | None

    @property
    def key(self) -> str:
        return f"{self.response_id}#{self.k}"


FAILED_SQL = """
SELECT r.response_id, r.group_id, r.task, r.prompt, r.prompt_token_ids, r.token_ids, r.response, r.reward_names,
       r.rewards, c.reward, c.constraint_index, c.adv, c.source
FROM responses r JOIN (
    SELECT response_id, reward, constraint_index, list(advantage ORDER BY position) AS adv,
           any_value(relevance_source) AS source
    FROM credits GROUP BY ALL
) c USING (response_id)
WHERE r.status = 'ok' AND list_min(r.rewards) < 1
ORDER BY r.response_id, coalesce(c.constraint_index, list_position(r.reward_names, c.reward))
"""


def failed_targets(run: str, limit: int | None = None) -> list[Target]:
    """The failures of a complete run with their cut, in response then reward order."""
    from tokencredit.pipeline.dataset.query import connect

    targets = []
    for row in connect(run).execute(FAILED_SQL).fetchall():
        (rid, gid, task, prompt, prompt_ids, ids, text, names, rewards, reward, index, adv, source) = row
        k = index if index is not None else names.index(reward)
        if rewards[k] >= 1 or not ids:
            continue
        targets.append(Target(rid, gid, task, prompt, tuple(prompt_ids), tuple(ids), text, k, tuple(names),
                              tuple(rewards), penalty_cut(adv), source))
    return targets[:limit] if limit is not None else targets


def decisive_targets(targets: Sequence[Target], values: str) -> list[Target]:
    """The targets measured in the values folder, cut at the start of their decisive segment (source 'decisive');
    a target without a decisive segment there is left out."""
    from tokencredit.pipeline.values import connect_values, reward_key

    starts = {(rid, reward, index): start for rid, reward, index, start in connect_values(values).execute(
        "SELECT response_id, reward, constraint_index, start FROM decisive WHERE failed").fetchall()}
    out = []
    for t in targets:
        start = starts.get((t.response_id, *reward_key(t.task, t.reward_names, t.k)))
        if start is not None:
            out.append(dataclasses.replace(t, cut=start, source="decisive"))
    if not out:
        raise ValueError(f"--values {values}: no decisive segment of this run's failures (values of another run?)")
    return out


def is_repair(before: Sequence[float], after: Sequence[float], k: int) -> bool:
    """Reward k fixed (score 1) and no other reward lower than it was."""
    return after[k] >= 1 and all(a >= b for j, (a, b) in enumerate(zip(after, before)) if j != k)


def resample(sampler, targets: Sequence[Target], cuts: Sequence[int], sampling: SamplingConfig, n: int,
             seed: int, batch_size: int | None, tag: str = "") -> list[list[list[int]]]:
    """Per target, n suffixes sampled after prompt + y_<cut (ids), each at most max_new_tokens - cut long.

    `batch_size` rows per `generate` call (the transformers sampler), batched by cut so that a batch decodes no
    further than its longest budget needs; None: every row in one call, each to its own budget (`limits`: the vllm
    engine, which batches them itself)."""
    from tokencredit.pipeline.sample.rows import row_seed

    rows = sorted(((i, j) for i in range(len(targets)) for j in range(n)), key=lambda r: cuts[r[0]])
    out: list[list[list[int]]] = [[[] for _ in range(n)] for _ in targets]
    step = batch_size or max(len(rows), 1)
    for start in range(0, len(rows), step):
        batch = rows[start:start + step]
        budgets = [max(1, sampling.max_new_tokens - cuts[i]) for i, _ in batch]
        config = dataclasses.replace(sampling, max_new_tokens=max(budgets))
        prompts = [list(targets[i].prompt_token_ids) + list(targets[i].token_ids[:cuts[i]]) for i, _ in batch]
        seeds = [row_seed(seed, f"{targets[i].key}{tag}", j) for i, j in batch]
        tokens, _ = sampler.generate(prompts, seeds, config, **({} if batch_size else {"limits": budgets}))
        for (i, j), new, budget in zip(batch, tokens, budgets):
            out[i][j] = new[:budget]
    return out


def verify_texts(targets: Sequence[Target], texts: Sequence[Sequence[str]], records: dict[str, TaskRecord],
                 refs, timeout_s: float, memory_bytes: int = AnnotateConfig.verifier_memory_bytes
                 ) -> list[list[list[float] | None]]:
    """Scores per target and resample (None where the verifiers failed on it)."""
    from tokencredit.pipeline.annotate import verify_samples

    samples = [Sample(f"{t.key}/{j}", t.group_id, t.task, t.prompt, list(t.prompt_token_ids), text, [], [], "", 0)
               for t, row in zip(targets, texts) for j, text in enumerate(row)]
    scores = [[s.score for s in v.rewards] if v.status == "ok" else None
              for v in verify_samples(samples, records, refs, timeout_s, memory_bytes)]
    starts = [0]
    for row in texts:
        starts.append(starts[-1] + len(row))
    return [scores[a:b] for a, b in zip(starts, starts[1:])]


def keep_repairs(targets: Sequence[Target], suffixes: Sequence[Sequence[list[int]]], records: dict[str, TaskRecord],
                 tokenizer, refs=(), timeout_s: float = 5.0, memory_bytes: int = AnnotateConfig.verifier_memory_bytes
                 ) -> tuple[pa.Table, dict[str, dict[str, int]]]:
    """Verify one shard's resamples (`resample`'s suffixes) and keep the repairs -> (PAIRS table, per-reward
    counts)."""
    from tokencredit.verifiers import stored_reward

    ids = [[list(t.token_ids[:t.cut]) + s for s in row] for t, row in zip(targets, suffixes)]
    texts = [[tokenizer.decode(x, skip_special_tokens=True) for x in row] for row in ids]
    scores = verify_texts(targets, texts, records, refs, timeout_s, memory_bytes)
    rows, counts = [], {}
    for t, row_ids, row_texts, row_scores, row_suffix in zip(targets, ids, texts, scores, suffixes):
        reward, index = stored_reward(t.task, t.reward_names[t.k])
        fixed = [j for j, s in enumerate(row_scores) if s is not None and is_repair(t.rewards, s, t.k)]
        c = counts.setdefault(reward, dict(failures=0, failures_repaired=0, resamples=0, repairs=0,
                                           tokens_resampled=0))
        c["failures"] += 1
        c["failures_repaired"] += bool(fixed)
        c["resamples"] += len(row_texts)
        c["repairs"] += len(fixed)
        c["tokens_resampled"] += sum(map(len, row_suffix))
        seen = set()
        for j in fixed:
            if row_texts[j] in seen or row_texts[j] == t.response:
                continue
            seen.add(row_texts[j])
            rows.append(_pair_row(t, j, reward, index, row_texts[j], row_ids[j], row_scores[j], tokenizer))
    return pa.Table.from_pylist(rows, schema=PAIRS), counts


def _pair_row(t: Target, j: int, reward: str, index: int | None, text: str, ids: list[int], scores: list[float],
              tokenizer) -> dict[str, Any]:
    from tokencredit.verifiers import stored_reward

    cut_char = len(tokenizer.decode(list(t.token_ids[:t.cut]), skip_special_tokens=True))
    return {"pair_id": f"{t.key}/{j}", "response_id": t.response_id, "group_id": t.group_id, "task": t.task,
            "reward": reward, "constraint_index": index, "cut_position": t.cut, "cut_char": cut_char,
            "relevance_source": t.source, "prompt": t.prompt, "chosen": text, "rejected": t.response,
            "prompt_token_ids": list(t.prompt_token_ids), "chosen_token_ids": ids,
            "rejected_token_ids": list(t.token_ids),
            "reward_names": [stored_reward(t.task, name)[0] for name in t.reward_names],
            "chosen_rewards": scores, "rejected_rewards": list(t.rewards)}


# ---------------------------------------------------------------- the run: shards, markers, summary

class RepairStore(DerivedStore):
    """OUT's parts and markers, a marker last (`DerivedStore`)."""

    folders = ("pairs",)
    holds = "a repair"

    def done(self, shard: int) -> dict | None:
        """The shard's marker when the shard is complete (its part file matches the marker's checksum)."""
        marker = _read_json(self.fs, f"{self.root}/{MARKER.format(shard)}")
        if marker is None or marker["rows"] == 0:
            return marker
        part = f"{self.root}/{PART.format(shard)}"
        if self.fs.get_file_info(part).size is None or _sha256(self.fs, part) != marker["sha256"]:
            return None
        return marker

    def write_shard(self, shard: int, table: pa.Table, counts: dict) -> dict:
        """A shard without repairs writes no part: `datasets` refuses a Parquet file of zero rows."""
        part, digest = f"{self.root}/{PART.format(shard)}", None
        if table.num_rows:
            _write_atomic(self.fs, part, lambda tmp: pq.write_table(table, tmp, filesystem=self.fs))
            digest = _sha256(self.fs, part)
        marker = {"shard": shard, "rows": table.num_rows, "sha256": digest, "counts": counts}
        self.write_json(MARKER.format(shard), marker)
        return marker


def summarize(markers: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Per reward: counts summed over shards, `repair_rate` (repairs per resample) and `share_repaired`
    (the share of failures with at least one repair)."""
    total: dict[str, dict[str, float]] = {}
    for marker in markers:
        for reward, counts in marker["counts"].items():
            into = total.setdefault(reward, {})
            for key, value in counts.items():
                into[key] = into.get(key, 0) + value
    for c in total.values():
        c["repair_rate"] = c["repairs"] / c["resamples"] if c["resamples"] else 0.0
        c["share_repaired"] = c["failures_repaired"] / c["failures"] if c["failures"] else 0.0
    return total


class RepairJob(DerivedJob):
    """One repair run; `shards` are lists of targets."""

    store = RepairStore

    def windows(self, backend: str, device: str) -> list[list[int]]:
        """With the engine, as many consecutive shards as fill its batch (a shard of 16 failures x 4 resamples is
        a quarter of the CPU engine's 256); with transformers one (`engine_loop.shard_windows`)."""
        from tokencredit.pipeline.sample.engine_loop import shard_windows

        return shard_windows(len(self.shards), self.config.shard_size * self.config.n, backend, device)

    def fill_window(self, window: Sequence[int], todo: Sequence[int], records: dict[str, TaskRecord], refs, models,
                    backend: str):
        """The failures of the whole window resampled in one engine call (transformers: in batches of
        `batch_size`), then each shard of `todo` verified and its repairs kept."""
        sampler, tokenizer = models
        targets = [t for s in window for t in self.shards[s]]
        suffixes = resample(sampler, targets, [t.cut for t in targets], self.sampling, self.config.n,
                            self.config.seed, None if backend == "vllm" else self.config.batch_size)
        starts = dict(zip(window, itertools.accumulate((len(self.shards[s]) for s in window), initial=0)))
        for s in todo:
            mine = suffixes[starts[s]:starts[s] + len(self.shards[s])]
            yield s, keep_repairs(self.shards[s], mine, records, tokenizer, refs, self.timeout_s, self.memory_bytes)


def prepare_repair(run: str, out: str, config: RepairConfig) -> RepairJob:
    """Read the run (complete) and its failures, record the config in OUT, and split the failures into shards."""
    settings, sampling = run_sampling(run)
    if config.cut == "decisive":  # value curves of this run as it is now, not of another or an earlier one
        from tokencredit.pipeline.values import ValuesStore

        check_derived_from(config.values, run, ValuesStore, "--values")
    targets = failed_targets(run, None if config.cut == "decisive" else config.limit)
    if config.cut == "decisive":
        targets = decisive_targets(targets, config.values)[:config.limit]
    return RepairJob.plan(run, out, config, targets, settings, sampling)


def finish_repair(job: RepairJob, markers: Sequence[dict]) -> dict:
    """Write OUT/repair.json (config, per-reward figures, totals) and return it."""
    store = RepairStore(job.out, job.run, job.config)
    summary = {"run": job.run, "run_identity": store.identity, "config": dataclasses.asdict(job.config),
               "shards": len(job.shards), "pairs_written": sum(m["rows"] for m in markers),
               "by_reward": summarize(markers),
               "files": [PART.format(m["shard"]) for m in sorted(markers, key=lambda m: m["shard"]) if m["rows"]]}
    store.write_json("repair.json", summary)
    return summary


def run_repair(run: str, out: str, config: RepairConfig = RepairConfig(), device: str = "cpu",
               progress: bool = True) -> dict:
    """Repair every failure of `run` not yet done under `out`, in this process; returns the summary."""
    return run_derived(REPAIR, run, out, config, device, progress)


REPAIR = DerivedKind("repair", "failure", prepare_repair, finish_repair,
                     lambda marker: sum(c["tokens_resampled"] for c in marker["counts"].values()))
