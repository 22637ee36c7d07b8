"""Scoring a LoRA policy through the vllm engine: its own LoRA support against the adapter merged into a saved folder.

    python bench/bench_engine_lora.py [--quick]

One LoRA adapter on SmolLM2-135M (rank 8 on every linear layer, as bench/closed_loop.py trains; B drawn small so
that it changes the policy), greedy responses to held-out prompts, the two ways side by side in one process:
- lora: one engine on the base with LoRA enabled, the adapter applied per request (an engine serves every
  policy of an experiment, so its start is paid once);
- merged: the adapter merged into the base and saved (PEFT merge_and_unload), an engine started on that folder
  (one start per policy).
Per way: the start (engine, plus the merge and save for `merged`), the sampling seconds, and how many greedy
responses agree. Writes bench/results/engine_lora.json and the "Engine LoRA" section of bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from common import ROOT, THREADS, upsert_result  # common first: its thread settings

OUT = ROOT / "bench" / "results" / "engine_lora.json"
RANK = 8


def make_adapter(model_name: str, folder: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    from tokencredit.pipeline.models.loading import load_policy

    model, _ = load_policy(model_name)
    peft = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules="all-linear"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    peft.save_pretrained(folder)


def merge(model_name: str, adapter: Path, folder: Path) -> None:
    from peft import PeftModel

    from tokencredit.pipeline.models.loading import load_policy

    model, tokenizer = load_policy(model_name)
    PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 prompts x 32 tokens")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.sample import make_sampler
    from tokencredit.pipeline.sample.vllm_backend import VllmSampler
    from tokencredit.verifiers import load_tasks

    prompts, tokens = (32, 32) if args.quick else (256, 64)
    records = load_tasks("demo", "native")[0][:prompts]
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=tokens)
    work = Path(tempfile.mkdtemp(prefix="engine-lora-"))
    make_adapter(args.model, work / "adapter")
    result = {"model": args.model, "prompts": prompts, "max_new_tokens": tokens, "rank": RANK,
              "load_avg_start": os.getloadavg()[0]}

    start = time.perf_counter()
    engine = VllmSampler(args.model, device="cpu", dtype="float32", threads=THREADS, max_lora_rank=RANK,
                         progress=False)
    engine.use_adapter(str(work / "adapter"))
    engine.sample(records[:1], SamplingConfig(n=1, temperature=0.0, max_new_tokens=4))  # first call's warm-up
    lora_start = time.perf_counter() - start
    start = time.perf_counter()
    with_lora = engine.sample(records, greedy)
    result["lora"] = {"start_s": lora_start, "sample_s": time.perf_counter() - start,
                      "tokens": sum(len(s.token_ids) for s in with_lora)}
    engine.close()  # one engine per process: it stops before the next starts

    start = time.perf_counter()
    merge(args.model, work / "adapter", work / "merged")
    merged_engine = make_sampler("vllm", str(work / "merged"), device="cpu", dtype="float32", threads=THREADS)
    merged_engine.progress = False
    merged_engine.sample(records[:1], SamplingConfig(n=1, temperature=0.0, max_new_tokens=4))
    merged_start = time.perf_counter() - start
    start = time.perf_counter()
    merged = merged_engine.sample(records, greedy)
    result["merged"] = {"start_s": merged_start, "sample_s": time.perf_counter() - start,
                        "tokens": sum(len(s.token_ids) for s in merged)}
    result["greedy_agree"] = sum(a.token_ids == b.token_ids for a, b in zip(with_lora, merged)) / len(merged)
    for way in ("lora", "merged"):
        result[way]["total_s"] = result[way]["start_s"] + result[way]["sample_s"]
    result["lora_over_merged_sample"] = result["lora"]["sample_s"] / result["merged"]["sample_s"]
    result["lora_over_merged_total"] = result["lora"]["total_s"] / result["merged"]["total_s"]
    result["load_avg_end"] = os.getloadavg()[0]
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    upsert_result(
        "Engine LoRA (scoring a LoRA policy on the vllm engine)",
        "Greedy held-out responses of one LoRA policy: the engine's LoRA support (one engine for every policy) "
        "against the adapter merged into a saved folder (an engine per policy). `python bench/bench_engine_lora.py`.",
        "quick" if args.quick else "full", f"{args.model}, rank {RANK}, {prompts} prompts x {tokens} tokens greedy",
        f"lora: start {result['lora']['start_s']:.0f} s, sampling {result['lora']['sample_s']:.1f} s; merged: start "
        f"{result['merged']['start_s']:.0f} s (merge + save + engine), sampling {result['merged']['sample_s']:.1f} s; "
        f"lora/merged sampling {result['lora_over_merged_sample']:.2f}, total {result['lora_over_merged_total']:.2f};"
        f" greedy agree {result['greedy_agree']:.3f}; load {result['load_avg_start']:.1f}-{result['load_avg_end']:.1f}",
        "none (picks the way)")


if __name__ == "__main__":
    main()
