"""What picks the vllm engine's defaults, on SmolLM2-135M, with the CPU engine of the README's environment:

    python bench/bench_engine_choice.py [--quick]

1. dtype: for each engine dtype, |the stored (sampled) log-prob - a float32 Hugging Face forward's log-prob of
   the same prompt + response ids| per token (max, mean, 99th percentile): what bfloat16 changes in the stored
   log-probs, from which the default dtype and the tests' bounds are taken.
2. `--backend auto`'s break-even: each backend's start (model or engine load plus its first call) and its steady
   seconds per sampled token on the same prompts, one after the other in this process; the break-even is the
   run size in sampled tokens from which the engine, start included, finishes first.

Writes bench/results/engine_choice.json and the "Engine choice" section of bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from common import ROOT, THREADS, upsert_result  # common first: its thread settings

OUT = ROOT / "bench" / "results" / "engine_choice.json"


def reference_logprobs(model, samples) -> list[list[float]]:
    """Per sample, the float32 log-prob of each response token given the prompt and the tokens before it."""
    import torch

    out = []
    with torch.inference_mode():
        for s in samples:
            ids = torch.tensor([s.prompt_token_ids + s.token_ids])
            logits = model(input_ids=ids).logits[0, len(s.prompt_token_ids) - 1:-1].float()
            out.append(torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.token_ids)[:, None])[:, 0].tolist())
    return out


def differences(samples, reference) -> dict:
    diffs = sorted(abs(a - b) for s, ref in zip(samples, reference) for a, b in zip(s.sample_logprobs, ref))
    return {"max": max(diffs), "mean": statistics.fmean(diffs), "p99": diffs[int(0.99 * (len(diffs) - 1))],
            "tokens": len(diffs)}


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="8 prompts x 2 x 32 tokens")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--size", default=None, metavar="P,N,T", help="prompts, responses each, tokens (default "
                        "32,4,96; --quick 8,2,32)")
    args = parser.parse_args()
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.models.loading import load_policy
    from tokencredit.pipeline.sample import make_sampler
    from tokencredit.pipeline.sample.transformers_backend import TransformersSampler
    from tokencredit.verifiers import load_tasks

    prompts, n, tokens = (map(int, args.size.split(",")) if args.size else (8, 2, 32) if args.quick
                          else (32, 4, 96))
    records = load_tasks("demo", "native")[0][:prompts]
    warm = SamplingConfig(n=1, max_new_tokens=8, seed=1)
    config = SamplingConfig(n=n, max_new_tokens=tokens, seed=0, batch_size=prompts * n)
    result = {"model": args.model, "prompts": prompts, "n": n, "max_new_tokens": tokens, "dtype": {},
              "load_avg_start": os.getloadavg()[0]}

    (policy, tokenizer), load_s = timed(lambda: load_policy(args.model))
    hf = TransformersSampler(policy, tokenizer, args.model, progress=False)
    _, first_s = timed(lambda: hf.sample(records[:1], warm))
    samples, run_s = timed(lambda: hf.sample(records, config))
    made = sum(len(s.token_ids) for s in samples)
    result["transformers"] = {"start_s": load_s + first_s, "seconds_per_token": run_s / made, "tokens": made}

    for dtype in ("float32", "bfloat16"):
        engine, start_s = timed(lambda: make_sampler("vllm", args.model, device="cpu", dtype=dtype, threads=THREADS))
        engine.progress = False
        _, first_s = timed(lambda: engine.sample(records[:1], warm))
        samples, run_s = timed(lambda: engine.sample(records, config))
        made = sum(len(s.token_ids) for s in samples)
        result["dtype"][dtype] = differences(samples, reference_logprobs(policy, samples))
        result[f"vllm_{dtype}"] = {"start_s": start_s + first_s, "seconds_per_token": run_s / made, "tokens": made}

    hf_row, vl_row = result["transformers"], result["vllm_float32"]
    saved = hf_row["seconds_per_token"] - vl_row["seconds_per_token"]
    result["break_even_tokens"] = (round((vl_row["start_s"] - hf_row["start_s"]) / saved) if saved > 0 else None)
    result["load_avg_end"] = os.getloadavg()[0]
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    d32, d16 = result["dtype"]["float32"], result["dtype"]["bfloat16"]
    upsert_result(
        "Engine choice (dtype, --backend auto)",
        "The vllm engine's stored log-probs against a float32 forward of the same ids, per engine dtype, and the "
        "run size from which the engine (start included) beats the transformers backend; float32 engine. "
        "`python bench/bench_engine_choice.py`.",
        "quick" if args.quick else f"size {args.size}" if args.size else "full",
        f"{args.model}, {prompts} prompts x {n} x {tokens} tokens",
        f"|dlogprob| fp32 max {d32['max']:.2g} mean {d32['mean']:.2g}; bf16 max {d16['max']:.3f} mean "
        f"{d16['mean']:.4f}; start vllm {vl_row['start_s']:.0f} s vs transformers {hf_row['start_s']:.0f} s; "
        f"ms/token vllm fp32 {1e3 * vl_row['seconds_per_token']:.1f}, bf16 "
        f"{1e3 * result['vllm_bfloat16']['seconds_per_token']:.1f}, transformers "
        f"{1e3 * hf_row['seconds_per_token']:.1f}; break-even {result['break_even_tokens']} tokens; load "
        f"{result['load_avg_start']:.1f}-{result['load_avg_end']:.1f}",
        "none (sets defaults)")


if __name__ == "__main__":
    main()
