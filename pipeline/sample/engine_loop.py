"""The one way into a process's vLLM engine: a call's requests are added and the engine stepped until they finish,
one call at a time.

    loop = EngineLoop(llm)
    outputs = loop.run(prompts, params)   # on any thread; the RequestOutputs of these prompts, in their order

One call at a time, on purpose: the engine's float32 log-probs depend in their last bits on which requests share
a batch (1e-7 measured, tests/test_engine_fed.py), so a call batched with whatever another thread added would
make a run's bytes depend on thread timing. What the engine batches together is chosen by the caller instead:
`annotate` and `repair` hand it the requests of a whole window of shards (`shard_windows`), enough to fill its
batch.
Against `LLM.generate`: progress per finished request, and a call that is interrupted aborts its requests, so
the engine is left empty for the next one.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

ENGINE_SEQUENCES = {"cpu": 256, "cuda": 1024}  # vLLM's default max_num_seqs offline (CUDA: an H100 or larger)


def engine_window(sequences_per_shard: int, device: str, batch: int | None = None) -> int:
    """How many shards' sequences fill a batch of `batch` sequences (None: the engine's, `max_num_seqs`, on
    `device`); at least one shard."""
    batch = batch or ENGINE_SEQUENCES.get(device.split(":")[0], 256)
    return max(batch // max(sequences_per_shard, 1), 1)


def shard_windows(n_shards: int, sequences_per_shard: int, backend: str, device: str,
                  batch: int | None = None) -> list[list[int]]:
    """The shards sampled together, consecutive: with the vllm backend as many as fill the engine's batch
    (`engine_window`), with transformers one (its batches are its own). Fixed by the config alone: a resumed run
    samples each window as the uninterrupted run did, the same requests batched together, so it writes the same
    bytes (the engine's log-probs depend in their last bits on what shares a batch)."""
    size = engine_window(sequences_per_shard, device, batch) if backend == "vllm" else 1
    return [list(range(start, min(start + size, n_shards))) for start in range(0, n_shards, size)]


class EngineLoop:
    """Runs calls on one `vllm.LLM`, one at a time; thread-safe."""

    def __init__(self, llm):
        self.llm = llm
        self.lock = threading.Lock()
        self.peak_requests = 0  # the most requests one call put in the engine

    def run(self, prompts: Sequence[dict], params, lora_request=None,
            on_finished: Callable[[object], None] | None = None) -> list:
        """The finished `RequestOutput` of each prompt (a `{"prompt_token_ids": [...]}`), in the prompts' order.

        `params`: one SamplingParams or one per prompt. `on_finished(output)` is called as each request finishes."""
        if not prompts:
            return []
        with self.lock:
            # enqueue answers the engine's internal ids ("7-1a2b3c4d"); outputs carry the LLM's own ("7")
            ids = [i.split("-")[0] for i in self.llm.enqueue(list(prompts), params, lora_request=lora_request,
                                                             use_tqdm=False)]
            self.peak_requests = max(self.peak_requests, len(ids))
            outputs = {}
            try:
                while len(outputs) < len(ids):
                    for output in self.llm.llm_engine.step():
                        if output.finished:
                            outputs[output.request_id] = output
                            if on_finished is not None:
                                on_finished(output)
            except BaseException:
                left = [i for i in ids if i not in outputs]
                if left:
                    self.llm.llm_engine.abort_request(left)
                raise
        return [outputs[i] for i in ids]
