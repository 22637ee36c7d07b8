"""Replay at the cost of the model's forwards (issue 14): FLOP/s against the matmul roofline, bounded memory.

    python bench/bench_replay_cost.py [--quick]

(a) roofline: float32 matmul FLOP/s of this machine's torch threads (the best of square GEMMs);
(b) SmolLM2-135M-Instruct replaying the localization cases (prompt ~250 tokens, every reward replayed):
    the model FLOPs of the tokens the replay forwards (2 x non-embedding parameters per token, attention
    4 x layers x hidden x context, the LM head at the response positions) per second, over (a); target 0.8;
    beside it, the FLOP/s of the model's own matmul shapes (its Linear layers and head at 2048 tokens), the
    most its forwards' matmuls reach on this machine;
(c) peak extra memory (RSS, in a fresh process) of `replay` with a config-built Llama of vocabulary 152,064 (Qwen2's), batch
    16, T = 4096 response tokens: target <= 2 GiB. A [16, 4096, 152064] float32 logits tensor, which the
    replay never builds, would be 37 GiB.
Writes its row to bench/RESULTS.md and `replay_roofline_fraction`, `replay_peak_mib_T4096` to
bench/results/speed.json.
"""
from __future__ import annotations

import argparse
import time

import torch

import json

from common import gib, machine, median_time, peak_extra_bytes, run_child, update_figures, upsert_result, verdict

TARGET_FRACTION, TARGET_PEAK = 0.8, 2 * 2**30


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


def smollm2_fraction(roofline: float, limit: int | None) -> dict:
    from tokencredit import verifiers  # noqa: F401
    from bench_localization import _item, load_cases

    from tokencredit.pipeline.models.loading import load_policy
    from tokencredit.pipeline.credit.replay import ReplayStats, replay

    model, tokenizer = load_policy("smollm2-135m-instruct")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 cases, T = 512; writes nothing")
    parser.add_argument("--peak-child", type=int, metavar="T", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_child:  # in a fresh process: memory the allocator kept from earlier work would hide the peak
        print(json.dumps({"peak": peak_memory(args.peak_child, 16)}))
        return
    roofline = matmul_roofline()
    print(f"matmul roofline: {roofline / 1e9:.1f} GFLOP/s ({machine()})", flush=True)
    replayed = smollm2_fraction(roofline, 8 if args.quick else None)
    print(f"SmolLM2 replay: {replayed['items']} responses in {replayed['seconds']:.1f} s, "
          f"{replayed['replay_flops_per_s'] / 1e9:.1f} GFLOP/s = {replayed['fraction']:.2f} of the roofline; "
          f"the model's own matmul shapes {replayed['model_gemm'] / 1e9:.1f} GFLOP/s = "
          f"{replayed['model_gemm'] / roofline:.2f} of it", flush=True)
    T = 512 if args.quick else 4096
    peak = run_child(__file__, ["--peak-child", str(T)])["peak"]
    print(f"replay peak extra memory, V 152064, batch 16, T {T}: {gib(peak)}", flush=True)
    if args.quick:
        return
    update_figures({"model": "smollm2-135m-instruct", "replay_roofline_fraction": round(replayed["fraction"], 3),
                       "replay_peak_mib_T4096": round(peak / 2**20, 1)})
    upsert_result(
        "Replay cost: roofline fraction and bounded memory (bench_replay_cost.py)",
        "SmolLM2-135M-Instruct replaying every benchmark case (all rewards, continuations from P_all's KV "
        "cache): model FLOPs of the forwarded tokens per second over the float32 matmul roofline; peak extra "
        "RSS of a replay with vocabulary 152,064, batch 16, T = 4096 (config-built 2-layer Llama).",
        "full",
        f"{replayed['items']} responses, {replayed['tokens_forwarded']} tokens forwarded; T 4096 x batch 16",
        f"roofline {roofline / 1e9:.1f} GFLOP/s; replay {replayed['replay_flops_per_s'] / 1e9:.1f} GFLOP/s = "
        f"{replayed['fraction']:.2f}; the model's own matmul shapes (2048 tokens) "
        f"{replayed['model_gemm'] / 1e9:.1f} GFLOP/s = {replayed['model_gemm'] / roofline:.2f}; "
        f"peak extra memory {gib(peak)}",
        f"fraction >= {TARGET_FRACTION}: {verdict(replayed['fraction'] >= TARGET_FRACTION)}; peak <= 2 GiB: "
        f"{verdict(peak <= TARGET_PEAK)}",
    )


if __name__ == "__main__":
    main()
