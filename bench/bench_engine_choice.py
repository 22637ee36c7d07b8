"""What picks the vllm engine's defaults, on SmolLM2-135M, with the CPU engine of the README's environment:

    python -m bench engine_choice [--quick]

1. dtype: for each engine dtype, |the stored (sampled) log-prob - a float32 Hugging Face forward's log-prob of
   the same prompt + response ids| per token (max, mean, 99th percentile): what bfloat16 changes in the stored
   log-probs, from which the default dtype and the tests' bounds are taken.
2. `--backend auto`'s break-even: each backend's start (model or engine load plus its first call) and its steady
   seconds per sampled token on the same prompts, one after the other in this process; the break-even is the
   run size in sampled tokens from which the engine, start included, finishes first.

Writes bench/results/engine_choice.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from common import THREADS, Harness  # common first: its thread settings
from registry import benchmark



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


@benchmark("engine_choice", measures="The vllm engine's stored log-probs against a float32 Hugging Face forward "
           "of the same ids, per engine dtype (from which the default dtype and the tests' bounds are taken), and "
           "`--backend auto`'s break-even: the run size in sampled tokens from which the engine, start included, "
           "finishes before the transformers backend.", results=("engine_choice.json",), needs=("vllm",))
def run(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench engine_choice --")
    parser.add_argument("--model", default="tiny" if h.quick else "smollm2-135m-instruct")
    parser.add_argument("--size", default=None, metavar="P,N,T", help="prompts, responses each, tokens (default "
                        "32,4,96; --quick 4,2,16)")
    args = parser.parse_args(h.argv)
    args.model = None if args.model == "tiny" else args.model
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.models.loading import load_policy
    from tokencredit.pipeline.sample import make_sampler
    from tokencredit.pipeline.sample.transformers_backend import TransformersSampler
    from tokencredit.verifiers import load_tasks

    prompts, n, tokens = (map(int, args.size.split(",")) if args.size else (4, 2, 16) if h.quick
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
    h.results("engine_choice.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
