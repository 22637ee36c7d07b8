"""The transformers sampler's speed: against Hugging Face `model.generate` on the same batch and settings,
tree-sampled groups against flat sampling, its default batch, and where each branch rule lands.

    python -m bench sampling [--quick] [-- [--model PATH]]

(a) One batch: demo prompts spread over the tasks x n samples, rendered as the sampler renders them,
    temperature 1, full vocabulary (top_p 1, no top-k), max_new_tokens, eos ends a row. tokencredit:
    `TransformersSampler.sample` (prompt rendering, token choice, raw log-probs, decoded responses).
    Hugging Face: `model.generate(do_sample=True, top_k=0)` on the left-padded rows with `output_logits`,
    then the same raw log-probs and decoded responses. Draws differ (each side's own RNG), so responses
    differ in length: the ratio is of seconds per generated token (eos included), medians of interleaved
    runs. Both the given model (default: SmolLM2-135M-Instruct, target <= 0.9x) and the shipped tiny
    policy are run; the model's ratio goes to bench/results/speed.json as `sampling_over_generate`. (Until commit
    3cfae4c it also timed `token_spans` and stop-string checks against the prefix decodes they replaced: a final
    study, its figures in its rows.)
On the given model (bench_tree.py measured these alone up to commit 6bbde98; figures: bench/results/tree.json):
(b) A 4 x 4 tree (`SamplingConfig(tree=(4, 4))`, the default branch) against 16 flat samples of the same demo
    prompts: same model, batch, threads and max_new_tokens, turns alternated in one run, medians. Target:
    tree / flat time <= 0.85. Prefilled and decoded tokens are counted both ways (the sampler's counters).
(c) Seconds per generated token of flat sampling at batch 16 ... 256 (the same prompts x 16 samples),
    alternated; `default_batch` is what `SamplingConfig()` (batch_size None) picks on this
    machine. Target: its time within 1.2x of the best batch's.
(d) Per branch rule (sentence, fraction:0.25, entropy:0.1): the share of roots that branch, where the branch
    lands (root tokens / leaf tokens), and the share of sibling leaves that differ.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from common import Harness, demo_records, interleaved_times
from registry import Target, benchmark

SMOLLM2 = "smollm2-135m-instruct"  # the registry's name (`tokencredit models pull smollm2-135m-instruct`)
TARGET, TARGET_TREE, TARGET_BATCH = 0.9, 0.85, 1.2
BATCHES = (16, 32, 64, 128, 256)
BRANCHES = ("sentence", "fraction:0.25", "entropy:0.1")


class GenerateRun:
    """`model.generate` on the sampler's rows, returning what the sampler returns: response ids,
    their raw log-probs and decoded text."""

    def __init__(self, sampler, records, config):
        from tokencredit.pipeline.sample.rows import render_prompt
        from tokencredit.pipeline.sample.transformers_backend import left_pad

        prompts = [render_prompt(sampler.tokenizer, r.prompt)[1] for r in records for _ in range(config.n)]
        self.ids, self.mask, _ = left_pad(prompts, sampler.pad_id)
        self.model, self.tokenizer, self.config = sampler.model, sampler.tokenizer, config
        self.eos, self.pad = sorted(sampler.eos_ids), sampler.pad_id

    @torch.inference_mode()
    def __call__(self) -> list[tuple[list[int], list[float], str]]:
        """Generate once; -> (response ids up to eos, their raw log-probs, decoded text) per row."""
        torch.manual_seed(0)
        out = self.model.generate(input_ids=self.ids, attention_mask=self.mask, do_sample=True, temperature=1.0,
                                  top_p=1.0, top_k=0, max_new_tokens=self.config.max_new_tokens,
                                  eos_token_id=self.eos, pad_token_id=self.pad, output_logits=True,
                                  return_dict_in_generate=True)
        new = out.sequences[:, self.ids.shape[1]:]
        logprobs = torch.log_softmax(torch.stack(out.logits, 1).float(), -1).gather(-1, new[..., None]).squeeze(-1)
        rows = []
        for row, row_logprobs in zip(new.tolist(), logprobs.tolist()):
            ends = [t for t, token in enumerate(row) if token in self.eos]
            length = ends[0] + 1 if ends else len(row)
            rows.append((row[:length], row_logprobs[:length],
                         self.tokenizer.decode(row[:length], skip_special_tokens=True)))
        return rows


def transformers_sampler(model: str | None):
    """The transformers backend's sampler of `model` (None: the shipped tiny policy), without progress bars."""
    from tokencredit.pipeline.sample import make_sampler

    sampler = make_sampler("transformers", model)
    sampler.progress = False
    return sampler


def compare(sampler, records, config, repeats: int) -> dict:
    """Seconds per generated token of both sides on one model, and the ratio."""
    generate = GenerateRun(sampler, records, config)
    counts = {"tokencredit": sum(len(s.token_ids) for s in sampler.sample(records, config)),
              "generate": sum(len(ids) for ids, _, _ in generate())}
    times = interleaved_times({"tokencredit": lambda: sampler.sample(records, config), "generate": generate},
                              repeats=repeats, warmup=0)
    per_token = {name: times[name] / counts[name] for name in times}
    return {"seconds": times, "tokens": counts, "per_token": per_token,
            "ratio": per_token["tokencredit"] / per_token["generate"]}


def counted(sampler, fn) -> tuple[int, int, list]:
    """(tokens prefilled, tokens decoded one step at a time, fn's samples)."""
    before = sampler.prefilled_tokens, sampler.decoded_tokens
    samples = fn()
    return sampler.prefilled_tokens - before[0], sampler.decoded_tokens - before[1], samples


def tree_vs_flat(sampler, records, max_new: int, batch: int, repeats: int) -> dict:
    from tokencredit.pipeline.config import SamplingConfig

    tree = SamplingConfig(tree=(4, 4), max_new_tokens=max_new, batch_size=batch)
    flat = SamplingConfig(n=16, max_new_tokens=max_new, batch_size=batch)
    runs = {"tree": lambda: sampler.sample(records, tree), "flat": lambda: sampler.sample(records, flat)}
    counts = {name: counted(sampler, fn) for name, fn in runs.items()}
    times = interleaved_times(runs, repeats=repeats)
    tokens = {name: sum(len(s.token_ids) for s in c[2]) for name, c in counts.items()}
    return {"tree_over_flat_time": times["tree"] / times["flat"], "tree_s": times["tree"], "flat_s": times["flat"],
            "prefill_tokens_tree": counts["tree"][0], "prefill_tokens_flat": counts["flat"][0],
            "decoded_tokens_tree": counts["tree"][1], "decoded_tokens_flat": counts["flat"][1],
            "response_tokens_tree": tokens["tree"], "response_tokens_flat": tokens["flat"]}


def batch_sweep(sampler, records, max_new: int, repeats: int) -> dict:
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.sample.rows import render_prompt

    longest = max(len(render_prompt(sampler.tokenizer, r.prompt)[1]) for r in records)
    default = sampler.batch_rows(SamplingConfig(max_new_tokens=max_new), longest)
    sizes = sorted({*BATCHES, default})
    configs = {b: SamplingConfig(n=16, max_new_tokens=max_new, batch_size=b) for b in sizes}
    tokens = {}

    def run(b):
        samples = sampler.sample(records, configs[b])
        tokens[b] = sum(len(s.token_ids) for s in samples)

    times = interleaved_times({b: (lambda b=b: run(b)) for b in sizes}, repeats=repeats)
    per_token = {b: times[b] / tokens[b] for b in sizes}
    best = min(per_token, key=per_token.get)
    return {"default_batch": default, "best_batch": best, "default_over_best": per_token[default] / per_token[best],
            "seconds_per_token": {str(b): t for b, t in per_token.items()}}


def branch_stats(sampler, records, max_new: int) -> dict:
    from tokencredit.pipeline.config import SamplingConfig

    stats = {}
    for branch in BRANCHES:
        samples = sampler.sample(records, SamplingConfig(tree=(4, 4), max_new_tokens=max_new, branch=branch,
                                                         batch_size=64))
        roots = [samples[i:i + 4] for i in range(0, len(samples), 4)]
        branched = [leaves for leaves in roots if leaves[0].segments[0].end < len(leaves[0].token_ids)]
        differ = [len({tuple(s.token_ids) for s in leaves}) > 1 for leaves in roots]
        stats[branch] = {
            "roots_branched": len(branched) / len(roots),
            "root_share_of_leaf": statistics.mean(s.segments[0].end / max(1, len(s.token_ids)) for s in samples),
            "root_tokens_mean": statistics.mean(s.segments[0].end for s in samples),
            "sibling_sets_that_differ": sum(differ) / len(differ)}
    return stats


@benchmark("sampling", measures="`TransformersSampler.sample` over `model.generate(do_sample=True, top_k=0, "
           "output_logits=True)` plus the same raw log-probs and decoded responses, same rows and settings: seconds per "
           "generated token (the draws, hence lengths, differ), medians of interleaved runs; SmolLM2 and the tiny "
           "policy. On SmolLM2: `sample_trees` 4 x 4 against 16 flat samples of the same demo prompts (same batch, "
           "threads, budget; alternated, medians); flat sampling's seconds per token at batch 16-256 against the auto "
           "default; where each branch rule lands.", results=("speed.json", "tree.json"),
           targets=(Target("sampling_over_generate", "<=", TARGET), Target("tree_over_flat_time", "<=", TARGET_TREE),
                    Target("default_over_best", "<=", TARGET_BATCH)))
def run(h: Harness) -> dict:
    from tokencredit.pipeline.config import SamplingConfig

    parser = argparse.ArgumentParser(prog="python -m bench sampling --")
    parser.add_argument("--model", default=None if h.quick else SMOLLM2,
                        help="local folder or pulled model name (default: SmolLM2; --quick: the tiny policy only)")
    model = parser.parse_args(h.argv).model
    prompts, max_new, h.repeats = (2, 8, 1) if h.quick else (8, 96, 3)
    config = SamplingConfig(n=2 if h.quick else 4, max_new_tokens=max_new, temperature=1.0, top_p=1.0, batch_size=32)
    records = demo_records(prompts)
    name, sampler = Path(model).name if model else "tiny policy", transformers_sampler(model)
    results = {name: compare(sampler, records, config, h.repeats)}
    if model:
        results["tiny policy"] = compare(transformers_sampler(None), records, config, h.repeats)
    figures = {"model": name, "rows": prompts * config.n, "max_new_tokens": max_new,
               "sampling_over_generate": round(results[name]["ratio"], 3)}
    for label, r in results.items():
        key = label.replace(" ", "_")
        figures |= {f"{key}_ms_per_token": round(r["per_token"]["tokencredit"] * 1e3, 2),
                    f"{key}_generate_ms_per_token": round(r["per_token"]["generate"] * 1e3, 2)}
    h.update_figures({"model": name, "sampling_over_generate": figures["sampling_over_generate"]})
    tree = tree_vs_flat(sampler, records, max_new, 64, h.repeats)
    # the sweep's 6 batch sizes cost 6x a flat run each: 8 prompts (128 rows, one batch of the largest) and 2 reps
    sweep = batch_sweep(sampler, records, max_new, min(h.repeats, 2))
    tree_figures = {**tree, **sweep, "branch_stats": branch_stats(sampler, records, max_new), "mode": h.mode}
    h.results("tree.json").write_text(json.dumps(tree_figures, indent=2, sort_keys=True) + "\n")
    return figures | tree_figures
