"""P2T attribution (one forward + one backward) over a plain forward of the reward model, same batch.

    python bench/bench_p2t.py [--quick]

Inputs: demo prompts in the sampling layout and their reference responses, tokenized with the
reward model's tokenizer. Both sides see the same sequences in the same right-padded batches
(longest first, as `attribute` orders them). Target: attribution <= 3.5x the plain forward.
"""
from __future__ import annotations

import argparse

import torch

from common import interleaved_times, model_paths, upsert_result, verdict

TARGET = 3.5


def demo_batch(tokenizer, n: int) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, response ids) of the first n demo records, cycling if there are fewer."""
    from tokencredit import verifiers
    from tokencredit.pipeline.sample.prompts import sampling_prompt

    records, _ = verifiers.load_tasks("demo")
    chosen = [records[i % len(records)] for i in range(n)]
    return ([tokenizer(sampling_prompt(r.prompt))["input_ids"] for r in chosen],
            [tokenizer(r.reference_response)["input_ids"] for r in chosen])


@torch.inference_mode()
def plain_forward(model, prompts, responses, batch_size: int) -> None:
    """model(ids, attention_mask) on the batches `attribute` would form."""
    pad = model.config.pad_token_id
    seqs = sorted((p + r for p, r in zip(prompts, responses)), key=len, reverse=True)
    for start in range(0, len(seqs), batch_size):
        batch = seqs[start:start + batch_size]
        ids = torch.full((len(batch), len(batch[0])), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, s in enumerate(batch):
            ids[b, :len(s)], mask[b, :len(s)] = torch.tensor(s), 1
        model(input_ids=ids, attention_mask=mask)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer responses and repeats")
    args = parser.parse_args()

    from tokencredit.pipeline.models.loading import load_reward_model
    from tokencredit.pipeline.credit.p2t import attribute

    _, rm_path, note = model_paths()
    model, tokenizer = load_reward_model(rm_path)
    n, batch_size, repeats = (32, 16, 3) if args.quick else (128, 16, 7)
    prompts, responses = demo_batch(tokenizer, n)
    tokens = sum(len(p) + len(r) for p, r in zip(prompts, responses))
    params = sum(p.numel() for p in model.parameters())
    sizes = (f"{n} demo sequences ({tokens} tokens, mean {tokens / n:.0f}), batch {batch_size}, "
             f"{params / 1e6:.2f}M-param reward model ({note}), {repeats} reps, median")
    print(f"sizes: {sizes}")

    times = interleaved_times({
        "attribute": lambda: attribute(model, prompts, responses, batch_size=batch_size),
        "forward": lambda: plain_forward(model, prompts, responses, batch_size),
    }, repeats=repeats)
    ratio = times["attribute"] / times["forward"]
    print(f"attribute {times['attribute']:.3f} s, plain forward {times['forward']:.3f} s: {ratio:.2f}x "
          f"(target <= {TARGET}x: {verdict(ratio <= TARGET)})")
    upsert_result(
        "P2T attribution vs plain forward (bench_p2t.py)",
        "`p2t.attribute` (gradient x input: forward + backward w.r.t. the input embeddings) over "
        "`model(ids, attention_mask)` under inference mode on the same padded batches.",
        "quick" if args.quick else "full", sizes,
        f"attribute {times['attribute']:.3f} s, forward {times['forward']:.3f} s = {ratio:.2f}x",
        f"<= {TARGET}x: {verdict(ratio <= TARGET)}",
    )


if __name__ == "__main__":
    main()
