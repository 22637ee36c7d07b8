"""The verify stage against the same calls on one thread of this process (the stage before plugin
isolation), on the demo set, and the cost of isolation where it applies: a plugin-only task.

    python -m bench verify [--quick]

The demo set's prompts (16 per task, `--quick`: 4), sampled once by the shipped tiny policy with
annotate's default sampling, are verified shard by shard as annotate does (`verify_samples` per
shard of `AnnotateConfig.shard_size` prompts):
- stage: `verify_samples`: the built-in verifiers (all the demo set has) in this process, each
  response's awaited on a thread (`BoundedCaller`); plugins in a worker process
  (`tokencredit.verifiers.isolation`), which at each shard's end also ends what they started;
- inline: each `verifiers.verify` call in this process on one thread, awaited at most
  `verifier_timeout_s` (the stage before isolation).
The plugin-only case gives the same responses to records of a plugin task, scored by a small
plugin (`_PLUGIN`), so every call goes to the worker: the isolation's per-call cost.
Medians of interleaved repeats after one warm-up each, so the worker's start (once per annotate
process, timed on its own below) is not in a ratio. Both sides must give the same scores.
Target: stage / inline <= 1.2 on the demo set. Writes bench/results/verify.json and a bench/RESULTS.md row.
"""
from __future__ import annotations

import dataclasses
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import THREADS, Harness, model_paths
from registry import Target, benchmark

TARGET = 1.2
_PLUGIN = '''
def brevity(record, response):
    words = len(response.split())
    yield "brevity", float(words <= 60), "Answer in at most 60 words.", f"{words} words"
    yield "on_prompt", float(any(w in response.lower() for w in record["prompt"].lower().split()[:5])), \\
        "Use the prompt's words."
'''


@benchmark("verify", measures="Annotate's verify stage on the demo set (built-in verifiers in the annotate process, "
           "bounded on a thread; plugins in a worker process, bounded in time and memory) over the same calls on one "
           "thread; and a plugin-only task, every call in the worker, over the same calls inline.",
           results=("verify.json",), targets=(Target("isolated_over_inline", "<=", TARGET),))
def run(h: Harness) -> dict:
    from tokencredit import verifiers
    from tokencredit.pipeline.annotate import AnnotateConfig, load_models, load_prompt_set, shards_of, verify_samples
    from tokencredit.schemas.records import PluginSpec, TaskRecord
    from tokencredit.verifiers import isolation, plugins

    limit, h.repeats = (1, 1) if h.quick else (16, 5)
    policy, _, _ = model_paths()
    config = AnnotateConfig(limit=limit, model=policy, cpu_threads=THREADS)
    records, _ = load_prompt_set(config)
    by_id = {r.id: r for r in records}
    sampler = load_models(config).sampler
    shards = [sampler.sample(shard, config.sampling) for shard in shards_of(records, config.shard_size)]
    n = sum(map(len, shards))

    # the plugin-only case: the same prompts and responses, as records of a task only a plugin scores
    folder = tempfile.TemporaryDirectory()
    (Path(folder.name) / "brevity.py").write_text(_PLUGIN)
    refs = plugins.resolve([f"brief={Path(folder.name) / 'brevity.py'}:brevity"])
    brief_by_id = {r.id: TaskRecord(r.id, "brief", r.prompt, None, PluginSpec({"id": r.id, "task": "brief",
                                                                            "prompt": r.prompt}))
                   for r in records}
    brief_shards = [[dataclasses.replace(s, task="brief") for s in samples] for samples in shards]

    def stage(shards, by_id, refs=()):
        return [[v.rewards for v in verify_samples(samples, by_id, refs)] for samples in shards]

    def inline(shards, by_id, refs=()):  # each call on a thread and awaited with a timeout
        with ThreadPoolExecutor(max_workers=1) as thread:
            return [[thread.submit(verifiers.verify, by_id[s.group_id], s.response, refs).result(
                config.verifier_timeout_s) for s in samples] for samples in shards]

    start = time.perf_counter()
    stage(brief_shards, brief_by_id, refs)  # the first call starts the worker
    first = time.perf_counter() - start
    if stage(shards, by_id) != inline(shards, by_id) or \
            stage(brief_shards, brief_by_id, refs) != inline(brief_shards, brief_by_id, refs):
        raise RuntimeError("the verify stage and the inline calls gave different scores")
    t = h.interleaved_times({"stage": lambda: stage(shards, by_id), "inline": lambda: inline(shards, by_id),
                             "plugin_isolated": lambda: stage(brief_shards, brief_by_id, refs),
                             "plugin_inline": lambda: inline(brief_shards, brief_by_id, refs)}, repeats=h.repeats)
    isolation.close_workers()
    folder.cleanup()
    figures = {"isolated_over_inline": round(t["stage"] / t["inline"], 4), "isolated_s": round(t["stage"], 4),
               "inline_s": round(t["inline"], 4), "per_response_overhead_ms": round((t["stage"] - t["inline"]) / n * 1e3, 3),
               "plugin_only_isolated_over_inline": round(t["plugin_isolated"] / t["plugin_inline"], 4),
               "plugin_only_isolated_s": round(t["plugin_isolated"], 4),
               "plugin_only_inline_s": round(t["plugin_inline"], 4),
               "plugin_only_per_response_overhead_ms": round((t["plugin_isolated"] - t["plugin_inline"]) / n * 1e3, 3),
               "worker_start_s": round(first - t["plugin_isolated"], 3), "responses": n, "shards": len(shards),
               "mode": h.mode}
    h.update_figures(figures, "verify.json")
    return figures
