"""MRTPO's leave-one-out replay: d[i,k,t] = JS(pi(. | P_all, y_<t), pi(. | P_\\k, y_<t)) (method.md section 2).

Each response is teacher-forced once after `P_all` and once after each ungated `P_\\k`; only
the response positions go through the LM head. Sequences are right-padded (real tokens never
attend to the padding that follows them, and positions 0..L-1 stay correct for each row) and
sorted by length so that a batch wastes little on padding.

Not done: reuse of the shared task-prompt prefix's KV cache. The prefix differs between the
responses of a batch, so reusing it means one cache per prompt group expanded over its K + 1
sequences, which caps a batch at K + 1 sequences; plain batching across responses is kept instead.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .divergence import js_divergence
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


def response_logits(model, seqs: Sequence[tuple[list[int], list[int]]]) -> torch.Tensor:
    """Logits predicting each response token, for a batch of (prompt_ids, response_ids).

    Returns [B, T_max, V] in the model's dtype on its device; row b is valid for t < len(response_b).
    The logits predicting response token t sit at sequence index len(prompt) + t - 1, so the
    hidden states are sliced there before the LM head: no [B, L, V] tensor for the prompt part.
    Assumes logits = lm_head(last hidden state), as in Llama, Qwen and Mistral.
    """
    B, L = len(seqs), max(len(p) + len(r) for p, r in seqs)
    T = max(len(r) for _, r in seqs)
    ids = torch.zeros(B, L, dtype=torch.long)
    attention = torch.zeros(B, L, dtype=torch.long)
    for b, (prompt, response) in enumerate(seqs):
        ids[b, : len(prompt) + len(response)] = torch.tensor(prompt + response)
        attention[b, : len(prompt) + len(response)] = 1
    device = model.device
    hidden = model.get_decoder()(input_ids=ids.to(device), attention_mask=attention.to(device),
                                 position_ids=torch.arange(L, device=device).expand(B, L),
                                 use_cache=False).last_hidden_state
    starts = torch.tensor([len(p) - 1 for p, _ in seqs], device=device)
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
                     stats: ReplayStats | None = None) -> list[torch.Tensor]:
    """Replay distances per item: [K, T] float32 on CPU, NaN rows for gated rewards.

    model: a causal LM in eval mode. `P_all` is forwarded once per item and shared by its K
    comparisons; an item with every reward gated is not forwarded at all. A `P_\\k` identical
    to `P_all` gives d = 0 without a forward (the same input gives the same distribution).
    Counts are added to `stats` when given.
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
    active.sort(key=lambda n: len(items[n].all_prompt_ids) + len(items[n].response_ids))
    for start in range(0, len(active), batch_size):
        _replay_block(model, items, active[start : start + batch_size], out, batch_size, chunk_size, stats)
    return out


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
    pairs.sort(key=lambda p: len(items[p[1]].drop_prompt_ids[p[2]]) + len(items[p[1]].response_ids))
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        logits = response_logits(model, [(items[n].drop_prompt_ids[k], items[n].response_ids) for _, n, k in batch])
        stats.sequences_forwarded += len(batch)
        for row, (b, n, k) in enumerate(batch):
            T = len(items[n].response_ids)
            out[n][k] = js_divergence(reference[b, :T], logits[row, :T], chunk_size).cpu()
