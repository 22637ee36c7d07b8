"""The verifiers' cost: the verify stage against the same calls on one thread of this process (the stage before
plugin isolation), on the demo set, and the cost of isolation where it applies: a plugin-only task; then the
built-in verifiers on hostile 2 MB responses.

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

Hostile inputs (`verifier_inputs_*` in bench/results/speed.json): the worst time of `verify` (the bounded call) and
of `response_parts` (which the credits table calls outside it) over 2 MB responses of every shape (--quick: a
tenth), median of 3 each (--quick: 1). Tool calls: unclosed, nested and stray tags (the old lazy regex took 87.6 s
on 12,000 unclosed tags, 132 KB), one huge argument, deep nesting, a huge integer, 83,333 blocks. Instructions: 2 MB
of "A. " under `sentence_count` (666,666 Punkt sentences: ~20 s if all were found). Target: under 1 s each.
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import THREADS, Harness, model_paths
from registry import Target, benchmark

TARGET, TARGET_HOSTILE_S = 1.2, 1.0
HOSTILE_CHARS = 2_000_000  # characters of a hostile response (--quick: a tenth)
WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"]}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
_PLUGIN = '''
def brevity(record, response):
    words = len(response.split())
    yield "brevity", float(words <= 60), "Answer in at most 60 words.", f"{words} words"
    yield "on_prompt", float(any(w in response.lower() for w in record["prompt"].lower().split()[:5])), \\
        "Use the prompt's words."
'''


def tool_shapes(size: int) -> dict[str, str]:
    def call(value: str) -> str:
        return '<tool_call>{"name": "get_weather", "arguments": {"city": ' + value + "}}</tool_call>"
    return {
        "unclosed tags": "<tool_call>" * (size // 11),
        "unclosed tags with text": "<tool_call>x" * (size // 12),
        "closing tags": "</tool_call>" * (size // 12),
        "nested tags": "<tool_call>" * (size // 30) + CALL + "</tool_call>" * (size // 30),
        "huge string": call(json.dumps("a" * size)),
        "deep nesting": call("[" * (size // 2) + "]" * (size // 2)),
        "huge integer": call("9" * size),
        f"{size // 24:,} bad blocks": "<tool_call>{</tool_call>" * (size // 24),
        f"{size // len(CALL):,} good blocks": CALL * (size // len(CALL)),
    }


def hostile(h: Harness) -> dict:
    """The worst `verify` and `response_parts` seconds over the hostile shapes (their keys into speed.json)."""
    from tokencredit import verifiers
    from tokencredit.schemas.records import Constraint, InstructionSpec, TaskRecord, ToolCall, ToolSpec

    repeats, size = (1, HOSTILE_CHARS // 10) if h.quick else (3, HOSTILE_CHARS)
    tools = TaskRecord("t", "tools", "p", None, ToolSpec((WEATHER,), (ToolCall("get_weather", {"city": "Paris"}),)))
    sentences = TaskRecord("i", "instructions", "p", None,
                           InstructionSpec((Constraint("sentence_count", {"min": 2, "max": 3}),)))
    cases = [(tools, name, text) for name, text in tool_shapes(size).items()]
    cases.append((sentences, '"A. " under sentence_count', "A. " * (size // 3)))
    verify_s, parts_s = {}, {}
    for record, name, text in cases:
        verify_s[name] = h.median_time(lambda: verifiers.verify(record, text), repeats)[0]
        parts_s[name] = h.median_time(lambda: verifiers.response_parts(record, text), repeats)[0]
    worst_verify, worst_parts = max(verify_s, key=verify_s.get), max(parts_s, key=parts_s.get)
    figures = {"verifier_inputs_worst_verify_s": round(verify_s[worst_verify], 4),
               "verifier_inputs_worst_parts_s": round(parts_s[worst_parts], 4)}
    h.update_figures(figures)
    return figures | {"shapes": len(cases), "worst_verify_shape": worst_verify, "worst_parts_shape": worst_parts}


@benchmark("verify", measures="Annotate's verify stage on the demo set (built-in verifiers in the annotate process, "
           "bounded on a thread; plugins in a worker process, bounded in time and memory) over the same calls on one "
           "thread; a plugin-only task, every call in the worker, over the same calls inline; and the built-in "
           "verifiers on 2 MB responses of every shape: the worst `verify` and `response_parts` (called by the "
           "credits table) time. The lazy tool-call regex this replaced took 87.6 s on 12,000 unclosed tags (132 KB).",
           results=("verify.json", "speed.json"),
           targets=(Target("isolated_over_inline", "<=", TARGET),
                    Target("verifier_inputs_worst_verify_s", "<", TARGET_HOSTILE_S),
                    Target("verifier_inputs_worst_parts_s", "<", TARGET_HOSTILE_S)))
def run(h: Harness) -> dict:
    return stage_over_inline(h) | hostile(h)


def stage_over_inline(h: Harness) -> dict:
    """The verify stage over the inline calls, on the demo set and on a plugin-only task (verify.json)."""
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
