"""MRTPO's leave-one-out replay: d[i,k,t] = JS(pi(. | P_all, y_<t), pi(. | P_\\k, y_<t)) (method.md section 2).

Each response is teacher-forced once after `P_all` and once after each ungated `P_\\k`; only
the response positions go through the LM head. Sequences are right-padded (real tokens never
attend to the padding that follows them, and positions stay correct for each row).

Items are ordered by prompt, so the responses of one prompt group share a batch; the prompt
tokens that every sequence of a batch shares (the task prompt) are forwarded once and their KV
cache is repeated over the batch, and only the rest of each sequence (feedback block and
response) is forwarded per row.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .divergence import js_divergence
from .models import cache_keyword
from .prompts import replay_prompt


@dataclass
class ReplayItem:
    all_prompt_ids: list[int]  # P_all
    drop_prompt_ids: list[list[int] | None]  # per reward k: P_\k, None = gated (not replayed)
    response_ids: list[int]  # y, teacher-forced after each prompt


@dataclass
class ReplayStats:
    replays_done: int = 0  # (response, reward) pairs replayed
    replays_skipped: int = 0  # pairs gated out
    tokens_replayed: int = 0  # response tokens over the replayed pairs
    sequences_forwarded: int = 0  # P_all and P_\k sequences through the model


def _encode(tokenizer, text: str) -> list[int]:
    # the tokenizer's default special tokens (BOS for Llama-style causal LMs), as when sampling
    return list(tokenizer(text)["input_ids"])


def build_replay_item(tokenizer, task_prompt: str, sections: Sequence[tuple[str, str]],
                      response_ids: Sequence[int], replay_mask: Sequence[bool]) -> ReplayItem:
    """Tokenized `P_all` and `P_\\k` for every k with replay_mask[k] (the others stay None).

    sections: (reward_name, feedback) per reward in the verifier's order.
    """
    if len(replay_mask) != len(sections):
        raise ValueError(f"replay_mask has {len(replay_mask)} entries for {len(sections)} feedback sections")
    drops = [_encode(tokenizer, replay_prompt(task_prompt, sections, drop=k)) if replay else None
             for k, replay in enumerate(replay_mask)]
    return ReplayItem(all_prompt_ids=_encode(tokenizer, replay_prompt(task_prompt, sections)),
                      drop_prompt_ids=drops, response_ids=list(response_ids))


MIN_SHARED_PREFIX = 8  # below this many shared tokens a separate prefix forward is not worth it


def shared_prefix_length(seqs: Sequence[tuple[list[int], list[int]]]) -> int:
    """Tokens that every prompt of `seqs` starts with, leaving each prompt at least one token
    (the hidden state that predicts the first response token must come from the suffix)."""
    first = seqs[0][0]
    n = min(len(p) for p, _ in seqs) - 1
    for prompt, _ in seqs[1:]:
        n = next((i for i in range(n) if prompt[i] != first[i]), n)
    return max(n, 0)


def response_logits(model, seqs: Sequence[tuple[list[int], list[int]]],
                    min_shared_prefix: int = MIN_SHARED_PREFIX) -> torch.Tensor:
    """Logits predicting each response token, for a batch of (prompt_ids, response_ids).

    Returns [B, T_max, V] in the model's dtype on its device; row b is valid for t < len(response_b).
    The shared prompt prefix (`shared_prefix_length`) is forwarded once, its KV cache repeated
    over the batch; the remaining tokens are right-padded (real tokens never attend to the
    padding that follows them). The logits predicting response token t sit at index
    len(prompt) + t - 1, so the hidden states are sliced there before the LM head: no [B, L, V]
    tensor for the prompt part. Assumes logits = lm_head(last hidden state), as in Llama, Qwen
    and Mistral.
    """
    device, decoder = model.device, model.get_decoder()
    B, T = len(seqs), max(len(r) for _, r in seqs)
    shared = shared_prefix_length(seqs)
    cache = {}
    if shared >= min_shared_prefix:
        prefix = torch.tensor([seqs[0][0][:shared]], device=device)
        cache = {cache_keyword(decoder): DynamicCache(config=model.config)}  # filled in place
        decoder(input_ids=prefix, use_cache=True, **cache)
        next(iter(cache.values())).batch_repeat_interleave(B)
    else:
        shared = 0
    L = max(len(p) + len(r) for p, r in seqs) - shared
    ids = torch.zeros(B, L, dtype=torch.long)
    attention = torch.zeros(B, shared + L, dtype=torch.long)
    for b, (prompt, response) in enumerate(seqs):
        rest = prompt[shared:] + response
        ids[b, : len(rest)] = torch.tensor(rest)
        attention[b, : shared + len(rest)] = 1
    hidden = decoder(input_ids=ids.to(device), attention_mask=attention.to(device),
                     position_ids=torch.arange(shared, shared + L, device=device).expand(B, L),
                     use_cache=bool(cache), **cache).last_hidden_state
    starts = torch.tensor([len(p) - 1 - shared for p, _ in seqs], device=device)
    index = (starts[:, None] + torch.arange(T, device=device)).clamp(max=L - 1)
    return model.get_output_embeddings()(hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1])))


def _check_item(n: int, item: ReplayItem) -> None:
    prompts = [("all_prompt_ids", item.all_prompt_ids)]
    prompts += [(f"drop_prompt_ids[{k}]", p) for k, p in enumerate(item.drop_prompt_ids) if p is not None]
    for name, ids in prompts:
        if not ids:
            raise ValueError(f"replay item {n}: {name} is empty; a prompt needs at least one token")


@torch.inference_mode()
def replay_distances(model, items: Sequence[ReplayItem], *, batch_size: int = 16, chunk_size: int = 128,
                     stats: ReplayStats | None = None,
                     on_progress: Callable[[int], None] | None = None) -> list[torch.Tensor]:
    """Replay distances per item: [K, T] float32 on CPU, NaN rows for gated rewards.

    model: a causal LM in eval mode. `P_all` is forwarded once per item and shared by its K
    comparisons; an item with every reward gated is not forwarded at all. A `P_\\k` identical
    to `P_all` gives d = 0 without a forward (the same input gives the same distribution).
    Counts are added to `stats` when given; `on_progress(tokens)` is called after each block
    of items with the response tokens it replayed (summed over its ungated rewards).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    stats = stats if stats is not None else ReplayStats()
    out = [torch.full((len(it.drop_prompt_ids), len(it.response_ids)), float("nan")) for it in items]
    for n, item in enumerate(items):
        _check_item(n, item)
        done = sum(p is not None for p in item.drop_prompt_ids)
        stats.replays_done += done
        stats.replays_skipped += len(item.drop_prompt_ids) - done
        stats.tokens_replayed += done * len(item.response_ids)
    active = [n for n, it in enumerate(items) if it.response_ids and any(p is not None for p in it.drop_prompt_ids)]
    # by prompt: the items of one prompt group (same task prompt) share a batch and its prefix cache
    active.sort(key=lambda n: (items[n].all_prompt_ids, len(items[n].response_ids)))
    for block in _blocks(items, active, batch_size):
        _replay_block(model, items, block, out, batch_size, chunk_size, stats)
        if on_progress is not None:
            on_progress(sum(len(items[n].response_ids) * sum(p is not None for p in items[n].drop_prompt_ids)
                            for n in block))
    return out


def _blocks(items: Sequence[ReplayItem], ordered: list[int], batch_size: int) -> list[list[int]]:
    """Consecutive runs of at most `batch_size` items whose P_all share a prefix worth caching."""
    blocks: list[list[int]] = []
    for n in ordered:
        if blocks and len(blocks[-1]) < batch_size and shared_prefix_length(
                [(items[blocks[-1][0]].all_prompt_ids, []), (items[n].all_prompt_ids, [])]) >= MIN_SHARED_PREFIX:
            blocks[-1].append(n)
        else:
            blocks.append([n])
    return blocks


def _replay_block(model, items, block: list[int], out: list[torch.Tensor], batch_size: int,
                  chunk_size: int, stats: ReplayStats) -> None:
    """Forward P_all for the items in `block`, then their P_\\k in batches, filling `out`."""
    reference = response_logits(model, [(items[n].all_prompt_ids, items[n].response_ids) for n in block])
    stats.sequences_forwarded += len(block)
    pairs = []
    for b, n in enumerate(block):
        for k, drop in enumerate(items[n].drop_prompt_ids):
            if drop == items[n].all_prompt_ids:
                out[n][k] = 0.0
            elif drop is not None:
                pairs.append((b, n, k))
    pairs.sort(key=lambda p: items[p[1]].drop_prompt_ids[p[2]])
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        logits = response_logits(model, [(items[n].drop_prompt_ids[k], items[n].response_ids) for _, n, k in batch])
        stats.sequences_forwarded += len(batch)
        for row, (b, n, k) in enumerate(batch):
            T = len(items[n].response_ids)
            out[n][k] = js_divergence(reference[b, :T], logits[row, :T], chunk_size).cpu()
