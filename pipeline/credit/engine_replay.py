"""MRTPO's leave-one-out replay through the vLLM engine (method.md section 2): the log-prob of each response
token after `P_all` and after each ungated `P_\\k`, read from vLLM's `prompt_logprobs` over prompt + response ids.

    outputs = engine_replay(sampler, items)   # a VllmSampler; per item: log p_t(y_t), log q_t(y_t) per reward

That is all the log-prob relevances need (`logprob_signed`, the default, `logprob_drop`, `logprob_abs`); JS needs
the full distributions and stays on torch (`replay.replay`), as P2T does. The engine runs in its own dtype: in
bfloat16 its log-probs differ from a float32 forward's, and so do the relevances taken from their differences
(docs/engine.md, "Speed and determinism", gives the measured spread per dtype).

Each distinct sequence (prompt + response) is one engine request asking for one new token and the log-prob of
every prompt token; the engine batches and schedules them itself. A `P_\\k` identical to `P_all` gives q = p
without a request, as in the torch replay.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tokencredit.pipeline.credit.replay import ReplayItem, ReplayOutput, ReplayStats, check_items

REQUESTS_PER_CALL = 256  # sequences per `generate` call: the progress bar moves between calls


def engine_replay(engine, items: Sequence[ReplayItem], *, stats: ReplayStats | None = None,
                  on_progress: Callable[[int], None] | None = None) -> list[ReplayOutput]:
    """Replay every item with `engine.llm` (a `vllm.LLM`, taken in turns under `engine.lock` as the sampler
    does); one `ReplayOutput` per item, float32 on CPU, `js` None.

    NaN where nothing was replayed (a gated reward; every reward of an item with an empty response).
    `on_progress(tokens)` is called with the response tokens of the (response, reward) pairs each call finished.
    """
    from vllm import SamplingParams

    stats = stats if stats is not None else ReplayStats()
    out = check_items(items, stats, js=False)
    wanted: dict[tuple[int, ...], int] = {}  # distinct sequence -> its index in `sequences`
    sequences: list[list[int]] = []
    uses: list[tuple[int, int | None, int]] = []  # (item, reward k or None for P_all, sequence index)
    for n, item in enumerate(items):
        if not item.response_ids or all(p is None for p in item.drop_prompt_ids):
            continue
        for k, prompt in [(None, item.all_prompt_ids), *enumerate(item.drop_prompt_ids)]:
            if prompt is None or (k is not None and prompt == item.all_prompt_ids):
                continue
            key = (*prompt, *item.response_ids)
            if key not in wanted:
                wanted[key] = len(sequences)
                sequences.append(list(key))
            uses.append((n, k, wanted[key]))
    # log-probs of the last T tokens of each sequence: its response's
    logprobs: list[torch.Tensor | None] = [None] * len(sequences)
    lengths = {s: len(items[n].response_ids) for n, _, s in uses}
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    for start in range(0, len(sequences), REQUESTS_PER_CALL):
        batch = range(start, min(start + REQUESTS_PER_CALL, len(sequences)))
        with engine.lock:
            results = engine.llm.generate([{"prompt_token_ids": sequences[s]} for s in batch], params,
                                          use_tqdm=False)
        for s, result in zip(batch, results):
            logprobs[s] = response_logprobs(result.prompt_logprobs, sequences[s], lengths[s])
        stats.sequences_forwarded += len(batch)
        stats.tokens_forwarded += sum(len(sequences[s]) for s in batch)
        if on_progress is not None:
            on_progress(sum(lengths[s] for n, k, s in uses if k is not None and s in batch))
    for n, k, s in uses:
        if k is None:
            out[n].logprob_all = logprobs[s]
        else:
            out[n].logprob_drop[k] = logprobs[s]
    same = 0
    for n, item in enumerate(items):  # a P_\k equal to P_all: q = p
        for k, prompt in enumerate(item.drop_prompt_ids):
            if prompt is not None and prompt == item.all_prompt_ids and item.response_ids:
                out[n].logprob_drop[k] = out[n].logprob_all
                same += len(item.response_ids)
    if on_progress is not None and same:
        on_progress(same)
    return out


def response_logprobs(prompt_logprobs, sequence: Sequence[int], T: int) -> torch.Tensor:
    """vLLM's `prompt_logprobs` of `sequence` (None first, then {token id: Logprob} per position) -> [T] float32:
    the log-prob of each of the last T tokens of `sequence` given the tokens before it."""
    if prompt_logprobs is None or len(prompt_logprobs) != len(sequence):
        raise RuntimeError(f"the engine returned {None if prompt_logprobs is None else len(prompt_logprobs)} prompt "
                           f"log-probs for a sequence of {len(sequence)} tokens")
    positions = range(len(sequence) - T, len(sequence))
    return torch.tensor([prompt_logprobs[t][sequence[t]].logprob for t in positions], dtype=torch.float32)
