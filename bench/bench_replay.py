"""The replay's cost (MRTPO credit) against what it could cost: sampling, plain forwards, the matmul roofline, memory;
and P2T's attribution against the reward model's plain forward.

    python -m bench replay [--quick] [-- --profile]
    python -m bench replay -- --model PATH [--max-new-tokens 256]

On the tiny policy and the demo prompts:
(a) replay time (build P_all / P_\\k, `replay_distances`, with gating from the real verifier scores)
    over the time of sampling the same responses; also with every pair replayed (no gating);
(b) `replay_distances` over one plain teacher-forced forward `model(ids, attention_mask)` of the
    same sequences in the same batch size (the ceiling; both normalized per replayed token), every
    pair replayed; target within 1.25x;
(c) `run_annotation` with credit ("gdpo", "mrtpo") over ("gdpo",), same prompts; target within 1.15x.
Timings are medians of interleaved repeats. `--profile` (or a missed target (b)) prints a cProfile of one replay.
On SmolLM2-135M-Instruct (the tiny policy with --quick):
(d) roofline: float32 matmul FLOP/s of this machine's torch threads (the best of square GEMMs), and the model
    FLOPs of the tokens the replay of the localization cases forwards (2 x non-embedding parameters per token,
    attention 4 x layers x hidden x context, the LM head at the response positions) per second, over it; target
    0.8; beside it, the FLOP/s of the model's own matmul shapes (its Linear layers and head at 2048 tokens);
(e) peak extra memory (RSS, in a fresh process) of `replay` with a config-built Llama of vocabulary 152,064
    (Qwen2's), batch 16, T = 4096 response tokens: target <= 2 GiB (a [16, 4096, 152064] float32 logits tensor,
    which the replay never builds, would be 37 GiB).
`replay_roofline_fraction` and `replay_peak_mib_T4096` go to bench/results/speed.json.
(f) P2T on the shipped tiny reward model: `p2t.attribute` (one forward + one backward) over a plain forward, on
    demo prompts in the sampling layout and their reference responses, tokenized with the reward model's tokenizer,
    in the same right-padded batches (longest first, as `attribute` orders them), 7 interleaved repeats (--quick:
    2); target within 3.5x (`bench_p2t.py` measured it alone up to commit 6bbde98).

With `--model`, (c) only, with a local policy at realistic lengths (SmolLM2-135M-Instruct: target within 1.10x),
recorded as `mrtpo_over_gdpo` in bench/results/speed.json.
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

from common import THREADS, Harness, demo_records, interleaved_times, median_time, model_paths, padded_forward, \
    peak_extra_bytes
from registry import Target, benchmark

TARGET_FORWARD = 1.25
TARGET_ANNOTATION = 1.15
TARGET_MODEL_ANNOTATION = 1.10
TARGET_FRACTION, TARGET_PEAK = 0.8, 2 * 2**30
TARGET_P2T = 3.5


def replay_items(tokenizer, verified, records, gate: bool):
    """ReplayItems of the ok responses; gate=False replays every (response, reward) pair."""
    from tokencredit.pipeline.credit.advantages import group_has_variance
    from tokencredit.pipeline.credit.assign import reward_tensors
    from tokencredit.pipeline.credit.replay import build_replay_item

    ok = [v for v in verified if v.status == "ok"]
    rewards, mask, group = reward_tensors(ok)
    ungated = group_has_variance(rewards, mask, group) if gate else mask
    return [build_replay_item(tokenizer, records[v.sample.group_id].prompt, [(r.name, r.feedback) for r in v.rewards],
                              v.sample.token_ids, ungated[i, :len(v.rewards)].tolist()) for i, v in enumerate(ok)]


def replayed_sequences(items) -> list[list[int]]:
    """Every prompt + response sequence `replay_distances` forwards (P_all once, each ungated P_\\k)."""
    seqs = []
    for it in items:
        drops = [p for p in it.drop_prompt_ids if p is not None and p != it.all_prompt_ids]
        if drops and it.response_ids:
            seqs += [p + it.response_ids for p in [it.all_prompt_ids, *drops]]
    return seqs


def profile(fn, top: int = 18) -> str:
    prof = cProfile.Profile()
    prof.runcall(fn)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def annotation_ratio(policy_path, rm_path, limit: int, repeats: int,
                     max_new_tokens: int = 96) -> tuple[dict[str, float], dict]:
    """Median seconds of run_annotation with and without MRTPO, and the MRTPO run's manifest stats."""
    from tokencredit.pipeline.annotate import AnnotateConfig, load_models, run_annotation
    from tokencredit.pipeline.credit.assign import CreditConfig
    from tokencredit.pipeline.config import SamplingConfig

    base = AnnotateConfig(limit=limit, model=policy_path, reward_model=rm_path, cpu_threads=THREADS,
                          sampling=SamplingConfig(max_new_tokens=max_new_tokens))
    configs = {"gdpo+mrtpo": dataclasses.replace(base, credit=CreditConfig(kinds=("gdpo", "mrtpo"))),
               "gdpo": dataclasses.replace(base, credit=CreditConfig(kinds=("gdpo",)))}
    load_models(configs["gdpo"])  # cached per process: keep the one-off model load out of the timing
    manifests = {}

    def run(name: str) -> None:
        out = tempfile.mkdtemp(prefix="bench_replay_", dir="/tmp")
        try:
            manifests[name] = run_annotation(configs[name], out, progress=False)
            token_ids = pq.read_table(f"{out}/responses", columns=["token_ids"]).column("token_ids")
            manifests[name]["sampled_tokens"] = sum(len(t) for t in token_ids.to_pylist())
        finally:
            shutil.rmtree(out, ignore_errors=True)

    times = interleaved_times({name: (lambda name=name: run(name)) for name in configs}, repeats=repeats, warmup=0)
    return times, manifests["gdpo+mrtpo"]


def best_seconds(fn, repeats: int) -> float:
    """Fastest of `repeats` timed calls after one warm-up call."""
    return min(median_time(fn, repeats=repeats, warmup=1)[1])


def matmul_roofline(size: int = 2048, repeats: int = 10) -> float:
    """Best float32 GEMM FLOP/s over square sizes up to `size`."""
    best = 0.0
    for n in (size // 2, size):
        a, b = torch.randn(n, n), torch.randn(n, n)
        best = max(best, 2 * n**3 / best_seconds(lambda: a @ b, repeats))
    return best


def model_gemm_rate(model, rows: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of the model's own matmuls (each distinct Linear shape of a layer and the LM head, `rows`
    tokens, weighted by their FLOPs): what the replay's matmuls can reach here, as against square GEMMs."""
    shapes = {}
    for module in [*model.model.layers[0].modules(), model.get_output_embeddings()]:
        if isinstance(module, torch.nn.Linear):
            shapes[tuple(module.weight.shape)] = shapes.get(tuple(module.weight.shape), 0) + 1
    flops = seconds = 0.0
    for (out_features, in_features), count in shapes.items():
        x, w = torch.randn(rows, in_features), torch.randn(out_features, in_features)
        flops += count * 2 * rows * in_features * out_features
        seconds += count * best_seconds(lambda: x @ w.T, repeats)
    return flops / seconds


def replay_flops(model, items) -> float:
    """Model FLOPs of what `replay` forwards: each P_all with its response, each P_\\k from its first token
    that differs from P_all (the cached part is not recomputed), the LM head at the response positions."""
    from tokencredit.pipeline.credit.replay import _common_length

    config = model.config
    embed = model.get_input_embeddings().weight.numel()
    per_token = 2 * (sum(p.numel() for p in model.parameters()) - embed)  # the head is tied: counted below
    attention = 4 * config.num_hidden_layers * config.hidden_size  # QK^T and AV per context position
    head = 2 * config.hidden_size * config.vocab_size
    flops = 0.0
    for it in items:
        T = len(it.response_ids)
        sequences = [(0, it.all_prompt_ids)] + [(_common_length(it.all_prompt_ids, d), d)
                                                for d in it.drop_prompt_ids if d is not None]
        for start, prompt in sequences:
            end = len(prompt) + T
            flops += per_token * (end - start) + attention * sum(range(start + 1, end + 1)) + head * T
    return flops


def roofline_fraction(model_name: str | None, roofline: float, limit: int | None) -> dict:
    """The replay of `limit` localization cases (None: all) by `model_name` (None: the tiny policy): model FLOP/s
    over `roofline`, and the rate of the model's own matmul shapes."""
    from tokencredit import verifiers  # noqa: F401
    from bench_localization import _item, load_cases

    from tokencredit.pipeline.models.loading import load_policy
    from tokencredit.pipeline.credit.replay import ReplayStats, replay

    model, tokenizer = load_policy(model_name)
    items = [_item(tokenizer, c, "drop", "auto")[0] for c in load_cases()[:limit]]
    replay(model, items[:2])  # warm-up
    stats = ReplayStats()
    start = time.perf_counter()
    replay(model, items, batch_size=16, stats=stats)
    seconds = time.perf_counter() - start
    flops = replay_flops(model, items)
    return {"items": len(items), "seconds": seconds, "tokens_forwarded": stats.tokens_forwarded,
            "replay_flops_per_s": flops / seconds, "fraction": flops / seconds / roofline,
            "model_gemm": model_gemm_rate(model)}


def peak_memory(T: int, batch: int, vocab: int = 152_064) -> int:
    """Peak extra RSS of replaying `batch` responses of T tokens with a config-built Llama of `vocab`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tokencredit.pipeline.credit.replay import ReplayItem, replay

    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T + 256)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(10, vocab, (n,), generator=g).tolist()  # noqa: E731
    prompt = ids(48)
    items = [ReplayItem(prompt + ids(16) + ids(16), [prompt + ids(16)], ids(T)) for _ in range(batch)]
    peak, _ = peak_extra_bytes(lambda: replay(model, items, batch_size=batch))
    return peak


def model_annotation_ratio(h: Harness, model_path: str, max_new_tokens: int) -> dict:
    """(c) with a local policy: MRTPO + GDPO annotation over GDPO-only annotation, and where the ratio comes from:
    the replay forwards every replayed response again after P_all and after each P_\\k, as prefill, while GDPO's
    cost is decoding each sampled token once."""
    limit, h.repeats = (1, 1) if h.quick else (2, 3)
    times, manifest = annotation_ratio(model_path, None, limit, h.repeats, max_new_tokens)
    ratio = times["gdpo+mrtpo"] / times["gdpo"]
    stats, name = manifest.get("stats", {}), Path(model_path).name
    sampled, replayed = manifest["sampled_tokens"], stats.get("tokens_replayed", 0)
    h.update_figures({"model": name, "mrtpo_over_gdpo": round(ratio, 3)})
    return {"model": name, "mrtpo_over_gdpo": round(ratio, 3), "gdpo_mrtpo_s": round(times["gdpo+mrtpo"], 2),
            "gdpo_s": round(times["gdpo"], 2), "sampled_tokens": sampled, "tokens_replayed": replayed,
            "ms_per_sampled_token": round(times["gdpo"] / max(sampled, 1) * 1e3, 2),
            "ms_per_replayed_token": round((times["gdpo+mrtpo"] - times["gdpo"]) / max(replayed, 1) * 1e3, 2),
            "replays_done": stats.get("replays_done"), "replays_skipped": stats.get("replays_skipped")}


def overheads(h: Harness, profile_replay: bool) -> dict:
    """(a), (b) and (c) on the tiny policy and the demo prompts."""
    from tokencredit.pipeline.annotate import verify_samples
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.credit.replay import ReplayStats, replay_distances
    from tokencredit.pipeline.models.loading import load_policy
    from tokencredit.pipeline.sample.transformers_backend import TransformersSampler

    policy_path, rm_path, _ = model_paths()
    model, tokenizer = load_policy(policy_path)
    prompts, h.repeats, annotate_limit, annotate_repeats = (2, 1, 1, 1) if h.quick else (12, 3, 2, 3)
    batch_size, chunk_size = 16, 128
    sampling = SamplingConfig(n=4, max_new_tokens=24 if h.quick else 96)
    records = demo_records(prompts)
    by_id = {r.id: r for r in records}
    sampler = TransformersSampler(model, tokenizer, "bench", progress=False)
    samples = sampler.sample(records, sampling)
    verified = verify_samples(samples, by_id)
    all_items = replay_items(tokenizer, verified, by_id, gate=False)
    stats = {name: ReplayStats() for name in ("gated", "all")}
    replay_distances(model, replay_items(tokenizer, verified, by_id, gate=True), batch_size=batch_size,
                     chunk_size=chunk_size, stats=stats["gated"])
    replay_distances(model, all_items, batch_size=batch_size, chunk_size=chunk_size, stats=stats["all"])

    def replay(gate: bool):  # item building included, as in credit.assign_credit
        return replay_distances(model, replay_items(tokenizer, verified, by_id, gate), batch_size=batch_size,
                                chunk_size=chunk_size)

    t = h.interleaved_times({"sampling": lambda: sampler.sample(records, sampling),
                             "replay_gated": lambda: replay(True), "replay_all": lambda: replay(False)},
                            repeats=h.repeats)
    seqs = replayed_sequences(all_items)
    tb = h.interleaved_times({
        "replay": lambda: replay_distances(model, all_items, batch_size=batch_size, chunk_size=chunk_size),
        "forward": lambda: padded_forward(model, seqs, batch_size),
    }, repeats=h.repeats)
    tokens = max(stats["all"].tokens_replayed, 1)
    b_ratio = tb["replay"] / tb["forward"]
    if profile_replay or b_ratio > TARGET_FORWARD:
        print(profile(lambda: replay_distances(model, all_items, batch_size=batch_size, chunk_size=chunk_size)))
    tc, manifest = annotation_ratio(policy_path, rm_path, annotate_limit, annotate_repeats,
                                    24 if h.quick else 96)
    mstats = manifest.get("stats", {})
    return {"samples": len(samples), "replay_gated_over_sampling": round(t["replay_gated"] / t["sampling"], 3),
            "replay_all_over_sampling": round(t["replay_all"] / t["sampling"], 3), "sampling_s": round(t["sampling"], 3),
            "pairs_replayed_gated": stats["gated"].replays_done, "pairs_gated": stats["gated"].replays_skipped,
            "replay_over_forward": round(b_ratio, 3), "replay_us_per_token": round(tb["replay"] / tokens * 1e6, 1),
            "forward_us_per_token": round(tb["forward"] / tokens * 1e6, 1),
            "annotation_mrtpo_over_gdpo": round(tc["gdpo+mrtpo"] / tc["gdpo"], 3),
            "annotation_replays_done": mstats.get("replays_done"),
            "annotation_replays_skipped": mstats.get("replays_skipped")}


def roofline_and_memory(h: Harness) -> dict:
    """(d) and (e); the full run's figures go to speed.json."""
    roofline = matmul_roofline(512 if h.quick else 2048, 2 if h.quick else 10)
    replayed = roofline_fraction(None if h.quick else "smollm2-135m-instruct", roofline, 4 if h.quick else None)
    # a full run measures in a fresh process, whose allocator has kept nothing of earlier work to hide the peak
    T = 64 if h.quick else 4096
    peak = peak_memory(T, 4) if h.quick else h.run_child(__file__, ["--peak-child", str(T)])["peak"]
    figures = {"replay_roofline_fraction": round(replayed["fraction"], 3), "replay_peak_mib_T4096": round(peak / 2**20, 1)}
    h.update_figures({"model": "tiny" if h.quick else "smollm2-135m-instruct", **figures})
    return {**figures, "roofline_gflops": round(roofline / 1e9, 1), "replayed_responses": replayed["items"],
            "tokens_forwarded": replayed["tokens_forwarded"],
            "replay_gflops": round(replayed["replay_flops_per_s"] / 1e9, 1),
            "model_gemm_over_roofline": round(replayed["model_gemm"] / roofline, 3), "peak_t": T,
            "replay_peak_within_bound": peak <= TARGET_PEAK}


def p2t_over_forward(h: Harness) -> dict:
    """(f): `attribute` over the plain forward of the same batches."""
    from tokencredit import verifiers
    from tokencredit.pipeline.credit.p2t import attribute
    from tokencredit.pipeline.models.loading import load_reward_model
    from tokencredit.pipeline.sample.prompts import sampling_prompt

    model, tokenizer = load_reward_model(model_paths()[1])
    n, batch_size, repeats = (16, 8, 2) if h.quick else (128, 16, 7)
    records, _ = verifiers.load_tasks("demo")
    chosen = [records[i % len(records)] for i in range(n)]  # the first n demo records, cycling
    prompts = [tokenizer(sampling_prompt(r.prompt))["input_ids"] for r in chosen]
    responses = [tokenizer(r.reference_response)["input_ids"] for r in chosen]
    seqs, pad = [p + r for p, r in zip(prompts, responses)], model.config.pad_token_id
    times = h.interleaved_times({
        "attribute": lambda: attribute(model, prompts, responses, batch_size=batch_size),
        "forward": lambda: padded_forward(model, seqs, batch_size, pad, longest_first=True),
    }, repeats=repeats)
    return {"sequences": n, "tokens": sum(map(len, seqs)), "batch_size": batch_size,
            "attribute_s": round(times["attribute"], 4), "forward_s": round(times["forward"], 4),
            "attribute_over_forward": round(times["attribute"] / times["forward"], 3)}


@benchmark("replay", measures="MRTPO's replay on the tiny policy: over sampling the same responses, over plain "
           "forwards of the same sequences, and `run_annotation` with (gdpo, mrtpo) over (gdpo,); SmolLM2's replay "
           "of the localization cases against the float32 matmul roofline; peak memory at vocabulary 152,064, T 4096; "
           "`p2t.attribute` (gradient x input) over the tiny reward model's plain forward on the same padded demo "
           "batches. `-- --model PATH`: the annotation ratio only, on a local policy.", results=("speed.json",),
           targets=(Target("replay_over_forward", "<=", TARGET_FORWARD),
                    Target("annotation_mrtpo_over_gdpo", "<=", TARGET_ANNOTATION),
                    Target("replay_roofline_fraction", ">=", TARGET_FRACTION),
                    Target("replay_peak_within_bound", "==", True),
                    Target("mrtpo_over_gdpo", "<=", TARGET_MODEL_ANNOTATION),
                    Target("attribute_over_forward", "<=", TARGET_P2T)))
def run(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench replay --")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one replay")
    parser.add_argument("--model", help="local policy folder or pulled model name: run only the annotation ratio (c)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="response length limit with --model")
    args = parser.parse_args(h.argv)
    if args.model:
        return model_annotation_ratio(h, args.model, args.max_new_tokens)
    return overheads(h, args.profile) | roofline_and_memory(h) | p2t_over_forward(h)


if __name__ == "__main__":  # in a fresh process: memory the allocator kept from earlier work would hide the peak
    print(json.dumps({"peak": peak_memory(int(sys.argv[2]), 16)}))
