"""Does `--shard-size` change the sampled responses, and what would batching each prompt alone cost?

    python bench/bench_shard_samples.py [--quick] [--model PATH]

The annotate stage samples a shard's rows in batches of `batch_size` (32) rows. A batch's composition
moves the logits in their last float bits, and a draw that falls at a CDF boundary then picks another
token (README, "The dataset"). This samples 12 instruction prompts x 4 responses (max_new_tokens 48,
temperature 1, top_p 1) as shards of 12, 4 and 2 prompts would, and counts the responses whose tokens
differ from the 12-prompt shard's, and times each shard size, down to the alternative that makes tokens
independent of the shard: shards of one prompt, whose 4 rows are a batch of their own (one run each).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import upsert_result

SMOLLM2 = "smollm2-135m-instruct"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 new tokens instead of 48")
    parser.add_argument("--model", default=SMOLLM2, help="local folder or pulled model name (default: %(default)s)")
    args = parser.parse_args()

    from tokencredit.pipeline.annotate import AnnotateConfig, load_prompt_set
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.models.loading import load_policy
    from tokencredit.pipeline.sample.transformers_backend import TransformersSampler

    prompts, max_new = (12, 16) if args.quick else (12, 48)
    records, _ = load_prompt_set(AnnotateConfig(model=args.model, tasks=("instructions",), limit=prompts))
    config = SamplingConfig(n=4, max_new_tokens=max_new, temperature=1.0, top_p=1.0, batch_size=32)
    model, tokenizer = load_policy(args.model)
    sampler = TransformersSampler(model, tokenizer, "bench", progress=False)

    def by_shard(shard_size: int) -> dict[str, list[int]]:
        return {s.response_id: s.token_ids for start in range(0, len(records), shard_size)
                for s in sampler.sample(records[start:start + shard_size], config)}

    sizes = (len(records), 4, 2, 1)  # 1: a batch of each prompt's rows alone
    tokens, seconds = {}, {}
    for size in sizes:
        start = time.perf_counter()
        tokens[size] = by_shard(size)
        seconds[size] = time.perf_counter() - start
    whole = tokens[len(records)]
    differing = {size: sum(tokens[size][k] != whole[k] for k in whole) for size in sizes[1:]}
    ratio = seconds[1] / seconds[len(records)]
    name = Path(args.model).name
    figures = (f"{name}: responses differing from shard size {len(records)}: " + ", ".join(
        f"shard size {size}: {differing[size]} of {len(whole)}" for size in sizes[1:])
        + "; sampling seconds by shard size: " + ", ".join(f"{size}: {seconds[size]:.1f}" for size in sizes)
        + f"; each prompt's rows alone (shard size 1) {ratio:.2f}x one shard")
    print(figures)
    upsert_result(
        "Shard size and sampled responses (bench_shard_samples.py)",
        "Responses whose tokens change with `--shard-size` (the batch a row is sampled in), and the sampling "
        "time per shard size, down to the alternative that removes the change (each prompt's rows as their own "
        "batch); one run each on a shared machine.",
        "quick" if args.quick else "full",
        f"{len(records)} instruction prompts x {config.n} samples, max_new_tokens {max_new}, temperature 1, "
        f"top_p 1, batch_size 32; shard sizes {', '.join(map(str, sizes))}; one run each",
        figures, "none (README says what may differ)")


if __name__ == "__main__":
    main()
