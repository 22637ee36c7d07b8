"""Export a run's training view for other trainers: a Hugging Face `datasets` folder or verl Parquet.

Both read the DuckDB `training` view (responses with status 'ok', ordered by response_id) and
choose the advantage by name, as the trainer does: "gdpo", "mrtpo", "p2t" or a mix such as
"mrtpo:0.5,gdpo:0.5" (coefficient-weighted sum per token). Every per-token list has one value per
response token, aligned with the token ids.

**export_hf(out_dir, dest)**: `datasets.Dataset.save_to_disk(dest)` with one row per response:

    prompt                str          the prompt text the response was sampled for
    completion            str          the response text
    prompt_token_ids      list[int32]  the prompt as the policy saw it
    completion_token_ids  list[int32]  the response tokens (T of them)
    weights               list[float]  per-token SFT weight (the view's sft_weight), T values
    advantages            list[float]  per-token advantage of the chosen kind, T values
    response_id, task     str

    import datasets
    ds = datasets.load_from_disk(dest)
    row = ds[0]   # row["completion_token_ids"], row["weights"], row["advantages"] align

**export_verl(out_dir, dest_file)**: one Parquet file in the layout of verl's RL datasets (as its
examples/data_preprocess scripts write it), one row per response:

    data_source            str    "tokencredit/<task>"
    prompt                 list of {"role": "user", "content": <prompt text>} (one chat message)
    ability                str    the task (sql, instructions, tools)
    reward_model           {"style": "rule", "ground_truth": null}: the run directory does not hold
                           the task's reference; extra_info.group_id is the task record id to join
                           the prompt set on
    extra_info             {"index": row number, "response_id", "group_id",
                            "reward_names": list[str], "rewards": list[float] (the verifier scores)}
    response               str          the sampled response text
    prompt_token_ids       list[int32]  the prompt tokens as sampled (verl re-tokenizes `prompt`
                                        with the chat template; these are the exact ones)
    token_ids              list[int32]  the response tokens (T of them)
    token_level_advantages list[float]  per-token advantage of the chosen kind, T values, for
                                        trainers that take precomputed advantages

    import pyarrow.parquet as pq
    table = pq.read_table(dest_file)
    rows = table.to_pylist()   # rows[0]["token_level_advantages"] aligns with rows[0]["token_ids"]
"""
from __future__ import annotations

from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

from .query import connect
from .train import read_training

HF_FEATURES = datasets.Features({
    "prompt": datasets.Value("string"),
    "completion": datasets.Value("string"),
    "prompt_token_ids": datasets.Sequence(datasets.Value("int32")),
    "completion_token_ids": datasets.Sequence(datasets.Value("int32")),
    "weights": datasets.Sequence(datasets.Value("float32")),
    "advantages": datasets.Sequence(datasets.Value("float32")),
    "response_id": datasets.Value("string"),
    "task": datasets.Value("string"),
})

VERL_SCHEMA = pa.schema([
    pa.field("data_source", pa.string()),
    pa.field("prompt", pa.list_(pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())]))),
    pa.field("ability", pa.string()),
    pa.field("reward_model", pa.struct([pa.field("style", pa.string()), pa.field("ground_truth", pa.string())])),
    pa.field("extra_info", pa.struct([
        pa.field("index", pa.int64()), pa.field("response_id", pa.string()), pa.field("group_id", pa.string()),
        pa.field("reward_names", pa.list_(pa.string())), pa.field("rewards", pa.list_(pa.float32()))])),
    pa.field("response", pa.string()),
    pa.field("prompt_token_ids", pa.list_(pa.int32())),
    pa.field("token_ids", pa.list_(pa.int32())),
    pa.field("token_level_advantages", pa.list_(pa.float32())),
])


def export_hf(out_dir: str | Path, dest: str | Path, advantage: str = "mrtpo",
              allow_incomplete: bool = False) -> Path:
    """Save the run as a `datasets.Dataset` folder at `dest` (layout in the module docstring)."""
    rows = read_training(out_dir, advantage, allow_incomplete)
    ds = datasets.Dataset.from_dict({
        "prompt": [r["prompt"] for r in rows],
        "completion": [r["response"] for r in rows],
        "prompt_token_ids": [r["prompt_token_ids"] for r in rows],
        "completion_token_ids": [r["token_ids"] for r in rows],
        "weights": [r["sft_weight"] for r in rows],
        "advantages": [r["advantages"] for r in rows],
        "response_id": [r["response_id"] for r in rows],
        "task": [r["task"] for r in rows],
    }, features=HF_FEATURES)
    ds.save_to_disk(str(dest))
    return Path(dest)


def export_verl(out_dir: str | Path, dest_file: str | Path, advantage: str = "mrtpo",
                allow_incomplete: bool = False) -> Path:
    """Write the run as one verl-style Parquet file `dest_file` (layout in the module docstring)."""
    rows = read_training(out_dir, advantage, allow_incomplete)
    scores = {rid: (names, values) for rid, names, values in connect(out_dir, allow_incomplete=allow_incomplete).sql(
        "SELECT response_id, reward_names, rewards FROM responses WHERE status = 'ok'").fetchall()}
    records = []
    for index, r in enumerate(rows):
        names, values = scores[r["response_id"]]
        records.append({
            "data_source": f"tokencredit/{r['task']}",
            "prompt": [{"role": "user", "content": r["prompt"]}],
            "ability": r["task"],
            "reward_model": {"style": "rule", "ground_truth": None},
            "extra_info": {"index": index, "response_id": r["response_id"], "group_id": r["group_id"],
                           "reward_names": names, "rewards": values},
            "response": r["response"],
            "prompt_token_ids": r["prompt_token_ids"],
            "token_ids": r["token_ids"],
            "token_level_advantages": r["advantages"],
        })
    dest_file = Path(dest_file)
    dest_file.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records, schema=VERL_SCHEMA), dest_file)
    return dest_file
