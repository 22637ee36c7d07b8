"""P2T attribution (one forward + one backward) over a plain forward of the reward model, same batch.

    python -m bench p2t [--quick]

Inputs: demo prompts in the sampling layout and their reference responses, tokenized with the
reward model's tokenizer. Both sides see the same sequences in the same right-padded batches
(longest first, as `attribute` orders them). Target: attribution <= 3.5x the plain forward.
"""
from __future__ import annotations


import torch

from common import Harness, model_paths
from registry import Target, benchmark

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


@benchmark("p2t", measures="`p2t.attribute` (gradient x input: forward + backward w.r.t. the input embeddings) over "
           "`model(ids, attention_mask)` under inference mode on the same padded demo batches (shipped tiny reward model).",
           targets=(Target("attribute_over_forward", "<=", TARGET),))
def run(h: Harness) -> dict:
    from tokencredit.pipeline.credit.p2t import attribute
    from tokencredit.pipeline.models.loading import load_reward_model

    _, rm_path, _ = model_paths()
    model, tokenizer = load_reward_model(rm_path)
    n, batch_size, h.repeats = (16, 8, 2) if h.quick else (128, 16, 7)
    prompts, responses = demo_batch(tokenizer, n)
    times = h.interleaved_times({
        "attribute": lambda: attribute(model, prompts, responses, batch_size=batch_size),
        "forward": lambda: plain_forward(model, prompts, responses, batch_size),
    }, repeats=h.repeats)
    return {"sequences": n, "tokens": sum(len(p) + len(r) for p, r in zip(prompts, responses)),
            "batch_size": batch_size, "attribute_s": round(times["attribute"], 4), "forward_s": round(times["forward"], 4),
            "attribute_over_forward": round(times["attribute"] / times["forward"], 3)}
