"""Export a run's training view for other trainers: a Hugging Face dataset folder or verl Parquet.

Both read the DuckDB `training` view (responses with status 'ok', ordered by response_id, GDPO's
batch step over the whole run) and choose the advantage by name, as the trainer does: "gdpo",
"mrtpo", "p2t", "mc" or a mix such as "mrtpo:0.5,gdpo:0.5" (coefficient-weighted sum per token). Every
per-token list has one value per response token, aligned with the token ids.

Both use the dataset's own column names (README, "One vocabulary"): a response's text is `response`,
its tokens `token_ids`, their texts `token_texts`, the SFT weight `sft_weight`, the chosen advantage
`advantages`. Only where verl dictates a field (`data_source`, `prompt` as chat messages, `ability`,
`reward_model`, `extra_info`) does the verl export map to verl's names, in `verl_row`.

**export_hf(out_dir, dest)**: a `datasets` folder written by `save_to_disk`, with the same rows as one
Parquet file beside it (`dest/train.parquet`) and a `README.md` card, one row per response:

    prompt                str          the prompt text the response was sampled for (chat-rendered)
    response              str          the response text
    prompt_token_ids      list[int32]  the prompt as the policy saw it
    token_ids             list[int32]  the response tokens (T of them)
    token_texts           list[str]    each token's text, T values (null for a run without credits rows)
    sample_logprobs       list[float]  log-prob of each response token under the sampling policy
    sft_weight            list[float]  per-token SFT weight (the view's sft_weight), T values
    advantages            list[float]  per-token final advantage of the chosen kind (GDPO's batch step over
                                       the whole run applied, as the `training` view has it), T values
    reward_names          list[str]    the rewards, in the verifier's order
    rewards               list[float]  the verifier's score of each
    response_id, group_id, task  str

    import datasets
    ds = datasets.load_from_disk(dest)
    same = datasets.load_dataset("parquet", data_files=f"{dest}/train.parquet", split="train")
    row = ds[0]   # row["token_texts"], row["advantages"], row["sft_weight"] align with row["token_ids"]

**export_verl(out_dir, dest_file)**: one Parquet file in the layout of verl's RL datasets (as its
examples/data_preprocess scripts write it), one row per prompt with its n sampled responses:

    data_source       str    "tokencredit/<task>", which `tokencredit.pipeline.integrations.verl.compute_score` scores
    prompt            list of {"role": "user", "content": <the raw task prompt>}: verl applies the
                      chat template itself
    ability           str    the task (sql, instructions, tools, or a plugin verifier's task)
    reward_model      {"style": "rule", "ground_truth": str}: the reference SQL, or the JSON of the
                      reference tool calls or of the instruction constraints (of a plugin task: the
                      JSON of the record's own fields)
    extra_info        {"index": row number, "group_id": the task record id,
                       "record": the task record as one JSON line (what compute_score verifies against),
                       "verifiers": JSON list of the run's plugin verifiers for it (target, task, source_sha256),
                       "reward_keys": JSON list of every reward key in the file (compute_score's keys),
                       "verifier_bounds": JSON [seconds, bytes]: the run's --verifier-timeout and
                       --verifier-memory, which compute_score's plugin calls keep}
    prompt_token_ids  list[int32]         the prompt tokens as sampled
    response_id       list[str]           the n responses (ids, then per-response lists below)
    response          list[str]
    token_ids         list[list[int32]]
    sample_logprobs   list[list[float]]   behaviour log-probs, for clipped off-policy updates
    advantages        list[list[float]]   per-token advantage of the chosen kind
    reward_names      list[str]           the rewards, in the verifier's order
    rewards           list[list[float]]   each response's verifier scores

    import pyarrow.parquet as pq
    rows = pq.read_table(dest_file).to_pylist()
    first = rows[0]   # first["advantages"][j] aligns with first["token_ids"][j]
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

from tokencredit import verifiers
from tokencredit.schemas.records import TASKS, PluginSpec, SqlSpec, TaskRecord
from tokencredit.verifiers import isolation, plugins
from tokencredit.verifiers.plugins import PluginRef

from tokencredit.pipeline.dataset.query import connect
from tokencredit.pipeline.dataset.writer import RECORD_HASHES
from tokencredit.pipeline.identity import changed_record
from tokencredit.pipeline.dataset.training import read_training
from tokencredit.pipeline.dataset.writer import read_manifest

HF_FEATURES = datasets.Features({
    "prompt": datasets.Value("string"),
    "response": datasets.Value("string"),
    "prompt_token_ids": datasets.Sequence(datasets.Value("int32")),
    "token_ids": datasets.Sequence(datasets.Value("int32")),
    "token_texts": datasets.Sequence(datasets.Value("string")),
    "sample_logprobs": datasets.Sequence(datasets.Value("float32")),
    "sft_weight": datasets.Sequence(datasets.Value("float32")),
    "advantages": datasets.Sequence(datasets.Value("float32")),
    "reward_names": datasets.Sequence(datasets.Value("string")),
    "rewards": datasets.Sequence(datasets.Value("float32")),
    "response_id": datasets.Value("string"),
    "group_id": datasets.Value("string"),
    "task": datasets.Value("string"),
})

HF_CARD = """# tokencredit export

Responses of the tokencredit run `{run}` with per-token advantages (`{advantage}`), SFT weights, token
texts and sampling log-probs aligned with `token_ids`, and each response's rewards by name.
Load with `datasets.load_from_disk(<this folder>)`, or the Parquet copy with
`datasets.load_dataset("parquet", data_files="<this folder>/train.parquet", split="train")`.
"""

TOKEN_TEXTS_SQL = """
SELECT response_id, list(token_text ORDER BY position) AS texts
FROM (SELECT DISTINCT response_id, position, token_text FROM credits) GROUP BY response_id
"""

VERL_SCHEMA = pa.schema([
    pa.field("data_source", pa.string()),
    pa.field("prompt", pa.list_(pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())]))),
    pa.field("ability", pa.string()),
    pa.field("reward_model", pa.struct([pa.field("style", pa.string()), pa.field("ground_truth", pa.string())])),
    pa.field("extra_info", pa.struct([pa.field("index", pa.int64()), pa.field("group_id", pa.string()),
                                      pa.field("record", pa.string()), pa.field("verifiers", pa.string()),
                                      pa.field("reward_keys", pa.string()), pa.field("verifier_bounds", pa.string())])),
    pa.field("prompt_token_ids", pa.list_(pa.int32())),
    pa.field("response_id", pa.list_(pa.string())),
    pa.field("response", pa.list_(pa.string())),
    pa.field("token_ids", pa.list_(pa.list_(pa.int32()))),
    pa.field("sample_logprobs", pa.list_(pa.list_(pa.float32()))),
    pa.field("advantages", pa.list_(pa.list_(pa.float32()))),
    pa.field("reward_names", pa.list_(pa.string())),
    pa.field("rewards", pa.list_(pa.list_(pa.float32()))),
])


def export_hf(out_dir: str | Path, dest: str | Path, advantage: str = "mrtpo",
              allow_incomplete: bool = False) -> Path:
    """Write the run as a `save_to_disk` folder at `dest`, plus `dest/train.parquet` (module docstring)."""
    rows = read_training(out_dir, advantage, allow_incomplete)
    db = connect(out_dir, allow_incomplete=allow_incomplete)
    scores = {rid: (names, values) for rid, names, values in db.execute(
        "SELECT response_id, reward_names, rewards FROM responses WHERE status = 'ok'").fetchall()}
    texts = dict(db.execute(TOKEN_TEXTS_SQL).fetchall())
    ds = datasets.Dataset.from_dict({name: [row[name] for row in rows] for name in HF_FEATURES
                                     if name not in ("token_texts", "reward_names", "rewards")} | {
        "token_texts": [texts.get(r["response_id"]) for r in rows],
        "reward_names": [scores[r["response_id"]][0] for r in rows],
        "rewards": [scores[r["response_id"]][1] for r in rows],
    }, features=HF_FEATURES)
    dest = Path(dest)
    ds.save_to_disk(str(dest))
    ds.to_parquet(str(dest / "train.parquet"))
    (dest / "README.md").write_text(HF_CARD.format(run=Path(out_dir).name, advantage=advantage))
    return dest


def record_json(record: TaskRecord) -> dict:
    """A task record as its JSONL object (`tokencredit.verifiers.parse_record` reads it back): an SQL record's `db` is the
    file name and `databases` the folder it resolves in, since records may not name paths outside it; a
    plugin task's record is its own line."""
    if isinstance(record.spec, PluginSpec):
        return json.loads(json.dumps(record.spec.fields))
    spec = dataclasses.asdict(record.spec)
    if isinstance(record.spec, SqlSpec):
        db = Path(spec.pop("db_path"))
        spec = {"db": db.name, "databases": str(db.parent), **spec}
    line = {"id": record.id, "task": record.task, "prompt": record.prompt,
            "reference_response": record.reference_response, "split": record.split, **spec}
    return json.loads(json.dumps(line))  # tuples -> lists, as JSON has them


def record_from_json(obj: dict, plugin_tasks: tuple[str, ...] = ()) -> TaskRecord:
    """The task record of a `record_json` object; `plugin_tasks`: the tasks the run's plugins verify."""
    obj = dict(obj)
    return verifiers.parse_record(obj, 0, Path("."), databases=obj.pop("databases", None),
                                  plugin_tasks=plugin_tasks)


def ground_truth(record: TaskRecord) -> str:
    """What the verifier compares against: the reference SQL, or the JSON of the reference calls / constraints
    (of a plugin task's record, its fields besides id, task and prompt)."""
    spec = record_json(record)
    if record.task == "sql":
        return spec["reference_sql"]
    if isinstance(record.spec, PluginSpec):
        return json.dumps({k: v for k, v in spec.items() if k not in ("id", "task", "prompt")}, sort_keys=True)
    return json.dumps(spec["reference_calls" if record.task == "tools" else "constraints"], sort_keys=True)


def refs_json(refs: tuple[PluginRef, ...]) -> str:
    return json.dumps([dataclasses.asdict(ref) for ref in refs])


def refs_from_json(text: str | None) -> tuple[PluginRef, ...]:
    return tuple(PluginRef(**ref) for ref in json.loads(text or "[]"))


def _manifest_config(out_dir: str | Path) -> dict:
    return (read_manifest(str(out_dir)) or {}).get("config") or {}


def _check_unchanged(out_dir: str | Path, records: list[TaskRecord], prompts: str) -> None:
    """Refuse a record whose content differs from what the run annotated (a run from before record
    hashes were kept has none to check)."""
    path = Path(out_dir) / RECORD_HASHES
    changed = changed_record(json.loads(path.read_text()), records) if path.is_file() else None
    if changed is not None:
        raise ValueError(f"run dir {out_dir}: task record {changed!r} in {prompts} differs from the record the run "
                         f"annotated (edited since?); pass the prompt set the run read, or annotate it again")


def run_records(out_dir: str | Path, prompts: str | None = None
                ) -> tuple[dict[str, TaskRecord], list[verifiers.Rejected], tuple[PluginRef, ...]]:
    """The task records of a run by id, the rejected ones and the run's plugin verifiers (each
    importable with its recorded source, else PluginError): records from `prompts`, else from the
    prompt set its manifest names, read as the run read them (format, databases, semantics, columns).
    A record whose content differs from the one the run annotated is refused (ValueError naming it)."""
    config = _manifest_config(out_dir)
    refs = tuple(PluginRef(**ref) for ref in config.get("verifiers") or ())
    isolation.check_loadable(refs, _bounds(config)[1])  # in a worker, as annotate imports them
    if prompts is None and config.get("prompts") is None:
        raise ValueError(f"run dir {out_dir}: its manifest names no prompt set; pass prompts=")
    options = ({} if prompts is not None else
               {"format": config.get("format", "native"), "databases": config.get("databases"),
                "semantics": config.get("semantics"), "columns": dict(config.get("columns") or ())})
    records, rejected = verifiers.load_tasks(prompts or config["prompts"], plugin_tasks=plugins.tasks_of(refs),
                                             **options)
    _check_unchanged(out_dir, records, prompts or config["prompts"])
    return {r.id: r for r in records}, rejected, refs


def _bounds(config: dict) -> tuple[float, int]:
    """(seconds, bytes): the plugin verifiers' bounds the run was annotated with (`--verifier-timeout`,
    `--verifier-memory`), which every later call of its plugins keeps."""
    from tokencredit.pipeline.config import AnnotateConfig

    return (config.get("verifier_timeout_s") or AnnotateConfig.verifier_timeout_s,
            config.get("verifier_memory_bytes") or AnnotateConfig.verifier_memory_bytes)


def reward_names(records: Sequence[TaskRecord], refs: Sequence[PluginRef], timeout_s: float,
                 memory_bytes: int) -> set[str]:
    """The reward names of `records` (`verifiers.reward_names`), the plugins' from their scores of each record's
    reference response (or an empty one) in a worker process under the run's bounds; PluginError (one line)
    when a plugin fails on one."""
    names = {name for r in records if r.task in TASKS for name in verifiers.reward_names(r)}  # the built-in ones
    probed = [r for r in records if any(plugins.applies(ref, r) for ref in refs)]
    if probed:
        with isolation.VerifierPool(timeout_s, memory_bytes) as pool:
            found = pool.score_all([(r, r.reference_response or "") for r in probed], refs)
        for record, got in zip(probed, found):
            if isinstance(got, isolation.VerifierFailed):
                raise plugins.PluginError(f"record {record.id!r}: the verifiers failed on its reference response "
                                          f"(for the reward names): {got}")
            names |= {s.name for s in got}
    return names


def _missing_record(out_dir, group_id: str, response_id: str, prompts: str | None,
                    rejected: list[verifiers.Rejected]) -> ValueError:
    reasons = [r.reason for r in rejected if r.record_id == group_id]
    why = f": it was rejected there ({reasons[0]})" if reasons else ""
    return ValueError(f"run dir {out_dir}: response {response_id!r} answers task record {group_id!r}, which the "
                      f"prompt set {prompts or '(from the manifest)'} lacks{why}")


def export_verl(out_dir: str | Path, dest_file: str | Path, advantage: str = "mrtpo",
                prompts: str | None = None, allow_incomplete: bool = False) -> Path:
    """Write the run as one verl Parquet file `dest_file`, a row per prompt (layout in the module docstring).

    prompts: the task JSONL file or folder (default: the run's own prompt set, from its manifest).
    """
    rows = read_training(out_dir, advantage, allow_incomplete)
    records, rejected, refs = run_records(out_dir, prompts)
    scores = {rid: (names, values) for rid, names, values in connect(out_dir, allow_incomplete=allow_incomplete).execute(
        "SELECT response_id, reward_names, rewards FROM responses WHERE status = 'ok'").fetchall()}
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["group_id"], []).append(r)
    for group_id, members in groups.items():
        if group_id not in records:
            raise _missing_record(out_dir, group_id, members[0]["response_id"], prompts, rejected)
    applying = {g: tuple(ref for ref in refs if plugins.applies(ref, records[g])) for g in groups}
    # verl keeps compute_score's keys per response in one batch: every row returns the file's whole key set
    bounds = _bounds(_manifest_config(out_dir))
    keys = json.dumps(sorted(reward_names([records[g] for g in groups], refs, *bounds)))
    table = [verl_row(index, records[g], applying[g], members, scores, keys, bounds)
             for index, (g, members) in enumerate(groups.items())]
    dest_file = Path(dest_file)
    dest_file.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(table, schema=VERL_SCHEMA), dest_file)
    return dest_file


def verl_row(index: int, record: TaskRecord, applying: tuple[PluginRef, ...], members: list[dict],
             scores: dict[str, tuple[list[str], list[float]]], reward_keys: str,
             bounds: tuple[float, int] | None = None) -> dict:
    """One prompt's row of the verl export: the fields verl dictates, then the dataset's own columns as
    lists over the prompt's responses (`members`, rows of the training view)."""
    return {
        "data_source": f"tokencredit/{record.task}",
        "prompt": [{"role": "user", "content": record.prompt}],
        "ability": record.task,
        "reward_model": {"style": "rule", "ground_truth": ground_truth(record)},
        "extra_info": {"index": index, "group_id": record.id, "record": json.dumps(record_json(record)),
                       "verifiers": refs_json(applying), "reward_keys": reward_keys,
                       "verifier_bounds": json.dumps(bounds) if bounds else None},
        "prompt_token_ids": members[0]["prompt_token_ids"],
        **{name: [m[name] for m in members]
           for name in ("response_id", "response", "token_ids", "sample_logprobs", "advantages")},
        "reward_names": scores[members[0]["response_id"]][0],
        "rewards": [scores[m["response_id"]][1] for m in members],
    }
