"""What made a run under load write other bytes than the same config on a quiet machine: bench/results/determinism.json.

    python bench/bench_determinism.py [--quick]

1. The sampler's batch. Before, `batch_size` None meant a quarter of the memory free at the time
   (`transformers_backend.auto_batch`): 128 rows with 6 GiB or more free, 64 with 3-6 GiB, for SmolLM2 and 24
   instruction prompts x 4 with 128 new tokens. This samples those 96 responses in one batch of 96 and in
   batches of 64 (what a busy machine got) and counts the responses whose tokens differ, with the first token
   where they do.
2. The verifiers' first call. The instruction checks import NLTK, SciPy and langdetect's profiles when first
   used; this times that first call in a fresh process against the 5 s bound a response's verifiers get.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from common import ROOT, update_figures

FIRST_CALL = """
import time
from tokencredit import verifiers
from tokencredit.pipeline.annotate import AnnotateConfig, load_prompt_set
record = load_prompt_set(AnnotateConfig(tasks=("instructions",), limit=1))[0][0]
begin = time.perf_counter()
verifiers.verify(record, "hello world. see you soon.")
first = time.perf_counter() - begin
begin = time.perf_counter()
verifiers.verify(record, "hello again. see you soon.")
print(first, time.perf_counter() - begin)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 prompts x 4 and 32 new tokens, batches 32 and 16")
    args = parser.parse_args()

    from tokencredit.pipeline.annotate import AnnotateConfig, load_prompt_set
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.models.loading import load_policy
    from tokencredit.pipeline.sample.transformers_backend import TransformersSampler

    prompts, new, batches = (8, 32, (32, 16)) if args.quick else (24, 128, (96, 64))
    model_name = "smollm2-135m-instruct"
    records, _ = load_prompt_set(AnnotateConfig(model=model_name, tasks=("instructions",), limit=prompts))
    model, tokenizer = load_policy(model_name)
    sampler = TransformersSampler(model, tokenizer, "bench", progress=False)
    tokens, seconds = {}, {}
    for size in batches:
        begin = time.perf_counter()
        tokens[size] = {s.response_id: s.token_ids for s in sampler.sample(
            records, SamplingConfig(n=4, max_new_tokens=new, batch_size=size))}
        seconds[size] = time.perf_counter() - begin
    whole, part = tokens[batches[0]], tokens[batches[1]]
    firsts = sorted(next((t for t, (a, b) in enumerate(zip(whole[k], part[k])) if a != b),
                         min(len(whole[k]), len(part[k]))) for k in whole if whole[k] != part[k])
    done = subprocess.run([sys.executable, "-c", FIRST_CALL], capture_output=True, text=True, check=True)
    first, second = map(float, done.stdout.split())
    figures = {"responses": len(whole), "batch_whole": batches[0], "batch_split": batches[1],
               "responses_differing": len(firsts), "first_differing_token_min": firsts[0] if firsts else None,
               "first_differing_token_max": firsts[-1] if firsts else None,
               "sampling_seconds": {str(k): round(v, 1) for k, v in seconds.items()},
               "first_verify_s": round(first, 2), "second_verify_s": round(second, 4),
               "verifier_timeout_s": AnnotateConfig.verifier_timeout_s, "mode": "quick" if args.quick else "full"}
    print(json.dumps(figures))
    if not args.quick:
        update_figures(figures, ROOT / "bench" / "results" / "determinism.json")


if __name__ == "__main__":
    main()
