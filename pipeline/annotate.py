"""The annotate stage: prompt set -> shards -> sample -> verify -> credit -> Parquet.

`annotate_shard` is the unit of writing and resuming; `annotate_window` samples a window of consecutive shards in
one engine call (enough to fill the vllm engine's batch; one shard with transformers) and then annotates each.
`run_annotation` runs the windows in order in this process (the Prefect flow in `flows/annotate.py` runs the same
windows as tasks, locally or on Dask).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from tqdm.auto import tqdm

from tokencredit import verifiers
from tokencredit.schemas.records import AnnotatedResponse, RecordError, RewardScore, TaskRecord, VerifiedSample
from tokencredit.verifiers.isolation import VerifierFailed, VerifierPool, check_memory_bound, describe, timeout_reason
from tokencredit.verifiers.plugins import PluginRef, tasks_of

from tokencredit.pipeline.sample.bounds import BoundedCaller, CallAborted, CallTimeout, render_bounded
from tokencredit.pipeline.config import AnnotateConfig
from tokencredit.pipeline.credit.assign import assign_credit
from tokencredit.pipeline.sample import engine_starts, is_stopped, make_sampler
from tokencredit.pipeline.dataset.tables import credits_table, nodes_table, responses_table
from tokencredit.pipeline.dataset.writer import RECORD_HASHES, RunWriter, check_restartable, read_manifest, run_files
from tokencredit.pipeline.devices import worker_identity
from tokencredit.pipeline.identity import record_hashes, run_inputs
from tokencredit.pipeline.progress import Phase
from tokencredit.pipeline.timing import (ENGINE_STARTED, FIRST_SAMPLE, MODELS_LOADED, MODELS_LOADING, RUN_OPENED,
                                         SAMPLED, SECONDS, Stages, begin_run, mark, run_seconds)


@functools.lru_cache(maxsize=1)
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
    """The records to annotate and the rejected ones; a prompt too long for the model is rejected
    here, before any tensor is allocated for it, and so is a --tree whose one tree cannot fit in memory (with the
    transformers backend, which decodes a tree in one batch; vLLM schedules rows by the KV cache it has)."""
    if config.sampling.tree is not None and config.backend == "transformers":
        from tokencredit.pipeline.models.loading import DEFAULT_POLICY, resolve_model_path
        from tokencredit.pipeline.sample.tree import check_tree_fits

        model_config = json.loads((resolve_model_path(config.model, DEFAULT_POLICY) / "config.json").read_text())
        check_tree_fits(config.sampling, model_config, config.device)
    records, rejected = verifiers.load_tasks(
        config.prompts, config.format, databases=config.databases, semantics=config.semantics,
        columns=dict(config.columns), plugin_tasks=tasks_of(config.verifiers), check=prompt_fits(config))
    present = {r.task for r in records}
    # (a prompt set with no record at all is reported by prepare_run, its rejections naming the --verifier tasks)
    its_tasks = (f"(its tasks: {', '.join(sorted(present))}"
                 + (f"; {len(rejected)} records rejected" if rejected else "") + ")")
    unknown = [t for t in config.tasks or () if t not in present]
    if unknown and present:
        raise ValueError(f"the prompt set {config.prompts} has no record of tasks {','.join(unknown)} {its_tasks}")
    unused = [ref for ref in config.verifiers if ref.task is not None and ref.task not in present]
    if unused and present:  # a verifier that applies to no record is a typo in its task, not a choice
        raise ValueError(f"--verifier {unused[0].task}={unused[0].target}: the prompt set {config.prompts} has no "
                         f"record of task {unused[0].task!r} {its_tasks}")
    chosen, per_task = [], {}
    for record in records:
        if (config.tasks is not None and record.task not in config.tasks) or (config.split and record.split != config.split):
            continue
        per_task[record.task] = per_task.get(record.task, 0) + 1
        if config.limit is None or per_task[record.task] <= config.limit:
            chosen.append(record)
    return chosen, rejected


def prompt_fits(config: AnnotateConfig):
    """A load-time check: RecordError (field `prompt`) when the rendered prompt plus
    `max_new_tokens` does not fit the model's context (`max_position_embeddings`), or when the
    chat template refuses the record. The template renders under a time bound (`tokencredit.pipeline.sample.bounds`):
    one that runs past it, or that Jinja's sandbox refuses, stops the run (ValueError)."""
    from jinja2.exceptions import TemplateError

    from tokencredit.pipeline.models.loading import DEFAULT_POLICY, load_tokenizer, resolve_model_path

    model_config = json.loads((resolve_model_path(config.model, DEFAULT_POLICY) / "config.json").read_text())
    context = model_config.get("max_position_embeddings")
    if not context:
        return None
    tokenizer = load_tokenizer(config.model)
    budget = context - config.sampling.max_new_tokens

    def check(record: TaskRecord) -> None:
        if len(record.prompt) > budget * 64:  # past any tokenizer's chars-per-token: no need to tokenize it
            raise RecordError(record.id, "prompt", f"{len(record.prompt)} characters cannot fit the model's "
                              f"context of {context} tokens")
        try:
            n = len(render_bounded(tokenizer, record))
        except TemplateError as error:
            raise RecordError(record.id, "prompt", f"the chat template refused it ({error})") from None
        if n > budget:
            raise RecordError(record.id, "prompt", f"{n} tokens with the chat template; the model's context is "
                              f"{context} tokens and {config.sampling.max_new_tokens} are kept for the response")
    return check


def shards_of(records: Sequence[TaskRecord], shard_size: int) -> list[list[TaskRecord]]:
    return [list(records[i: i + shard_size]) for i in range(0, len(records), shard_size)]


@dataclass
class Models:
    sampler: Any
    policy: Any
    tokenizer: Any
    reward_model: Any = None
    reward_tokenizer: Any = None


_LOAD_LOCK = threading.Lock()
_PRELOAD_ERRORS: dict[tuple, BaseException] = {}  # what `preload_models` raised, by `_load_models`' arguments


def _models_key(config: AnnotateConfig) -> tuple:
    """`_load_models`' arguments for `config`."""
    p2t = "p2t" in config.credit.kinds
    return (config.backend, config.model, config.reward_model if p2t else None, config.device, p2t, config.dtype,
            config.cpu_threads)


def load_models(config: AnnotateConfig) -> Models:
    # One loader at a time: transformers builds models under a process-wide meta-device context,
    # so two threads loading at once get each other's empty (meta) weights.
    key = _models_key(config)
    with _LOAD_LOCK:
        if key in _PRELOAD_ERRORS:  # a second try would fail the same way, after as long
            raise _PRELOAD_ERRORS[key]
        models = _load_models(*key)
        if is_stopped(models.sampler):
            _load_models.cache_clear()
            models = _load_models(*key)
        return models


def preload_models(config: AnnotateConfig) -> None:
    """`load_models(config)` ahead of the run, on a thread of its own (`flows.cli` starts it before the inputs are
    checked); what it raises is kept, and the run's own `load_models` raises it."""
    try:
        load_models(config)
    except BaseException as error:  # noqa: BLE001 - raised again where the run asks for its models
        with _LOAD_LOCK:
            _PRELOAD_ERRORS[_models_key(config)] = error


@functools.lru_cache(maxsize=2)
def _load_models(backend: str, model: str | None, reward_model: str | None, device: str, p2t: bool,
                 dtype: str = "float32", threads: int | None = None) -> Models:
    """Load once per process (a Dask worker loads its own copy); sampling and replay share the policy."""
    from tokencredit.pipeline.credit.p2t import shares_vocab
    from tokencredit.pipeline.models.loading import load_policy, load_reward_model, model_name

    mark(MODELS_LOADING)
    # the vllm engine first: what it refuses (device, memory, model) is said before the replay's copy loads
    engine = None
    if backend == "vllm":
        engine = make_sampler(backend, model, device=device, dtype=dtype, threads=threads)
        mark(ENGINE_STARTED)
    with Phase(f"loading the policy {model_name(model)}" + (" and the reward model" if p2t else "")):
        policy, tokenizer = load_policy(model, device=device)
        # one copy of the weights for the transformers backend; the vllm engine loads its own, one per process
        sampler = engine or make_sampler(backend, model, device=device, policy=(policy, tokenizer))
        rm = rm_tokenizer = None
        if p2t:  # a reward model of another tokenizer reads the response text (p2t.attribute_across_tokenizers)
            rm, rm_tokenizer = load_reward_model(reward_model, device=device)
    if p2t and not shares_vocab(rm_tokenizer, tokenizer) and not rm_tokenizer.is_fast:
        raise ValueError(f"reward model {reward_model}: its tokenizer is not the policy's and not a fast tokenizer; "
                         "P2T carries its attribution to the policy's tokens by character offsets, which only a "
                         "fast tokenizer gives")
    mark(MODELS_LOADED)
    return Models(sampler, policy, tokenizer, rm, rm_tokenizer)


def verify_samples(samples, records: dict[str, TaskRecord], plugin_refs: Sequence[PluginRef] = (),
                   timeout_s: float = AnnotateConfig.verifier_timeout_s,
                   memory_bytes: int = AnnotateConfig.verifier_memory_bytes) -> list[VerifiedSample]:
    """The verify stage: each response's rewards as `verifiers.verify` gives them (built-in, then each
    plugin's). The built-in verifiers run in this process, each response's awaited at most `timeout_s`
    on a thread (`BoundedCaller`); the plugins run in a worker process (`tokencredit.verifiers.isolation`),
    each response's bounded by `timeout_s` and `memory_bytes`, and what they started ends with the batch.
    A verifier that raises, runs past its bounds, or (a plugin) exits or crashes on a response marks
    that response failed, never drops it nor stops the batch. GDPO normalizes reward k across a group,
    so a response whose reward names differ from those of its group's first verified response is
    marked failed too."""
    of = [records[sample.group_id] for sample in samples]
    scores = _builtin_scores(samples, of, plugin_refs, timeout_s)  # a response's rewards so far, or why it failed
    isolated = [i for i, got in enumerate(scores)
                if not isinstance(got, str) and any(verifiers.plugins.applies(ref, of[i]) for ref in plugin_refs)]
    if isolated:  # a run of built-in tasks alone starts no worker
        with VerifierPool(timeout_s, memory_bytes) as pool:
            found = pool.score_all([(of[i], samples[i].response) for i in isolated], plugin_refs)
        for i, more in zip(isolated, found):
            scores[i] = str(more) if isinstance(more, VerifierFailed) else scores[i] + more
    verified, names = [], {}
    for sample, record, got in zip(samples, of, scores):
        if not isinstance(got, str):
            try:
                got = verifiers.checked(record, sample.response, got)
            except verifiers.plugins.PluginError as error:
                got = describe(error)
        if isinstance(got, str):
            verified.append(VerifiedSample(sample, [], status=f"verifier_error: {got}"))
            continue
        reward_names = [s.name for s in got]
        if names.setdefault(sample.group_id, reward_names) != reward_names:
            verified.append(VerifiedSample(sample, [], status=(
                f"verifier_error: ValueError: reward names {reward_names} differ from {names[sample.group_id]} of "
                "another response of this record; a verifier must return the same names for every response")))
            continue
        verified.append(VerifiedSample(sample, got))
    return verified


def _builtin_scores(samples, of: Sequence[TaskRecord], plugin_refs: Sequence[PluginRef],
                    timeout_s: float) -> list[list[RewardScore] | str]:
    """Each response's built-in rewards, computed on a thread and awaited at most `timeout_s`, or the
    reason they failed (a record no verifier scores fails here, before any plugin runs)."""
    if any(record.task == "instructions" for record in of):
        verifiers.text.load()  # seconds of imports on first use, which no response's bound may count
    call, scores = BoundedCaller(timeout_s), []
    try:
        for sample, record in zip(samples, of):
            try:
                scores.append(call(_builtin_part, record, sample.response, plugin_refs))
            except CallTimeout:
                scores.append(timeout_reason(timeout_s))
            except Exception as error:  # noqa: BLE001 - a verifier bug must not lose the batch
                scores.append(str(error) if isinstance(error, CallAborted) else describe(error))
    finally:
        call.close()
    return scores


def _builtin_part(record: TaskRecord, response: str, plugin_refs: Sequence[PluginRef]) -> list[RewardScore]:
    verifiers.applying_plugins(record, plugin_refs)  # RecordError first, as `verifiers.verify` raises it
    return verifiers.builtin_scores(record, response)


def failure_line(record_id: str, status: str) -> str:
    """One failed response as a warning names it: "record 'h2': RuntimeError: ... (raised by verifier X)"."""
    return f"record {record_id!r}: {status.removeprefix('verifier_error: ')}"


def check_first_shard(responses: pa.Table, shard: int, out: str) -> None:
    """RuntimeError (one line) when every response of a task in `responses`, the first shard this
    run annotated, is a verifier_error: a verifier that fails on every call would fail the same way
    on every shard, after all their sampling. The shard stays written, for its status column."""
    rows = responses.select(["task", "group_id", "status"]).to_pylist()
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        if all(r["status"] != "ok" for r in mine):
            raise RuntimeError(f"every one of {len(mine)} responses of task {task!r} in shard {shard} is a "
                               f"verifier_error, the first {failure_line(mine[0]['group_id'], mine[0]['status'])}; "
                               f"stopped after that shard: fix the verifier (or --verifier-timeout/--verifier-memory) "
                               f"and start a new run (the status column: tokencredit query {out} \"select status "
                               f"from responses limit 5\")")


def use_cpu_threads(config: AnnotateConfig) -> None:
    """Fix torch's thread count before a model runs: it changes the last bits of every log-prob."""
    if config.device == "cpu":
        torch.set_num_threads(config.cpu_threads)


def windows_of(n_shards: int, config: AnnotateConfig) -> list[list[int]]:
    """The shards sampled together (`engine_loop.shard_windows`): with the vllm backend as many as fill the
    engine's batch (`config.engine_batch`, else the device's), with transformers one."""
    from tokencredit.pipeline.sample.engine_loop import shard_windows

    return shard_windows(n_shards, config.shard_size * config.sampling.n, config.backend, config.device,
                         config.engine_batch)


def annotate_window(shards: Sequence[Sequence[TaskRecord]], window: Sequence[int], config: AnnotateConfig,
                    models: Models, writer: RunWriter) -> list[dict[str, Any]]:
    """Sample the shards of `window` in one call, then verify, credit and write each one not yet written; returns
    each shard's marker entry. A window partly written is sampled whole (its written shards too): its requests are
    then batched as in the uninterrupted run."""
    todo = [s for s in window if not writer.is_complete(s)]
    if todo:
        use_cpu_threads(config)
        samples: dict[str, list] = {}
        mark(FIRST_SAMPLE)
        begin = time.perf_counter()
        for sample in models.sampler.sample([r for s in window for r in shards[s]], config.sampling):
            samples.setdefault(sample.group_id, []).append(sample)
        share = (time.perf_counter() - begin) / len(todo)  # the window's call, counted once over its new shards
        mark(SAMPLED)
        for s in todo:
            tables, stats = annotate_shard(shards[s], s, config, models, sample_seconds=share,
                                           samples=[x for r in shards[s] for x in samples.get(r.id, [])])
            writer.write_shard(s, tables, stats, code_version=code_version(), worker=worker_identity(engine_starts()))
    return [writer.shard_entry(s) for s in window]


def annotate_shard(records: Sequence[TaskRecord], shard: int, config: AnnotateConfig,
                   models: Models, samples: Sequence | None = None,
                   sample_seconds: float | None = None) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """sample -> verify -> credit for one shard; returns its tables and stats (`seconds`: each stage's wall
    time, `pipeline.timing`). `samples`: the shard's responses, already sampled (`annotate_window`), which took
    `sample_seconds` of its sampling call."""
    use_cpu_threads(config)
    by_id = {r.id: r for r in records}
    stages = Stages()
    if samples is None:
        mark(FIRST_SAMPLE)
        with stages("sample"):
            samples = models.sampler.sample(records, config.sampling)
        mark(SAMPLED)
    else:
        samples, stages.seconds["sample"] = list(samples), round(sample_seconds or 0.0, 3)
    with stages("verify"):
        verified = verify_samples(samples, by_id, config.verifiers, config.verifier_timeout_s,
                                  config.verifier_memory_bytes)
    annotated, stats = assign_credit(verified, by_id, config.credit, models.policy, models.tokenizer,
                                     models.reward_model, reward_tokenizer=models.reward_tokenizer,
                                     replay_engine=replay_engine(models))
    stats[SECONDS] = {**stages.seconds, **stats.get(SECONDS, {})}
    return shard_tables(annotated, by_id, shard, models.tokenizer), stats


def replay_engine(models: Models):
    """The sampler that replays MRTPO's log-prob relevance through its engine (`engine_replay`): a vLLM one."""
    return models.sampler if getattr(models.sampler, "llm", None) is not None else None


def shard_tables(annotated: Sequence[AnnotatedResponse], records: dict[str, TaskRecord], shard: int,
                 tokenizer) -> dict[str, pa.Table]:
    """The Parquet tables of one shard's annotated responses, by table name."""
    return {"responses": responses_table(annotated, shard), "credits": credits_table(annotated, records, tokenizer),
            "nodes": nodes_table(annotated, shard)}


def write_rejected(writer: RunWriter, rejected: Sequence[verifiers.Rejected]) -> None:
    writer.write_file("rejected.jsonl", "".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in rejected).encode())


def check_inputs(config: AnnotateConfig, out: str, restart: bool = False) -> tuple[list[TaskRecord],
                                                                                   list[verifiers.Rejected]]:
    """Raise the user errors a run would hit before any model loads (or Prefect starts): no prompt
    file or model folder, a chat template that the sandbox refuses or that hangs, a task with no
    record, a live writer in `out`, and (unless `restart`) another config or changed inputs there, a
    --verifier-memory above the hard `ulimit -d`. Returns the records to annotate and the rejected ones (with no
    record left the run writes rejected.jsonl and stops: `prepare_run`)."""
    if config.verifiers:
        check_memory_bound(config.verifier_memory_bytes)
    records, rejected = load_prompt_set(config)
    if restart:
        check_restartable(out)
    writer = RunWriter(out)
    if not restart:
        writer.check_config(config.digest(), run_inputs(config, records))
    writer.check_unlocked()
    return records, rejected


def complete_run(config: AnnotateConfig, out: str) -> dict[str, Any] | None:
    """The manifest of the run `out` holds when a rerun of `config` would write nothing: complete, of this config,
    and every shard's files as they were written (`check_inputs` has checked the run's inputs); else None."""
    manifest = read_manifest(out) or {}  # read first: a RunWriter makes the run's folders
    if not manifest.get("complete") or manifest.get("config_hash") != config.digest():
        return None
    try:
        RunWriter(out).checked_shards(manifest["n_shards"])
        run_files(out, stamp=False)  # the manifest's shard list and parts as a reader checks them
    except (RuntimeError, ValueError):  # a shard to write again, or a manifest to write again: the rerun resumes
        return None
    return manifest


def rejection_lines(rejected: Sequence[verifiers.Rejected], shown: int = 3) -> list[str]:
    """The first `shown` rejections as 'file line N, field F: reason' lines, and how many more."""
    lines = []
    for r in rejected[:shown]:
        where = f"{Path(r.path).name} line {r.line_no}" if r.line_no is not None else f"record {r.record_id!r}"
        field = f", field {r.field!r}" if r.field and r.field != "<line>" else ""  # "<line>": the line is unreadable
        lines.append(f"  {where}{field}: {_reason(r)}")
    if len(rejected) > shown:
        lines.append(f"  ... and {len(rejected) - shown} more")
    return lines


def _reason(r: verifiers.Rejected) -> str:
    record_id = r.record_id if r.record_id is not None else f"line {r.line_no}"  # an unreadable line's RecordError
    prefix = f"record {record_id!r}: field {r.field!r}: "  # RecordError's own wording, said once above
    return r.reason[len(prefix):] if r.reason.startswith(prefix) else r.reason


def prepare_run(config: AnnotateConfig, out: str, run_id: str | None = None, restart: bool = False):
    """Load the prompt set (records that do not fit the model are rejected there), lock `out`,
    record the run in the manifest, clean up what a crash left there, write rejected records.
    `restart`: first delete the run `out` holds (`open_run`).

    Returns (writer, shards, rejected); the writer holds the lock on `out` until `writer.unlock()`.
    """
    records, rejected = load_prompt_set(config)
    chosen = (f" of tasks {','.join(config.tasks)}" if config.tasks else "") + (f" in split {config.split}" if config.split else "")
    if not records and not rejected:
        raise ValueError(f"the prompt set {config.prompts} has no record{chosen} to annotate")
    shards = shards_of(records, config.shard_size)
    writer = open_run(config, out, records, len(shards), rejected, run_id, restart)
    if not records:
        writer.unlock()
        raise ValueError(f"no prompt record{chosen} to annotate: {len(rejected)} rejected, see {out}/rejected.jsonl")
    return writer, shards, rejected


def open_run(config: AnnotateConfig, out: str, records: Sequence[TaskRecord], n_shards: int,
             rejected: Sequence[verifiers.Rejected], run_id: str | None = None, restart: bool = False) -> RunWriter:
    """Lock `out`, record the run (config, input checksums, record hashes), clean up what a crash left
    there, write the rejected records. A run of another config or of changed inputs in `out` is
    refused, or deleted first with `restart` (only a run: a folder of other files is refused, `check_restartable`).
    The writer holds the lock on `out` until `writer.unlock()`."""
    if restart:
        check_restartable(out)
    begin_run(out)
    mark(RUN_OPENED)
    writer = RunWriter(out)
    writer.lock()
    try:
        if restart:
            writer.clear()
        writer.start(run_id or config.digest()[:12], config.to_dict(), config.digest(), code_version(),
                     n_shards=n_shards, seeds={"sampling": config.sampling.seed}, inputs=run_inputs(config, records))
        writer.write_file(RECORD_HASHES, json.dumps(record_hashes(records), sort_keys=True).encode())
        redo = writer.resume_check(n_shards)
        if redo:
            print(f"{out}: the files of shards {redo} differ from their checksums; writing them again",
                  file=sys.stderr)
        write_rejected(writer, rejected)
    except BaseException:
        writer.unlock()
        raise
    return writer


def finish_run(writer: RunWriter, n_shards: int, rejected: Sequence[verifiers.Rejected]) -> dict[str, Any]:
    """After the last shard: the manifest, with GDPO's batch scale c and shift m over the whole run
    (the views apply them; recorded for provenance). Raises, naming the shards to resume, if one is missing or
    its files changed since they were written (before DuckDB reads them)."""
    from tokencredit.pipeline.dataset.query import connect

    entries = writer.checked_shards(n_shards, stamp=True)
    scale, shift = connect(writer.out, allow_incomplete=True).execute(
        "SELECT any_value(gdpo_scale), any_value(gdpo_shift) FROM responses").fetchone()
    return writer.finish(n_shards, {"rejected": len(rejected), "gdpo_batch": {"scale": scale, "shift": shift},
                                    "run_seconds": run_seconds(writer.out)}, entries)


def read_responses(writer: RunWriter, entry: dict[str, Any]) -> pa.Table:
    """The responses part a shard's marker entry names (what `check_first_shard` reads)."""
    import pyarrow.parquet as pq

    return pq.read_table(f"{writer.root}/{entry['responses']['path']}", filesystem=writer.fs,
                         columns=["task", "group_id", "status"])


def shard_bar(progress: bool) -> bool:
    """A shards bar only on a terminal: elsewhere tqdm writes each refresh as one more line, the final
    one twice, beside the sampling and replay progress lines that already say how far a shard is."""
    return progress and sys.stderr.isatty()


def run_annotation(config: AnnotateConfig, out: str, run_id: str | None = None,
                   progress: bool = True, restart: bool = False) -> dict[str, Any]:
    """Annotate every shard not yet written under `out`, in this process; returns the manifest.
    `restart`: delete the run `out` holds first (a run of another config or of changed inputs)."""
    writer, shards, rejected = prepare_run(config, out, run_id, restart)
    try:
        todo = [w for w in windows_of(len(shards), config) if not all(map(writer.is_complete, w))]
        models = load_models(config) if todo else None
        for window in tqdm(todo, desc="shard windows", unit="window", disable=not shard_bar(progress)):
            new = [s for s in window if not writer.is_complete(s)]
            entries = annotate_window(shards, window, config, models, writer)
            if window is todo[0]:
                entry = next(e for e in entries if e["shard"] == new[0])
                check_first_shard(read_responses(writer, entry), new[0], out)
        return finish_run(writer, len(shards), rejected)
    finally:
        writer.unlock()
