"""Where the credit falls: named DuckDB queries over a run's views (the MRTPO paper's Figure 6).

Every query runs on a connection from `pipeline.query.connect(out)`. Instruction rewards are
stored as their constraint's kind with its `constraint_index`; the queries group them by kind. A
"replay" is one (response, reward, constraint_index) with replay distances (`distance IS NOT NULL`, i.e. MRTPO ran and the
group had variance in that reward) and a positive total distance (an all-zero replay has no
distribution to share out).

`synthetic_run` writes a run directory with concentrated distances, for tests and benchmarks.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from tokencredit.schemas import CREDITS, RESPONSES

from tokencredit.pipeline.dataset.query import SUMMARY_SQL
from tokencredit.pipeline.dataset.writer import RunWriter

TOP_K = 3

# Figure 6 (a, c). Per replay: share of its total distance held by its TOP_K largest tokens,
# and the uniform baseline TOP_K / T (capped at 1). Averaged over the replays of each task,
# reward kind and relevance source (`replay`, or `verifier`: the verifier's spans, see --locate; runs of
# schema 2.1 have no source: replay). `max(x, n)` is a top-n aggregate: one pass, no sort of the credits table.
TOP_SHARE_SQL = f"""
WITH replays AS (
    SELECT task, reward, coalesce(relevance_source, 'replay') AS source,
           sum(distance::DOUBLE) AS total,
           list_sum(max(distance::DOUBLE, {TOP_K})) AS top,
           count(*) AS tokens
    FROM credits
    WHERE distance IS NOT NULL
    GROUP BY task, response_id, reward, constraint_index, source
)
SELECT task,
       reward,
       source,
       count(*) AS replays,
       avg(top / total) AS top_share,
       avg(least({TOP_K} / tokens, 1.0)) AS uniform_share
FROM replays
WHERE total > 0
GROUP BY ALL ORDER BY ALL
"""

# Figure 6 (b, d). Per replay: share of its distance on each response part and that part's share
# of its tokens (the uniform baseline); averaged over the replays of each task and reward kind
# (a part absent from a response counts 0 there), so each (task, reward, source) sums to 1 over parts.
PART_SHARE_SQL = """
WITH parts AS (
    SELECT task, response_id, reward, constraint_index, coalesce(relevance_source, 'replay') AS source,
           coalesce(part, 'other') AS part,
           sum(distance::DOUBLE) AS d, count(*) AS n
    FROM credits
    WHERE distance IS NOT NULL
    GROUP BY ALL
), shares AS (
    SELECT task, reward, source, part,
           d / sum(d) OVER replay AS d_share,
           n / sum(n) OVER replay AS n_share
    FROM parts
    WINDOW replay AS (PARTITION BY task, response_id, reward, constraint_index, source)
    QUALIFY sum(d) OVER replay > 0
), sums AS (
    SELECT task, reward, source, part, sum(d_share) AS d_sum, sum(n_share) AS n_sum
    FROM shares GROUP BY ALL
)
-- each replay's token shares sum to 1, so summing n_sum over parts counts the replays
SELECT task, reward, source, part,
       (sum(n_sum) OVER kind)::BIGINT AS replays,
       d_sum / sum(n_sum) OVER kind AS distance_share,
       n_sum / sum(n_sum) OVER kind AS token_share
FROM sums
WINDOW kind AS (PARTITION BY task, reward, source)
ORDER BY task, reward, source, part
"""

# Score histogram per task and reward kind: scores in [0, 1] in 10 bins (a score of 1 is in bin 9).
SCORE_HIST_SQL = """
SELECT task,
       reward,
       least(floor(score * 10), 9)::INT AS bin,
       count(*) AS n
FROM (SELECT task, unnest(reward_names) AS reward, unnest(rewards) AS score
      FROM responses WHERE status = 'ok')
GROUP BY ALL ORDER BY ALL
"""

COUNTS_SQL = """
SELECT (SELECT count(*) FROM responses) AS responses,
       (SELECT count(*) FROM responses WHERE status = 'ok') AS ok,
       (SELECT count(DISTINCT group_id) FROM responses) AS prompts,
       (SELECT count(*) FROM credits) AS credit_rows,
       (SELECT count(distance) FROM credits) AS replayed_rows,
       (SELECT count(*) FROM credits WHERE relevance_source = 'verifier') AS verifier_rows
"""

# Responses worth showing token by token, `$n` per task: MRTPO credit computed, mixed scores,
# many rewards with a non-zero advantage; the best of each prompt group first so that the
# choice spreads over prompts. Ties break on response_id, so the choice is deterministic.
CHOSEN_SQL = """
WITH ranked AS (
    SELECT response_id, task, group_id,
           (adv_mrtpo IS NOT NULL)::INT AS has_mrtpo,
           (list_min(rewards) < list_max(rewards))::INT AS mixed,
           len(list_filter(reward_advs, lambda a: a != 0)) AS active
    FROM responses
    WHERE status = 'ok' AND reward_advs IS NOT NULL
), ordered AS (
    SELECT *, row_number() OVER (PARTITION BY task, group_id
                                 ORDER BY has_mrtpo DESC, mixed DESC, active DESC, response_id) AS in_group
    FROM ranked
)
SELECT response_id, task FROM ordered
QUALIFY row_number() OVER (PARTITION BY task
                           ORDER BY in_group, has_mrtpo DESC, mixed DESC, active DESC, response_id) <= $n
ORDER BY task, response_id
"""

RESPONSE_SQL = """
SELECT response_id, group_id, task, prompt, response, reward_names, rewards, feedback, reward_advs,
       adv_gdpo, adv_mrtpo, adv_p2t, p2t_reward
FROM responses WHERE response_id = $id
"""

SIBLINGS_SQL = """
SELECT response_id FROM responses
WHERE group_id = (SELECT group_id FROM responses WHERE response_id = $id) AND response_id != $id
ORDER BY response_id
"""

RESPONSE_CREDITS_SQL = """
SELECT reward, constraint_index, position, token_text, char_start, char_end, part, reward_adv, distance,
       weight, advantage, relevance_source
FROM credits WHERE response_id = $id
ORDER BY reward, constraint_index, position
"""


def rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any] | None = None) -> list[dict]:
    """The result of `sql` as a list of {column: value} dicts."""
    result = con.execute(sql, params or {})
    names = [d[0] for d in result.description]
    return [dict(zip(names, row)) for row in result.fetchall()]


def top_share(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """task, reward (kind), replays, top_share, uniform_share (both in [0, 1])."""
    return con.sql(TOP_SHARE_SQL).to_arrow_table()


def part_share(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """task, reward (kind), part, replays, distance_share, token_share (each sums to 1 over parts)."""
    return con.sql(PART_SHARE_SQL).to_arrow_table()


def reward_summary(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """task, reward (kind), responses, mean_score, pass_rate (query.SUMMARY_SQL)."""
    return con.sql(SUMMARY_SQL).to_arrow_table()


def score_histograms(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], list[int]]:
    """(task, reward kind) -> counts of scores in the 10 bins [0, 0.1), ..., [0.9, 1]."""
    hist: dict[tuple[str, str], list[int]] = {}
    for row in rows(con, SCORE_HIST_SQL):
        hist.setdefault((row["task"], row["reward"]), [0] * 10)[row["bin"]] = row["n"]
    return hist


def chosen_responses(con: duckdb.DuckDBPyConnection, per_task: int) -> dict[str, list[str]]:
    """task -> up to `per_task` response ids worth showing token by token (see CHOSEN_SQL)."""
    chosen: dict[str, list[str]] = {}
    for row in rows(con, CHOSEN_SQL, {"n": per_task}):
        chosen.setdefault(row["task"], []).append(row["response_id"])
    return chosen


def siblings(con: duckdb.DuckDBPyConnection, response_id: str) -> list[str]:
    """The ids of the other responses to the same prompt (response_id order)."""
    return [r["response_id"] for r in rows(con, SIBLINGS_SQL, {"id": response_id})]


def responses_by_task(con: duckdb.DuckDBPyConnection, ids: list[str]) -> dict[str, list[str]]:
    """task -> the given response ids of that task (in the given order); ValueError naming an id
    that is not in the run."""
    found = {r["response_id"]: r["task"] for r in rows(
        con, "SELECT response_id, task FROM responses WHERE list_contains($ids, response_id)", {"ids": ids})}
    missing = [i for i in ids if i not in found]
    if missing:
        raise ValueError(f"response id(s) {missing} are not in the run")
    by_task: dict[str, list[str]] = {}
    for rid in dict.fromkeys(ids):
        by_task.setdefault(found[rid], []).append(rid)
    return by_task


def response_detail(con: duckdb.DuckDBPyConnection, response_id: str) -> tuple[dict, list[list[dict]]]:
    """The response row and, for each of its rewards k (the order of `reward_names`), its credit
    rows in position order (empty when the response has no credit)."""
    found = rows(con, RESPONSE_SQL, {"id": response_id})
    if not found:
        raise KeyError(f"response {response_id!r} is not in the run")
    names = found[0]["reward_names"] or []
    per_reward: list[list[dict]] = [[] for _ in names]
    for row in rows(con, RESPONSE_CREDITS_SQL, {"id": response_id}):
        k = row["constraint_index"] if row["constraint_index"] is not None else names.index(row["reward"])
        per_reward[k].append(row)
    return found[0], per_reward


# --- synthetic runs ---------------------------------------------------------------------------

_TASKS = ("sql", "instructions", "tools")
# Token texts; "<sql>" and "</sql>" (the last two) wrap every sql response, the rest hold
# characters an HTML report must escape.
_VOCAB = ("SELECT", " name", " FROM", " singer", " WHERE", " age", " >=", " 30", " &", ' "x"',
          " <b>", "\n", " AND", " id", " =", " 'a'", "<sql>", "</sql>")
_REWARDS = {"sql": ("format", "executable", "execution"), "tools": ("format", "name", "arguments")}
_CONSTRAINTS = ("keyword_include", "length_words")
_PARTS = ("tags", "query", "name", "arguments", "text")


def _reward_names(task: str, K: int) -> list[str]:
    if task == "instructions":  # as stored: the constraint's kind (its index is its position)
        return [_CONSTRAINTS[i % len(_CONSTRAINTS)] for i in range(K)]
    return [_REWARDS[task][i] if i < len(_REWARDS[task]) else f"reward{i}" for i in range(K)]


def _tokens(task: str, T: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Token ids [T] (into _VOCAB) and part codes [T] (into _PARTS)."""
    ids = rng.integers(0, len(_VOCAB) - 2, T)
    parts = np.full(T, _PARTS.index({"sql": "query", "tools": "arguments"}.get(task, "text")))
    if task == "sql" and T >= 2:
        ids[[0, -1]] = len(_VOCAB) - 2, len(_VOCAB) - 1
        parts[[0, -1]] = _PARTS.index("tags")
    elif task == "tools":
        parts[: max(1, T // 4)] = _PARTS.index("name")
    return ids, parts


def _distances(T: int, K: int, rng: np.random.Generator) -> np.ndarray:
    """Replay distances [K, T]: noise below 0.01 plus TOP_K hot tokens per reward (reward 0's on
    the first, middle and last token, where sql's tags are; the others' anywhere)."""
    d = rng.random((K, T)) * 0.01
    hot = rng.integers(0, T, (K, TOP_K))
    hot[0] = [0, T // 2, T - 1]
    d[np.arange(K)[:, None], hot] += rng.uniform(0.2, 0.6, (K, TOP_K))
    return d


def _gdpo(scores: np.ndarray, groups: np.ndarray, eps: float = 1e-6):
    """method.md section 1, group step, on scores [N, K] -> A [N, K], variance [N, K] (the views do the batch step)."""
    A = np.zeros_like(scores)
    var = np.zeros(scores.shape, dtype=bool)
    for g in np.unique(groups):
        s = scores[groups == g]
        std = s.std(0)
        A[groups == g] = np.where(std > 0, (s - s.mean(0)) / (std + eps), 0.0)
        var[groups == g] = std > 0
    return A, var


def _strings(codes: np.ndarray, dictionary: list[str]) -> pa.Array:
    """Strings from codes without a Python object per row (20M-row credits tables)."""
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(dictionary)).cast(pa.string())


def _credits_table(columns: dict[str, list[np.ndarray]], ids: list[str], rewards: list[str],
                   beta: float) -> pa.Table:
    """The credits table from per-response column pieces; string columns arrive as codes."""
    flat = {key: np.concatenate(pieces) for key, pieces in columns.items()}
    return pa.table({
        **flat,
        "response_id": _strings(flat["response_id"], ids), "task": _strings(flat["task"], list(_TASKS)),
        "token_text": _strings(flat["token_id"], list(_VOCAB)), "part": _strings(flat["part"], list(_PARTS)),
        "reward": _strings(flat["reward"], rewards),
        "constraint_index": pa.array(flat["constraint_index"], pa.int32(), mask=flat["constraint_index"] < 0),
        "distance": pa.array(flat["distance"], mask=np.isnan(flat["distance"])),
        "js": pa.nulls(len(flat["weight"]), pa.float32()), "mc": pa.nulls(len(flat["weight"]), pa.float32()),
        "floored": np.zeros(len(flat["weight"]), dtype=bool),
        "relevance_source": _strings(np.isnan(flat["distance"]).astype(np.int32), ["replay", "uniform"]),
        "beta": np.full(len(flat["weight"]), beta)}).select(CREDITS.names)


def _shard(shard: int, first: int, n: int, tokens: int, K: int, group_size: int, beta: float, mrtpo: bool,
           p2t: bool, rng: np.random.Generator) -> tuple[dict[str, pa.Table], dict[str, int]]:
    """Tables and stats of one shard (one GDPO batch): responses first .. first + n - 1."""
    groups = (first + np.arange(n)) // group_size
    scores = (rng.random((n, K)) < 0.5).astype(np.float64)
    A, var = _gdpo(scores, groups)
    replayed = var & mrtpo  # gated pairs keep NULL distances and uniform weights
    ids = [f"r{first + j:08d}" for j in range(n)]
    names: dict[str, int] = {}
    columns: dict[str, list[np.ndarray]] = {}
    responses = []
    for j in range(n):
        task = _TASKS[groups[j] % len(_TASKS)]
        T = int(rng.integers(max(1, tokens - tokens // 2), tokens + tokens // 2 + 1))
        token_ids, parts = _tokens(task, T, rng)
        lengths = np.array([len(_VOCAB[t]) for t in token_ids])
        dist = _distances(T, K, rng)
        weight = np.where(replayed[j][:, None], dist / dist.mean(1, keepdims=True), 1.0)  # [K, T]
        adv = A[j][:, None] * ((1 - beta) + beta * weight)  # [K, T]
        reward_names = _reward_names(task, K)
        per_token = {"response_id": np.full(T, j), "task": np.full(T, _TASKS.index(task)),
                     "position": np.arange(T), "token_id": token_ids, "char_start": np.cumsum(lengths) - lengths,
                     "char_end": np.cumsum(lengths), "part": parts}
        per_pair = {"reward": np.repeat([names.setdefault(r, len(names)) for r in reward_names], T),
                    "constraint_index": np.repeat(np.arange(K) if task == "instructions" else np.full(K, -1), T),
                    "reward_adv": np.repeat(A[j], T),
                    "distance": np.where(replayed[j][:, None], dist, np.nan).ravel(),
                    "weight": weight.ravel(), "advantage": adv.ravel()}
        for key, value in per_token.items():
            columns.setdefault(key, []).append(np.tile(value, K))
        for key, value in per_pair.items():
            columns.setdefault(key, []).append(value)
        raw = rng.normal(size=T).tolist() if p2t else None
        responses.append({
            "response_id": ids[j], "group_id": f"g{groups[j]:07d}", "shard": shard, "task": task,
            "prompt": f"prompt {groups[j]}", "response": "".join(_VOCAB[t] for t in token_ids),
            "token_ids": token_ids.tolist(), "sample_logprobs": (-rng.random(T)).tolist(),
            "reward_names": reward_names, "rewards": scores[j].tolist(),
            "feedback": [f"checked {r}" for r in reward_names], "observed": ["" for _ in reward_names],
            "reward_advs": A[j].tolist(),
            "gdpo_sum": A[j].sum(), "mrtpo_sum": adv.sum(0).tolist() if mrtpo else None,
            "p2t_raw": raw, "p2t_reward": raw, "p2t_alpha": 0.1 if p2t else None,
            "status": "ok", "model": "synthetic", "seed": 0})
    credits = _credits_table(columns, ids, list(names), beta)
    stats = {"responses": n, "verifier_failures": 0}
    if mrtpo:
        stats.update(replays_done=int(replayed.sum()), replays_skipped=int((~replayed).sum()))
    if p2t:
        stats.update(p2t_responses=n, p2t_near_flat=0)
    return {"responses": pa.Table.from_pylist(responses, schema=RESPONSES), "credits": credits}, stats


def synthetic_run(out: str | Path, responses: int, tokens: int, rewards: int, seed: int = 0, *,
                  group_size: int = 4, beta: float = 0.5, mrtpo: bool = True, p2t: bool = False,
                  shard_responses: int = 4096) -> Path:
    """Write a synthetic run directory through RunWriter, with about responses x tokens x rewards credit rows.

    Tasks cycle over prompt groups of `group_size` responses; a response has T ~ U[tokens/2, 3 tokens/2]
    tokens and `rewards` binary rewards, with GDPO advantages before the batch step (the views take it
    over the run). Replay distances are concentrated on TOP_K tokens per reward, NULL where the group has no variance in that reward
    or everywhere when `mrtpo` is False; P2T columns are NULL unless `p2t`.
    """
    writer = RunWriter(str(out))
    config = {"synthetic": True, "responses": responses, "tokens": tokens, "rewards": rewards,
              "seed": seed, "group_size": group_size, "beta": beta, "mrtpo": mrtpo, "p2t": p2t}
    config_hash = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    writer.start(f"synthetic-{seed}", config, config_hash, "synthetic")
    rng = np.random.default_rng(seed)
    step = max(group_size, shard_responses - shard_responses % group_size)  # whole groups per shard
    starts = range(0, responses, step)
    for shard, first in enumerate(starts):
        tables, stats = _shard(shard, first, min(step, responses - first), tokens, rewards, group_size, beta,
                               mrtpo, p2t, rng)
        writer.write_shard(shard, tables, stats)
    writer.finish(len(starts), {"rejected": 0})
    return Path(out)
