"""Value curves of a run's responses (issue 26): where a sampled response went wrong, measured.

V_k(c) = E[score of reward k | the response's first c tokens kept, the rest resampled from the policy]. For each
failed (response, reward) pair of a run (or `pairs` of them, drawn with `seed`), the value of every reward of the
response and of its mean reward at its cuts: `cuts` evenly spaced positions (floor(i * T / cuts), i < cuts), the
verifier's span start of each failed reward (where the verifier says where) and the MRTPO credit's most
penalized token of each failed reward (where the run has MRTPO credit), each from `k` continuations under the
run's sampling settings (its manifest), verified by the run's verifiers (built-in and plugins, as annotate
verifies). The end of the response (c = T) is a point of every curve, with the response's own score. A response's
cuts share one prefill per prefix (`sample.tree.continue_prefixes`), and all its rewards share its continuations.

The decisive segment of a failed pair is the [c_i, c_i+1) of consecutive cuts whose value falls most
(V(c_i+1) - V(c_i) lowest, the earliest of ties); of a passed pair (`passed=True`), the one whose value rises most.

    OUT/values/part-00003.parquet     the curves of shard 3 (schemas.VALUES)
    OUT/decisive/part-00003.parquet   its decisive segments (schemas.DECISIVE)
    OUT/_shards/shard-00003.json      its marker, written last (checksums of both parts, counts)
    OUT/config.json                   the run (path and identity: config hash, inputs, dataset checksum) and config
                                      of OUT; another, or the same folder's run written again, is refused
    OUT/values.json                   the summary, once every shard is written (with the run's identity)

Continuation j of cut c of a response draws from seed `continuation_seed(run seed, response id, c, j)`, so a
resumed run (shards whose marker and part checksums hold are kept) writes the same values as an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tokencredit.schemas import DECISIVE, VALUE_TABLES, VALUES
from tokencredit.schemas.records import Sample, TaskRecord

from tokencredit.pipeline.config import AnnotateConfig, SamplingConfig
from tokencredit.pipeline.dataset.derived import DerivedJob, DerivedKind, DerivedStore, run_derived, run_sampling
from tokencredit.pipeline.dataset.writer import _check_part, _read_json, _sha256, _write_atomic, filesystem

PART = "{table}/part-{shard:05d}.parquet"
MARKER = "_shards/shard-{:05d}.json"
MEAN = "mean"


@dataclass(frozen=True)
class ValuesConfig:
    k: int = 16  # continuations per cut
    cuts: int = 8  # evenly spaced cuts per response (the span and top-token cuts come on top)
    pairs: int | None = None  # failed pairs to measure, drawn with `seed` (None: all)
    passed: bool = False  # also as many passed pairs (all with pairs=None)
    seed: int = 0  # the draw of the pairs (continuations draw from the run's sampling seed)
    shard_size: int = 4  # responses per shard (the unit of resumption)
    batch_size: int = 128  # continuations per forward

    def __post_init__(self) -> None:
        checks = {"k": self.k >= 1, "cuts": self.cuts >= 1, "pairs": self.pairs is None or self.pairs >= 1,
                  "shard_size": self.shard_size >= 1, "batch_size": self.batch_size >= 1}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError("values: " + "; ".join(f"--{b.replace('_', '-')} must be >= 1, got {getattr(self, b)}"
                                                    for b in bad))


@dataclass(frozen=True)
class Curved:
    """A response whose curves are measured, and which of its rewards are measured pairs."""

    response_id: str
    group_id: str
    task: str
    prompt: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    response: str
    reward_names: tuple[str, ...]
    rewards: tuple[float, ...]
    pairs: tuple[int, ...]  # reward indices measured (failed ones, and passed ones with `passed`)
    tops: tuple[tuple[int, int], ...]  # (reward index, MRTPO's most penalized token) of its failed pairs


# ---------------------------------------------------------------- plain functions

def grid_cuts(length: int, cuts: int) -> list[int]:
    """`cuts` evenly spaced positions of a response of `length` tokens: floor(i * length / cuts), i < cuts
    (fewer when the response is shorter than `cuts`)."""
    return sorted({i * length // cuts for i in range(cuts)})


def continuation_seed(seed: int, response_id: str, position: int, j: int) -> int:
    """Seed of continuation j of the response's first `position` tokens."""
    from tokencredit.pipeline.sample.rows import row_seed

    return row_seed(seed, f"{response_id}@{position}", j)


def mean_and_stderr(scores: Sequence[float]) -> tuple[float, float | None]:
    """(mean, sample std / sqrt(n)) of scores; the error is None for fewer than 2."""
    n = len(scores)
    mean = sum(scores) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((s - mean) ** 2 for s in scores) / (n - 1) / n)


def decisive_segment(positions: Sequence[int], values: Sequence[float], rise: bool = False) -> tuple[int, int, float]:
    """The consecutive cuts [positions[i], positions[i+1]) whose value falls most (`rise`: rises most).

    positions: increasing token positions of a curve (its last the response's end); values: V at each.
    -> (start, end, change) with change = V(end) - V(start): the lowest (highest with `rise`), earliest of ties."""
    if len(positions) != len(values) or len(positions) < 2:
        raise ValueError(f"decisive_segment: needs 2 or more points, got {len(positions)} positions and "
                         f"{len(values)} values")
    sign = -1.0 if rise else 1.0
    i = min(range(len(values) - 1), key=lambda i: (sign * (values[i + 1] - values[i]), i))
    return positions[i], positions[i + 1], values[i + 1] - values[i]


def span_start_token(spans: Sequence[tuple[int, int]], char_starts: Sequence[int], char_ends: Sequence[int]) -> int | None:
    """The first token overlapping the first span ([start, end) characters of the response); None without spans."""
    if not spans:
        return None
    start = spans[0][0]
    return next((t for t, (a, b) in enumerate(zip(char_starts, char_ends)) if b > start and b > a), None)


# ---------------------------------------------------------------- the run's pairs

RESPONSES_SQL = """
SELECT response_id, group_id, task, prompt, prompt_token_ids, token_ids, response, reward_names, rewards
FROM responses WHERE status = 'ok' AND len(token_ids) > 0 ORDER BY response_id
"""
ADVANTAGES_SQL = """
SELECT response_id, reward, constraint_index, list(advantage ORDER BY position) AS adv
FROM credits WHERE relevance_source IS NOT NULL AND relevance_source <> 'rollout' GROUP BY ALL  -- MRTPO's
"""


def run_pairs(run: str) -> tuple[list[tuple], dict[tuple[str, int], list[float]]]:
    """The run's verified responses (RESPONSES_SQL rows) and MRTPO's token advantages by (response, reward index)."""
    from tokencredit.pipeline.dataset.query import connect

    con = connect(run)
    rows = con.execute(RESPONSES_SQL).fetchall()
    names = {r[0]: r[7] for r in rows}
    advantages = {}
    for rid, reward, index, adv in con.execute(ADVANTAGES_SQL).fetchall():
        if rid in names:  # an instruction reward's index is its constraint's (as in the credits table)
            advantages[rid, index if index is not None else names[rid].index(reward)] = adv
    return rows, advantages


def reward_key(task: str, reward_names: Sequence[str], k: int) -> tuple[str, int | None]:
    """(reward, constraint_index) of a response's reward k, as the credits table keys it."""
    return reward_names[k], k if task == "instructions" else None


def select(rows: Sequence[tuple], advantages: dict, config: ValuesConfig) -> list[Curved]:
    """The responses with measured pairs: `config.pairs` failed pairs drawn with `config.seed` (and as many passed
    ones with `passed`), grouped by response, the responses in an order shuffled with the same seed: the shards
    a stopped run completed are then a random sample of the pairs, not the run's first prompts. ValueError when
    the run has fewer pairs."""
    from tokencredit.pipeline.credit.penalty import penalty_cut

    failed = [(i, k) for i, r in enumerate(rows) for k, score in enumerate(r[8]) if score < 1]
    passed = [(i, k) for i, r in enumerate(rows) for k, score in enumerate(r[8]) if score >= 1]
    if not failed:
        raise ValueError("values: the run has no failed (response, reward) pairs to measure")
    rng = random.Random(config.seed)
    chosen = set(_draw(failed, config.pairs, rng, "failed"))
    if config.passed:
        chosen |= set(_draw(passed, min(config.pairs or len(passed), len(passed)), rng, "passed"))
    out = []
    for i, r in enumerate(rows):
        pairs = tuple(k for k in range(len(r[8])) if (i, k) in chosen)
        if pairs:
            tops = tuple((k, penalty_cut(advantages[r[0], k])) for k in pairs
                         if r[8][k] < 1 and (r[0], k) in advantages)
            out.append(Curved(r[0], r[1], r[2], r[3], tuple(r[4]), tuple(r[5]), r[6], tuple(r[7]), tuple(r[8]),
                              pairs, tops))
    rng.shuffle(out)
    return out


def _draw(pairs: list, n: int | None, rng: random.Random, kind: str) -> list:
    if n is None:
        return pairs
    if n > len(pairs):
        raise ValueError(f"values: --pairs {n} is more than the run's {len(pairs)} {kind} (response, reward) pairs")
    return rng.sample(pairs, n)


# ---------------------------------------------------------------- one shard

def cut_sources(curved: Curved, spans: Sequence[Sequence[tuple[int, int]]], tokenizer, cuts: int) -> dict[int, list[str]]:
    """Position -> why it is a cut (grid, span:REWARD, top:REWARD), every position below the response's length."""
    from tokencredit.pipeline.sample.detokenize import token_spans

    length = len(curved.token_ids)
    sources: dict[int, list[str]] = {c: ["grid"] for c in grid_cuts(length, cuts)}
    _, starts, ends = token_spans(tokenizer, list(curved.token_ids))
    for k in curved.pairs:
        start = span_start_token(spans[k], starts, ends) if curved.rewards[k] < 1 else None
        if start is not None:
            sources.setdefault(start, []).append(f"span:{curved.reward_names[k]}")
    for k, top in curved.tops:
        sources.setdefault(top, []).append(f"top:{curved.reward_names[k]}")
    return {c: s for c, s in sorted(sources.items()) if c < length}


def values_shard(curves: Sequence[Curved], records: dict[str, TaskRecord], sampler, tokenizer,
                 sampling: SamplingConfig, config: ValuesConfig, refs=(), timeout_s: float = 5.0,
                 memory_bytes: int = AnnotateConfig.verifier_memory_bytes) -> tuple[pa.Table, pa.Table, dict]:
    """Cut, continue, verify one shard -> (VALUES table, DECISIVE table, counts)."""
    from tokencredit.pipeline.annotate import verify_samples
    from tokencredit.pipeline.sample.tree import continue_prefixes

    originals = verify_samples([_sample(c, c.response, c.response_id) for c in curves], records, refs, timeout_s,
                               memory_bytes)
    spans = [[list(s.spans) for s in v.rewards] if v.status == "ok" else [[] for _ in c.rewards]
             for c, v in zip(curves, originals)]
    cut_maps = [cut_sources(c, s, tokenizer, config.cuts) for c, s in zip(curves, spans)]
    prefixes = [(i, p) for i, m in enumerate(cut_maps) for p in m]
    seeds = [[continuation_seed(sampling.seed, curves[i].response_id, p, j) for j in range(config.k)]
             for i, p in prefixes]
    started = time.perf_counter()
    outs = continue_prefixes(sampler, [curves[i].prompt_token_ids for i, _ in prefixes],
                             [curves[i].token_ids[:p] for i, p in prefixes], seeds,
                             dataclasses.replace(sampling, batch_size=config.batch_size))
    sampling_s = time.perf_counter() - started
    samples = [_sample(curves[i], tokenizer.decode([*curves[i].token_ids[:p], *ids], skip_special_tokens=True),
                       f"{curves[i].response_id}@{p}/{j}")
               for (i, p), row in zip(prefixes, outs) for j, (ids, _) in enumerate(row)]
    verified = verify_samples(samples, records, refs, timeout_s, memory_bytes)
    scores: dict[tuple[int, int], list[list[float]]] = {}
    for (i, p), start in zip(prefixes, range(0, len(verified), config.k)):
        scores[i, p] = [[s.score for s in v.rewards] for v in verified[start:start + config.k] if v.status == "ok"
                        and len(v.rewards) == len(curves[i].rewards)]
    value_rows, decisive_rows = [], []
    for i, (curve, cut_map) in enumerate(zip(curves, cut_maps)):
        v, d = _curve_rows(curve, cut_map, {p: scores[i, p] for p in cut_map})
        value_rows += v
        decisive_rows += d
    counts = {"responses": len(curves), "pairs": sum(len(c.pairs) for c in curves), "prefixes": len(prefixes),
              "continuations": len(samples), "continuation_tokens": sum(len(ids) for row in outs for ids, _ in row),
              "sampling_s": sampling_s}
    return pa.Table.from_pylist(value_rows, schema=VALUES), pa.Table.from_pylist(decisive_rows, schema=DECISIVE), counts


def _sample(curve: Curved, text: str, sample_id: str) -> Sample:
    return Sample(sample_id, curve.group_id, curve.task, curve.prompt, list(curve.prompt_token_ids), text, [], [], "", 0)


def _curve_rows(curve: Curved, cut_map: dict[int, list[str]], scores: dict[int, list[list[float]]]
                ) -> tuple[list[dict], list[dict]]:
    """Per reward (and the mean): a VALUES row per cut and the end; a DECISIVE row per measured pair (and the mean)."""
    length = len(curve.token_ids)
    positions = [*cut_map, length]
    sources = [*cut_map.values(), ["end"]]
    value_rows, decisive_rows = [], []
    failed_any = min(curve.rewards) < 1
    for k in [*range(len(curve.rewards)), None]:
        reward, index = reward_key(curve.task, curve.reward_names, k) if k is not None else (MEAN, None)

        def of(row: list[float]) -> float:
            return row[k] if k is not None else sum(row) / len(row)
        curve_values = []
        for cut, (p, why) in enumerate(zip(positions, sources)):
            observed = [of(row) for row in scores[p]] if p < length else [of(list(curve.rewards))]
            value, stderr = mean_and_stderr(observed) if observed else (math.nan, None)
            curve_values.append(value)
            value_rows.append({"response_id": curve.response_id, "task": curve.task, "reward": reward,
                               "constraint_index": index, "cut": cut, "position": p, "sources": why, "value": value,
                               "k": len(observed) if p < length else 0, "stderr": stderr})
        failed = curve.rewards[k] < 1 if k is not None else failed_any
        if (k is None or k in curve.pairs) and all(not math.isnan(v) for v in curve_values):
            start, end, change = decisive_segment(positions, curve_values, rise=not failed)
            decisive_rows.append({"response_id": curve.response_id, "task": curve.task, "reward": reward,
                                  "constraint_index": index, "failed": failed, "start": start, "end": end,
                                  "change": change, "length": length})
    return value_rows, decisive_rows


# ---------------------------------------------------------------- the folder: shards, markers, views

class ValuesStore(DerivedStore):
    """OUT's parts and markers, a marker last (`DerivedStore`)."""

    folders = tuple(VALUE_TABLES)
    holds = "values"

    def done(self, shard: int) -> dict | None:
        """The shard's marker when the shard is complete (each part matches the marker's checksum)."""
        marker = _read_json(self.fs, f"{self.root}/{MARKER.format(shard)}")
        if marker is None:
            return None
        for table, digest in marker["sha256"].items():
            part = f"{self.root}/{PART.format(table=table, shard=shard)}"
            if self.fs.get_file_info(part).size is None or _sha256(self.fs, part) != digest:
                return None
        return marker

    def write_shard(self, shard: int, tables: dict[str, pa.Table], counts: dict) -> dict:
        digests = {}
        for name, table in tables.items():
            part = f"{self.root}/{PART.format(table=name, shard=shard)}"
            _write_atomic(self.fs, part, lambda tmp, t=table: pq.write_table(t, tmp, filesystem=self.fs))
            digests[name] = _sha256(self.fs, part)
        marker = {"shard": shard, "rows": {n: t.num_rows for n, t in tables.items()}, "sha256": digests,
                  "counts": counts}
        self.write_json(MARKER.format(shard), marker)
        return marker


class ValuesJob(DerivedJob):
    """One values run; `shards` are lists of responses."""

    store = ValuesStore

    def fill(self, curves: list[Curved], records: dict[str, TaskRecord], refs, sampler, tokenizer):
        values, decisive, counts = values_shard(curves, records, sampler, tokenizer, self.sampling, self.config,
                                                refs, self.timeout_s, self.memory_bytes)
        return {"values": values, "decisive": decisive}, counts


def prepare_values(run: str, out: str, config: ValuesConfig) -> ValuesJob:
    """Read the run (complete) and its pairs, record the config in OUT, split the responses into shards. Every
    input error is raised here, before a model loads."""
    settings, sampling = run_sampling(run)
    rows, advantages = run_pairs(run)
    return ValuesJob.plan(run, out, config, select(rows, advantages, config), settings, sampling)


def finish_values(job: ValuesJob, markers: Sequence[dict]) -> dict:
    """Write OUT/values.json (config, totals, files) and return it."""
    totals: dict[str, float] = {}
    for marker in markers:
        for key, value in marker["counts"].items():
            totals[key] = totals.get(key, 0) + value
    ordered = sorted(markers, key=lambda m: m["shard"])
    store = ValuesStore(job.out, job.run, job.config)
    summary = {"run": job.run, "run_identity": store.identity, "config": dataclasses.asdict(job.config),
               "shards": len(job.shards), **totals,
               "files": {name: [PART.format(table=name, shard=m["shard"]) for m in ordered] for name in VALUE_TABLES}}
    store.write_json("values.json", summary)
    return summary


def run_values(run: str, out: str, config: ValuesConfig = ValuesConfig(), device: str = "cpu",
               progress: bool = True, backend: str = "transformers") -> dict:
    """Measure every selected pair of `run` not yet done under `out`, in this process; returns the summary.
    `backend`: the continuations' sampler (transformers or vllm)."""
    return run_derived(VALUES_KIND, run, out, config, device, progress, backend=backend)


VALUES_KIND = DerivedKind("values", "response", prepare_values, finish_values,
                          lambda marker: marker["counts"]["continuation_tokens"])


def connect_values(out: str):
    """An in-memory DuckDB connection with the views `values`, `decisive` and `curves` over OUT's complete shards
    (those with a marker; a killed run's folder reads as far as it got)."""
    import duckdb

    from tokencredit.schemas import values_views_sql

    fs, root = filesystem(out)
    shards = sorted(info.base_name for info in fs.get_file_info(pafs.FileSelector(f"{root}/_shards"))
                    if info.base_name.endswith(".json"))
    if not shards:
        raise ValueError(f"{out} holds no values (no complete shard); run `tokencredit values RUN --out {out}`")
    numbers = [int(name.split("-")[1].split(".")[0]) for name in shards]
    for n in numbers:  # a part gone or cut short: one line, not DuckDB's error
        rows = _read_json(fs, f"{root}/{MARKER.format(n)}")["rows"]
        for name in VALUE_TABLES:
            _check_part(fs, out, root, {"path": PART.format(table=name, shard=n), "rows": rows[name]},
                        f"resume the values run (tokencredit values RUN --out {out}) to write its shard again")
    con = duckdb.connect()
    sources = {}
    for name in VALUE_TABLES:
        sources[name] = f"read_parquet({[f'{root}/{PART.format(table=name, shard=n)}' for n in numbers]!r})"
    con.execute(values_views_sql(sources))
    return con
