"""The sample stage: n responses per prompt with the log-probabilities the sampler saw.

    sampler = make_sampler("transformers", model_path)        # or "vllm" ([cpu-engine] or [gpu] extra)
    samples = sampler.sample(records, SamplingConfig(n=4))    # list[Sample], record order then j

Backends (`transformers_backend`, `vllm_backend`) share `rows` (seeds, prompt rendering, records);
`prompts` lays out sampling and replay prompts, `detokenize` decodes growing responses, `bounds` bounds
what a record can cost before any model runs. Importing this package loads neither torch nor vllm.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

from tokencredit.schemas.records import Sample, TaskRecord

from tokencredit.pipeline.config import SamplingConfig

BACKENDS = ("transformers", "vllm")


class Sampler(Protocol):
    def sample(self, records: Sequence[TaskRecord], config: SamplingConfig) -> list[Sample]: ...


def make_sampler(backend: str, model_path: str | None = None, *, device: str = "cpu", dtype=None,
                 trust_remote_code: bool = False, policy: tuple | None = None,
                 kv_cache_bytes: int | None = None, threads: int | None = None) -> Sampler:
    """A sampler for a local policy (None = the shipped tiny policy) on `device`.

    `policy`: the (model, tokenizer) of `model_path` already loaded, which the transformers backend
    samples with instead of loading a second copy (vLLM always loads its own). The vllm backend keeps one
    engine per process for each (model, device, dtype): a second call returns the same sampler.
    `kv_cache_bytes` and `threads` are the vllm engine's (vllm_backend.engine_options).
    """
    if backend == "transformers":
        from tokencredit.pipeline.models.loading import load_policy, model_name
        from tokencredit.pipeline.sample.transformers_backend import TransformersSampler

        model, tokenizer = policy or load_policy(model_path, device=device, dtype=dtype,
                                                 trust_remote_code=trust_remote_code)
        return TransformersSampler(model, tokenizer, model_name(model_path))
    if backend == "vllm":
        return _vllm_sampler(model_path, str(device), None if dtype is None else str(dtype), trust_remote_code,
                             kv_cache_bytes, threads)
    raise ValueError(f"unknown sampling backend {backend!r}; choose from {', '.join(BACKENDS)}")


@functools.lru_cache(maxsize=None)
def _vllm_sampler(model_path, device, dtype, trust_remote_code, kv_cache_bytes, threads) -> Sampler:
    from tokencredit.pipeline.sample.vllm_backend import VllmSampler  # the optional engine extras

    return VllmSampler(model_path, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                       kv_cache_bytes=kv_cache_bytes, threads=threads)
