"""Arrow schemas of the tokencredit dataset and the DuckDB views over a run directory.

A run directory holds `responses/part-*.parquet`, `credits/part-*.parquet` and
`manifest.json`; `views.sql` (with `{out}` replaced by the run directory) creates the
`responses`, `credits` and `training` views.
"""
from __future__ import annotations

from importlib.resources import files

import pyarrow as pa

SCHEMA_VERSION = "1.1"

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
        pa.field("reward_names", pa.list_(pa.string())),
        pa.field("rewards", pa.list_(pa.float32())),
        pa.field("feedback", pa.list_(pa.string())),  # per reward: what the verifier expected
        pa.field("observed", pa.list_(pa.string())),  # per reward: what it found in the response
        pa.field("reward_advs", pa.list_(pa.float32())),
        pa.field("adv_grpo", pa.float32()),
        pa.field("adv_gdpo", pa.float32()),
        pa.field("adv_mrtpo", pa.list_(pa.float32())),
        pa.field("p2t_raw", pa.list_(pa.float32())),
        pa.field("p2t_reward", pa.list_(pa.float32())),
        pa.field("adv_p2t", pa.list_(pa.float32())),
        pa.field("status", pa.string()),
        pa.field("model", pa.string()),
        pa.field("seed", pa.int64()),
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
        pa.field("reward_adv", pa.float32()),
        pa.field("distance", pa.float32()),  # replay relevance d of the run's option (manifest: credit.relevance)
        pa.field("js", pa.float32()),  # JS distance, when stored beside another relevance
        pa.field("floored", pa.bool_()),  # d under the noise floor: uniform weights for this (response, reward)
        pa.field("weight", pa.float32()),
        pa.field("advantage", pa.float32()),
        pa.field("beta", pa.float32()),
    ]
)

TABLES = {"responses": RESPONSES, "credits": CREDITS}


def with_version(schema: pa.Schema, table: str) -> pa.Schema:
    """The schema with its version and table name in the Parquet key-value metadata."""
    return schema.with_metadata({"tokencredit.schema_version": SCHEMA_VERSION, "tokencredit.table": table})


def views_sql(out: str) -> str:
    """DuckDB statements creating the views over run directory `out`."""
    text = files("schemas").joinpath("views.sql").read_text()
    return text.replace("{out}", str(out).replace("'", "''"))
