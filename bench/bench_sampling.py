"""tokencredit's sampler against Hugging Face `model.generate` on the same batch and settings.

    python -m bench sampling [--quick] [-- [--model PATH]]

One batch: demo prompts spread over the tasks x n samples, rendered as the sampler renders them,
temperature 1, full vocabulary (top_p 1, no top-k), max_new_tokens, eos ends a row. tokencredit:
`TransformersSampler.sample` (prompt rendering, token choice, raw log-probs, decoded responses).
Hugging Face: `model.generate(do_sample=True, top_k=0)` on the left-padded rows with `output_logits`,
then the same raw log-probs and decoded responses. Draws differ (each side's own RNG), so responses
differ in length: the ratio is of seconds per generated token (eos included), medians of interleaved
runs. Both the given model (default: SmolLM2-135M-Instruct, target <= 0.9x) and the shipped tiny
policy are run; the model's ratio goes to bench/results/speed.json as `sampling_over_generate`. (Until commit
3cfae4c it also timed `token_spans` and stop-string checks against the prefix decodes they replaced: a final study,
its figures in its rows.)
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common import Harness, demo_records, interleaved_times
from registry import Target, benchmark

SMOLLM2 = "smollm2-135m-instruct"  # the registry's name (`tokencredit models pull smollm2-135m-instruct`)
TARGET = 0.9


class GenerateRun:
    """`model.generate` on the sampler's rows, returning what the sampler returns: response ids,
    their raw log-probs and decoded text."""

    def __init__(self, model, tokenizer, records, config):
        from tokencredit.pipeline.sample.transformers_backend import TransformersSampler, left_pad
        from tokencredit.pipeline.sample.rows import render_prompt

        sampler = TransformersSampler(model, tokenizer, "bench", progress=False)
        prompts = [render_prompt(tokenizer, r.prompt)[1] for r in records for _ in range(config.n)]
        self.ids, self.mask, _ = left_pad(prompts, sampler.pad_id)
        self.model, self.tokenizer, self.config = model, tokenizer, config
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


def compare(model_path, records, config, repeats: int) -> dict:
    """Seconds per generated token of both sides on one model, and the ratio."""
    from tokencredit.pipeline.models.loading import load_policy
    from tokencredit.pipeline.sample.transformers_backend import TransformersSampler

    model, tokenizer = load_policy(model_path)
    sampler = TransformersSampler(model, tokenizer, "bench", progress=False)
    generate = GenerateRun(model, tokenizer, records, config)
    counts = {"tokencredit": sum(len(s.token_ids) for s in sampler.sample(records, config)),
              "generate": sum(len(ids) for ids, _, _ in generate())}
    times = interleaved_times({"tokencredit": lambda: sampler.sample(records, config), "generate": generate},
                              repeats=repeats, warmup=0)
    per_token = {name: times[name] / counts[name] for name in times}
    return {"seconds": times, "tokens": counts, "per_token": per_token,
            "ratio": per_token["tokencredit"] / per_token["generate"]}


@benchmark("sampling", measures="`TransformersSampler.sample` over `model.generate(do_sample=True, top_k=0, "
           "output_logits=True)` plus the same raw log-probs and decoded responses, same rows and settings: seconds per "
           "generated token (the draws, hence lengths, differ), medians of interleaved runs; SmolLM2 and the tiny policy.",
           results=("speed.json",), targets=(Target("sampling_over_generate", "<=", TARGET),))
def run(h: Harness) -> dict:
    from tokencredit.pipeline.config import SamplingConfig

    parser = argparse.ArgumentParser(prog="python -m bench sampling --")
    parser.add_argument("--model", default=None if h.quick else SMOLLM2,
                        help="local folder or pulled model name (default: SmolLM2; --quick: the tiny policy only)")
    model = parser.parse_args(h.argv).model
    prompts, max_new, h.repeats = (2, 8, 1) if h.quick else (8, 96, 3)
    config = SamplingConfig(n=2 if h.quick else 4, max_new_tokens=max_new, temperature=1.0, top_p=1.0, batch_size=32)
    records = demo_records(prompts)
    name = Path(model).name if model else "tiny policy"
    results = {name: compare(model, records, config, h.repeats)}
    if model:
        results["tiny policy"] = compare(None, records, config, h.repeats)
    figures = {"model": name, "rows": prompts * config.n, "max_new_tokens": max_new,
               "sampling_over_generate": round(results[name]["ratio"], 3)}
    for label, r in results.items():
        key = label.replace(" ", "_")
        figures |= {f"{key}_ms_per_token": round(r["per_token"]["tokencredit"] * 1e3, 2),
                    f"{key}_generate_ms_per_token": round(r["per_token"]["generate"] * 1e3, 2)}
    h.update_figures({"model": name, "sampling_over_generate": figures["sampling_over_generate"]})
    return figures
