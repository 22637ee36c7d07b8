"""The sample stage: n responses per prompt with the log-probabilities the sampler saw.

    sampler = make_sampler("transformers", model_path)        # or "vllm" (the [gpu] extra)
    samples = sampler.sample(records, SamplingConfig(n=4))    # list[Sample], record order then j

Backends (`transformers_backend`, `vllm_backend`) share `rows` (seeds, prompt rendering, records);
`prompts` lays out sampling and replay prompts, `detokenize` decodes growing responses, `bounds` bounds
what a record can cost before any model runs. Importing this package loads neither torch nor vllm.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokencredit.schemas.records import Sample, TaskRecord

from tokencredit.pipeline.config import SamplingConfig

BACKENDS = ("transformers", "vllm")


class Sampler(Protocol):
    def sample(self, records: Sequence[TaskRecord], config: SamplingConfig) -> list[Sample]: ...


def make_sampler(backend: str, model_path: str | None = None, *, device: str = "cpu", dtype=None,
                 trust_remote_code: bool = False, policy: tuple | None = None) -> Sampler:
    """A sampler for a local policy (None = the shipped tiny policy). vllm picks its own CUDA device.

    `policy`: the (model, tokenizer) of `model_path` already loaded, which the transformers backend
    samples with instead of loading a second copy (vLLM always loads its own).
    """
    if backend == "transformers":
        from tokencredit.pipeline.models.loading import load_policy, model_name
        from tokencredit.pipeline.sample.transformers_backend import TransformersSampler

        model, tokenizer = policy or load_policy(model_path, device=device, dtype=dtype,
                                                 trust_remote_code=trust_remote_code)
        return TransformersSampler(model, tokenizer, model_name(model_path))
    if backend == "vllm":
        from tokencredit.pipeline.sample.vllm_backend import VllmSampler  # the optional [gpu] extra

        return VllmSampler(model_path, dtype=dtype, trust_remote_code=trust_remote_code)
    raise ValueError(f"unknown sampling backend {backend!r}; choose from {', '.join(BACKENDS)}")
