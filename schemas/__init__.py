"""Arrow schemas of the tokencredit dataset and the DuckDB views over a run directory.

A run directory holds `responses/part-*.parquet`, `credits/part-*.parquet`, `nodes/part-*.parquet`
(the nodes of tree-sampled groups; empty for flat sampling) and `manifest.json`; `views.sql` (with
`{responses}`, `{credits}` and `{nodes}` replaced by table expressions over the manifest's part files)
creates the `responses`, `credits`, `training`, `nodes` and `leaf_segments` views.

A values folder (`tokencredit values RUN --out DIR`) holds `values/part-*.parquet` (VALUES) and
`decisive/part-*.parquet` (DECISIVE); `values_views.sql` creates its `values`, `decisive` and `curves` views.
"""
from __future__ import annotations

from importlib.resources import files

import pyarrow as pa

# 2.0: GDPO's batch step moved to the views; 2.1: instruction rewards as kind + constraint_index;
# 2.2: credits.relevance_source (verifier spans, replay or uniform); 2.3: tree-sampled groups
# (responses.segments and the nodes table) and their Monte-Carlo credit (credits.mc, responses.mc_sum)
SCHEMA_VERSION = "2.3"

# One node of a leaf's path in a tree-sampled group (records.Segment): the leaf's tokens [start, end)
SEGMENT = pa.struct([pa.field("node_id", pa.string()), pa.field("parent_id", pa.string()),
                     pa.field("start", pa.int32()), pa.field("end", pa.int32())])

RESPONSES = pa.schema(
    [
        pa.field("response_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("task", pa.string(), nullable=False),
        pa.field("prompt", pa.string()),
        pa.field("response", pa.string()),
        pa.field("prompt_token_ids", pa.list_(pa.int32())),
        pa.field("token_ids", pa.list_(pa.int32())),
        pa.field("sample_logprobs", pa.list_(pa.float32())),
        # the verifier's rewards in order; an instruction constraint's kind (list position = its index)
        pa.field("reward_names", pa.list_(pa.string())),
        pa.field("rewards", pa.list_(pa.float32())),
        pa.field("feedback", pa.list_(pa.string())),  # per reward: what the verifier expected
        pa.field("observed", pa.list_(pa.string())),  # per reward: what it found in the response
        pa.field("reward_advs", pa.list_(pa.float32())),
        pa.field("adv_grpo", pa.float32()),
        # before GDPO's batch step (the views apply c and m over the whole run): S[i] = sum_k w_k A[i,k]
        pa.field("gdpo_sum", pa.float32()),
        pa.field("mrtpo_sum", pa.list_(pa.float32())),  # [T] sum_k w_k A[i,k,t]
        pa.field("mc_sum", pa.list_(pa.float32())),  # [T] sum_k w_k A_mc[i,k,t] (method.md 3b); NULL without mc
        pa.field("p2t_raw", pa.list_(pa.float32())),
        pa.field("p2t_reward", pa.list_(pa.float32())),
        pa.field("p2t_alpha", pa.float32()),  # A_p2t[i,t] = A_gdpo[i] + p2t_alpha * p2t_reward[t]
        pa.field("status", pa.string()),
        pa.field("model", pa.string()),
        pa.field("seed", pa.int64()),
        pa.field("segments", pa.list_(SEGMENT)),  # root -> leaf, covering [0, T); NULL for flat sampling
    ]
)

# One row per node of a tree-sampled group (per shard: a group lies in one shard)
NODES = pa.schema(
    [
        pa.field("node_id", pa.string(), nullable=False),  # "<record id>/t<r>", "<record id>/t<r>.<l>", ...
        pa.field("parent_id", pa.string()),  # NULL for a root (its parent is the prompt)
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("shard", pa.int32(), nullable=False),
        pa.field("depth", pa.int32(), nullable=False),  # 0 for a root
        # the node's tokens [start, end) within each of its leaves' responses (the same in each)
        pa.field("start", pa.int32(), nullable=False),
        pa.field("end", pa.int32(), nullable=False),
        pa.field("prefix_tokens", pa.int32(), nullable=False),  # what the node was sampled after: prompt + start
        pa.field("leaves", pa.int32(), nullable=False),  # leaves below it (a leaf: 1)
    ]
)

CREDITS = pa.schema(
    [
        pa.field("response_id", pa.string(), nullable=False),
        pa.field("task", pa.string()),
        pa.field("position", pa.int32(), nullable=False),
        pa.field("token_id", pa.int32()),
        pa.field("token_text", pa.string()),
        pa.field("char_start", pa.int32()),
        pa.field("char_end", pa.int32()),
        pa.field("part", pa.string()),
        pa.field("reward", pa.string(), nullable=False),
        pa.field("constraint_index", pa.int32()),  # which constraint of an instruction record; NULL elsewhere
        pa.field("reward_adv", pa.float32()),
        pa.field("distance", pa.float32()),  # replay relevance d of the run's option (manifest: credit.relevance)
        pa.field("js", pa.float32()),  # JS distance, when stored beside another relevance
        pa.field("floored", pa.bool_()),  # d under the noise floor: uniform weights for this (response, reward)
        # where this (response, reward)'s relevance d came from: 'verifier' (1 on the tokens overlapping the
        # verifier's spans), 'replay', 'uniform' (neither) (manifest: credit.locate); 'rollout' in a run with mc
        # and without MRTPO (its token credit, `mc`, came from the tree's rollouts); NULL without either. In a
        # run with both it is MRTPO's: it describes d, weight and advantage; `mc` always comes from rollouts.
        pa.field("relevance_source", pa.string()),
        pa.field("weight", pa.float32()),
        pa.field("advantage", pa.float32()),
        # Monte-Carlo A_mc[i,k,t] of a tree-sampled group (method.md 3b), before weights and the batch step;
        # NULL when mc did not run
        pa.field("mc", pa.float32()),
        pa.field("beta", pa.float32()),
    ]
)

# The value curve of a run's response (pipeline/values.py): V(c) of one reward (or of the mean reward) at a
# cut c, the mean score of k continuations of the response's first c tokens under the run's sampling settings.
VALUES = pa.schema(
    [
        pa.field("response_id", pa.string(), nullable=False),
        pa.field("task", pa.string()),
        pa.field("reward", pa.string(), nullable=False),  # as the credits table names it; 'mean': the mean reward
        pa.field("constraint_index", pa.int32()),  # which constraint of an instruction record; NULL elsewhere
        pa.field("cut", pa.int32(), nullable=False),  # the cut's index along the response's curve (0: position 0)
        pa.field("position", pa.int32(), nullable=False),  # c: tokens of the response kept
        pa.field("sources", pa.list_(pa.string())),  # why c is a cut: grid, span:REWARD, top:REWARD, end
        pa.field("value", pa.float32(), nullable=False),  # mean score of the k continuations (end: the response's)
        pa.field("k", pa.int32(), nullable=False),  # continuations verified (0 at the end: the response itself)
        pa.field("stderr", pa.float32()),  # standard error of `value` (sample std / sqrt(k)); NULL for k < 2
    ]
)

# Per (response, reward) measured: where its value curve changes most, between consecutive cuts [start, end)
DECISIVE = pa.schema(
    [
        pa.field("response_id", pa.string(), nullable=False),
        pa.field("task", pa.string()),
        pa.field("reward", pa.string(), nullable=False),
        pa.field("constraint_index", pa.int32()),
        pa.field("failed", pa.bool_(), nullable=False),  # the response failed this reward (mean: any reward)
        pa.field("start", pa.int32(), nullable=False),  # the segment's first token
        pa.field("end", pa.int32(), nullable=False),  # one past its last token
        pa.field("change", pa.float32(), nullable=False),  # V(end) - V(start): the largest fall (failed), rise (passed)
        pa.field("length", pa.int32(), nullable=False),  # the response's tokens
    ]
)
VALUE_TABLES = {"values": VALUES, "decisive": DECISIVE}

TABLES = {"responses": RESPONSES, "credits": CREDITS, "nodes": NODES}


def with_version(schema: pa.Schema, table: str) -> pa.Schema:
    """The schema with its version and table name in the Parquet key-value metadata."""
    return schema.with_metadata({"tokencredit.schema_version": SCHEMA_VERSION, "tokencredit.table": table})


BATCH_DEFAULTS = {"batch": "std", "batch_ddof": 0, "batch_eps": 1e-6}  # method.md's GDPO batch step


def views_sql(sources: dict[str, str], gdpo: dict | None = None) -> str:
    """DuckDB statements creating the views.

    sources: each table of TABLES -> a table expression over exactly its files, e.g.
    {"responses": "read_parquet(['OUT/responses/part-00000.parquet'])", ...}.
    gdpo: the run's GDPO options (the manifest's config.credit.gdpo); the batch step uses their
    `batch`, `batch_ddof` and `batch_eps` (defaults: the method's).
    """
    options = {**BATCH_DEFAULTS, **{k: v for k, v in (gdpo or {}).items() if k in BATCH_DEFAULTS}}
    if options["batch"] not in ("std", "whiten", "none"):
        raise ValueError(f"GDPO batch step {options['batch']!r} is not one of std, whiten, none")
    text = files("tokencredit.schemas").joinpath("views.sql").read_text()
    text = text.replace("{batch}", options["batch"])
    text = text.replace("{batch_ddof}", str(int(options["batch_ddof"])))
    text = text.replace("{batch_eps}", repr(float(options["batch_eps"])))
    for name in TABLES:
        text = text.replace("{" + name + "}", sources[name])
    return text


def values_views_sql(sources: dict[str, str]) -> str:
    """DuckDB statements creating a values folder's views; sources: each table of VALUE_TABLES -> a table
    expression over its files."""
    text = files("tokencredit.schemas").joinpath("values_views.sql").read_text()
    for name in VALUE_TABLES:
        text = text.replace("{" + name + "}", sources[name])
    return text
