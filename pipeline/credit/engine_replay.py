"""MRTPO's leave-one-out replay through the vLLM engine (method.md section 2): the log-prob of each response
token after `P_all` and after each ungated `P_\\k`, read from vLLM's `prompt_logprobs` over prompt + response ids.

    outputs = engine_replay(sampler, items)   # a VllmSampler; per item: log p_t(y_t), log q_t(y_t) per reward

That is all the log-prob relevances need (`logprob_signed`, the default, `logprob_drop`, `logprob_abs`); JS needs
the full distributions and stays on torch (`replay.replay`), as P2T does. The engine runs in its own dtype: in
bfloat16 its log-probs differ from a float32 forward's, and so do the relevances taken from their differences
(docs/engine.md, "Speed and determinism", gives the measured spread per dtype).

Each distinct sequence (prompt + response) is one engine request asking for one new token and the log-prob of
every prompt token it computes. Each position is computed once: the requests read the engine's prefix cache
(`skip_reading_prefix_cache=False`), so a `P_\\k` reuses the blocks of the prompt it shares with `P_all`, and
every sequence the task prompt's blocks that sampling left. vLLM scores only the positions it computed (the rows
before `num_cached_tokens` are left unset, vLLM PR #42245): a response log-prob is taken from the sequence that
computed its position (the same prefix gives the same position), and a sequence whose response positions were
all read from an earlier call's cache is asked again without reading it. A `P_\\k` identical to `P_all` gives
q = p without a request.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from tokencredit.pipeline.credit.replay import ReplayItem, ReplayOutput, ReplayStats, check_items, count_positions

REQUESTS_PER_CALL = 256  # sequences per engine call: the progress bar moves between calls


def engine_replay(engine, items: Sequence[ReplayItem], *, stats: ReplayStats | None = None,
                  on_progress: Callable[[int], None] | None = None) -> list[ReplayOutput]:
    """Replay every item through `engine.engine_loop()` (a VllmSampler's, fed beside the shards sampling on other
    threads); one `ReplayOutput` per item, float32 on CPU, `js` None.

    NaN where nothing was replayed (a gated reward; every reward of an item with an empty response).
    `on_progress(tokens)` is called with the response tokens of the (response, reward) pairs each call finished.
    """
    stats = stats if stats is not None else ReplayStats()
    out = check_items(items, stats, js=False)
    sequences, uses = count_positions(stats, items)
    lengths = {s: len(items[n].response_ids) for n, _, s in uses}
    scored = PositionLogprobs()
    for start in range(0, len(sequences), REQUESTS_PER_CALL):
        batch = range(start, min(start + REQUESTS_PER_CALL, len(sequences)))
        _score(engine, [sequences[s] for s in batch], scored, stats, read_cache=True)
        again = [s for s in batch if scored.missing(sequences[s], lengths[s])]
        if again:  # their response positions were read from blocks an earlier call computed
            _score(engine, [sequences[s] for s in again], scored, stats, read_cache=False)
        if on_progress is not None:
            on_progress(sum(lengths[s] for n, k, s in uses if k is not None and start <= s < batch.stop))
    for n, k, s in uses:
        logprobs = scored.response(sequences[s], lengths[s])
        if k is None:
            out[n].logprob_all = logprobs
        else:
            out[n].logprob_drop[k] = logprobs
    same = 0
    for n, item in enumerate(items):  # a P_\k equal to P_all: q = p
        for k, prompt in enumerate(item.drop_prompt_ids):
            if prompt is not None and prompt == item.all_prompt_ids and item.response_ids:
                out[n].logprob_drop[k] = out[n].logprob_all
                same += len(item.response_ids)
    if on_progress is not None and same:
        on_progress(same)
    return out


def _score(engine, sequences: Sequence[list[int]], scored: PositionLogprobs, stats: ReplayStats,
           read_cache: bool) -> None:
    """One engine call over `sequences`; the log-prob of every position each computed goes into `scored`."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False,
                            skip_reading_prefix_cache=not read_cache)
    results = engine.engine_loop().run([{"prompt_token_ids": sequence} for sequence in sequences], params)
    for sequence, result in zip(sequences, results):
        cached = max(result.num_cached_tokens or 0, 0) if read_cache else 0
        scored.add(sequence, result.prompt_logprobs, cached)
        stats.sequences_forwarded += 1
        stats.tokens_forwarded += len(sequence) - cached
        stats.tokens_from_cache += cached


class PositionLogprobs:
    """The log-prob of each position's token given the tokens before it, keyed by the position's prefix (a node of
    the sequences' trie): a position computed for one sequence serves every sequence that shares its prefix."""

    def __init__(self):
        self.nodes: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        self.logprob: dict[int, float] = {}  # node -> log p(its token | its prefix)

    def path(self, sequence: Sequence[int]) -> list[int]:
        node, path = -1, []
        for token in sequence:
            node = self.nodes.setdefault((node, token), len(self.nodes))
            path.append(node)
        return path

    def add(self, sequence: Sequence[int], prompt_logprobs, cached: int) -> None:
        """vLLM's `prompt_logprobs` of `sequence` (None first, then {token id: Logprob} per position). Row t is
        valid only for t > `cached`: the positions up to the cached prefix were not computed in this request."""
        if prompt_logprobs is None or len(prompt_logprobs) != len(sequence):
            raise RuntimeError(f"the engine returned {None if prompt_logprobs is None else len(prompt_logprobs)} "
                               f"prompt log-probs for a sequence of {len(sequence)} tokens")
        path = self.path(sequence)
        for t in range(max(cached, 0) + 1, len(sequence)):
            self.logprob.setdefault(path[t], prompt_logprobs[t][sequence[t]].logprob)

    def missing(self, sequence: Sequence[int], T: int) -> bool:
        """Whether a response position of `sequence` (its last T) has no computed log-prob yet."""
        return any(node not in self.logprob for node in self.path(sequence)[-T:])

    def response(self, sequence: Sequence[int], T: int) -> torch.Tensor:
        """[T] float32: the log-prob of each of the last T tokens of `sequence` given the tokens before it."""
        return torch.tensor([self.logprob[node] for node in self.path(sequence)[-T:]], dtype=torch.float32)
