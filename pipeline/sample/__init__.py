"""The sample stage: n responses per prompt with the log-probabilities the sampler saw.

    sampler = make_sampler("transformers", model_path)        # or "vllm" ([cpu-engine] or [gpu] extra)
    samples = sampler.sample(records, SamplingConfig(n=4))    # list[Sample], record order then j

Backends (`transformers_backend`, `vllm_backend`) share `rows` (seeds, prompt rendering, records);
`prompts` lays out sampling and replay prompts, `detokenize` decodes growing responses, `bounds` bounds
what a record can cost before any model runs. Importing this package loads neither torch nor vllm.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

from tokencredit.schemas.records import Sample, TaskRecord

from tokencredit.pipeline.config import SamplingConfig

BACKENDS = ("transformers", "vllm")
_ENGINES: dict[tuple, Sampler] = {}  # the process's vllm engine, by (model, device, dtype, trust_remote_code)
_ENGINES_LOCK = threading.Lock()
_STARTED: list[tuple] = []  # the key of every engine this process started, in order


class Sampler(Protocol):
    def sample(self, records: Sequence[TaskRecord], config: SamplingConfig) -> list[Sample]: ...


def make_sampler(backend: str, model_path: str | None = None, *, device: str = "cpu", dtype=None,
                 trust_remote_code: bool = False, policy: tuple | None = None,
                 kv_cache_bytes: int | None = None, threads: int | None = None) -> Sampler:
    """A sampler for a local policy (None = the shipped tiny policy) on `device`.

    `policy`: the (model, tokenizer) of `model_path` already loaded, which the transformers backend
    samples with instead of loading a second copy (vLLM always loads its own). The vllm backend keeps one
    engine per process: a second call for the same (model, device, dtype) returns the same sampler, a call for
    another stops the previous engine first (`release_sampler` stops it without starting another).
    `kv_cache_bytes` and `threads` are the vllm engine's (vllm_backend.engine_options).
    """
    if backend == "transformers":
        from tokencredit.pipeline.models.loading import load_policy, model_name
        from tokencredit.pipeline.sample.transformers_backend import TransformersSampler

        model, tokenizer = policy or load_policy(model_path, device=device, dtype=dtype,
                                                 trust_remote_code=trust_remote_code)
        return TransformersSampler(model, tokenizer, model_name(model_path))
    if backend == "vllm":
        from tokencredit.pipeline.sample.vllm_backend import VllmSampler, engine_dtype  # the optional engine extras

        key = (model_path, str(device), engine_dtype(dtype), trust_remote_code)  # the first call's KV and threads hold
        with _ENGINES_LOCK:  # shards on threads ask at once
            if key not in _ENGINES:
                _ENGINES[key] = VllmSampler(model_path, device=str(device), dtype=key[2],
                                            trust_remote_code=trust_remote_code, kv_cache_bytes=kv_cache_bytes,
                                            threads=threads, before_start=_stop_engines)
                _STARTED.append(key)
            return _ENGINES[key]
    raise ValueError(f"unknown sampling backend {backend!r}; choose from {', '.join(BACKENDS)}")


def engine_starts() -> int:
    """How many vllm engines this process has started (a Dask worker that keeps its engine across shards: 1)."""
    return len(_STARTED)


def _stop_engines() -> None:
    """One engine per process: engines in one process share vLLM's parallel state, which the one dropped first
    tears down under the others; so the running one stops before another starts."""
    for other in [_ENGINES.pop(key) for key in list(_ENGINES)]:
        other.close()


def is_stopped(sampler) -> bool:
    """Whether `sampler` is a vllm engine stopped since it was made (another engine started, or
    `release_sampler`): a cache that kept it must make it again."""
    return getattr(sampler, "llm", True) is None


def release_sampler(sampler) -> None:
    """Stop a vllm engine `make_sampler` keeps and free its weights and KV cache (a process that scores many
    policies, each on its own engine, releases each after use); a transformers sampler needs nothing."""
    with _ENGINES_LOCK:
        for key in [key for key, kept in _ENGINES.items() if kept is sampler]:
            del _ENGINES[key]
    if hasattr(sampler, "close"):
        sampler.close()


def load_sampler(backend: str, model: str | None, device: str = "cpu"):
    """(sampler, tokenizer) of a run's policy for the stages that continue prefixes (`values`, `repair`): the
    transformers sampler on its own copy of the policy, or the process's vllm engine. backend "auto": vllm where
    an engine for `device` is installed (these stages sample many continuations), else transformers."""
    from tokencredit.pipeline.sample.choice import resolved_backend

    backend = resolved_backend(backend, device)
    if backend == "transformers":
        from tokencredit.pipeline.sample.transformers_backend import load_sampler as load_transformers

        return load_transformers(model, device)
    from tokencredit.pipeline.devices import worker_cores

    sampler = make_sampler(backend, model, device=device, threads=worker_cores())  # a pinned worker: its own cores
    sampler.progress = False
    return sampler, sampler.tokenizer
