"""MRTPO's leave-one-out replay (method.md section 2): teacher-force each response after `P_all` and
after each ungated `P_\\k`, and read the next-token distributions at the response positions.

    items = [build_replay_item(tokenizer, task_prompt, sections, response_ids, replay_mask)]
    outputs = replay(model, items, js=True)      # per item: log p_t(y_t), log q_t(y_t) per reward, JS

Cost is kept to the model's forwards:
- items are ordered by prompt, so the responses of one prompt group share a batch; the prompt tokens
  every `P_all` of a batch shares are forwarded once and their KV cache repeated over the batch;
- each `P_\\k` continues from its `P_all`'s KV cache up to their first differing token (the start of
  section k), so only the rest of the feedback block and the response are forwarded again;
- the LM head and the divergences run over `chunk_size` positions at a time from the hidden states, and
  long sequences are forwarded in query chunks, so memory does not grow with T x vocabulary.
Sequences are right-padded (real tokens never attend to the padding that follows them) and masked
cache positions are never attended to, so every row computes exactly its own sequence.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from tokencredit.pipeline.credit.divergence import js_divergence
from tokencredit.pipeline.models.loading import cache_keyword
from tokencredit.pipeline.sample.prompts import prompt_frame, replay_prompt_ids


@dataclass
class ReplayItem:
    all_prompt_ids: list[int]  # P_all
    drop_prompt_ids: list[list[int] | None]  # per reward k: P_\k, None = gated (not replayed)
    response_ids: list[int]  # y, teacher-forced after each prompt


@dataclass
class ReplayOutput:
    """What the replay of one item measured, float32 on CPU."""

    logprob_all: torch.Tensor  # [T] log p_t(y_t), p_t = pi(. | P_all, y_<t)
    logprob_drop: torch.Tensor  # [K, T] log q_t(y_t), q_t = pi(. | P_\k, y_<t); NaN rows where gated
    js: torch.Tensor | None  # [K, T] JS(p_t, q_t) in nats, NaN rows where gated; None unless asked


@dataclass
class ReplayStats:
    replays_done: int = 0  # (response, reward) pairs replayed
    replays_skipped: int = 0  # pairs gated out
    tokens_replayed: int = 0  # response tokens over the replayed pairs
    sequences_forwarded: int = 0  # P_all and P_\k sequences through the model
    tokens_forwarded: int = 0  # tokens through the decoder, cached prefixes not counted
    positions_min: int = 0  # distinct prefix positions of the sequences replayed: the fewest any replay computes
    response_positions: int = 0  # positions whose next-token log-prob is read (each distinct sequence's response)
    tokens_from_cache: int = 0  # positions the engine read from its prefix cache instead of computing them


def replayed_sequences(items: Sequence[ReplayItem]) -> tuple[list[list[int]], list[tuple[int, int | None, int]]]:
    """The distinct sequences (prompt + response) a replay of `items` scores, and its uses: (item, reward k or
    None for P_all, index of the sequence). Items with no response or every reward gated, and a `P_\\k` equal
    to `P_all` (q = p), add none."""
    index: dict[tuple[int, ...], int] = {}
    uses: list[tuple[int, int | None, int]] = []
    for n, item in enumerate(items):
        if not item.response_ids or all(p is None for p in item.drop_prompt_ids):
            continue
        for k, prompt in [(None, item.all_prompt_ids), *enumerate(item.drop_prompt_ids)]:
            if prompt is None or (k is not None and prompt == item.all_prompt_ids):
                continue
            uses.append((n, k, index.setdefault((*prompt, *item.response_ids), len(index))))
    return [list(key) for key in index], uses


def count_positions(stats: ReplayStats, items: Sequence[ReplayItem]) -> tuple[list[list[int]], list]:
    """Adds the fewest positions a replay of `items` can compute, and the response positions it scores; returns
    `replayed_sequences(items)`."""
    sequences, uses = replayed_sequences(items)
    stats.positions_min += distinct_positions(sequences)
    stats.response_positions += sum({s: len(items[n].response_ids) for n, _, s in uses}.values())
    return sequences, uses


def distinct_positions(sequences: Sequence[Sequence[int]]) -> int:
    """How many distinct prefixes (positions) the token sequences hold: a position shared by several sequences'
    common prefix counts once, as the nodes of their trie."""
    nodes: dict[tuple[int, int], int] = {}
    for sequence in sequences:
        node = -1
        for token in sequence:
            node = nodes.setdefault((node, token), len(nodes))
    return len(nodes)


def build_replay_item(tokenizer, task_prompt: str, sections: Sequence[tuple[str, str]],
                      response_ids: Sequence[int], replay_mask: Sequence[bool], ablation: str = "drop") -> ReplayItem:
    """Tokenized `P_all` and `P_\\k` (for every k with replay_mask[k]) in the policy's sampling frame.

    sections: (reward_name, feedback text) per reward in the verifier's order; ablation: `drop` removes
    section k, `null` replaces its text by neutral filler of the same token length.
    """
    if len(replay_mask) != len(sections):
        raise ValueError(f"replay_mask has {len(replay_mask)} entries for {len(sections)} feedback sections")
    frame = prompt_frame(tokenizer, task_prompt)
    all_ids, drops = replay_prompt_ids(tokenizer, frame, sections, replay_mask, ablation)
    return ReplayItem(all_prompt_ids=all_ids, drop_prompt_ids=drops, response_ids=list(response_ids))


MIN_SHARED_PREFIX = 8  # below this many shared tokens a separate prefix forward is not worth it
ATTENTION_BUDGET = 256 * 2**20  # bytes of attention scores per forward call; longer inputs go in query chunks


def shared_prefix_length(seqs: Sequence[tuple[list[int], list[int]]]) -> int:
    """Tokens that every prompt of `seqs` starts with, leaving each prompt at least one token
    (the hidden state that predicts the first response token must come from the suffix)."""
    first = seqs[0][0]
    n = min(len(p) for p, _ in seqs) - 1
    for prompt, _ in seqs[1:]:
        n = next((i for i in range(n) if prompt[i] != first[i]), n)
    return max(n, 0)


def _check_item(n: int, item: ReplayItem) -> None:
    prompts = [("all_prompt_ids", item.all_prompt_ids)]
    prompts += [(f"drop_prompt_ids[{k}]", p) for k, p in enumerate(item.drop_prompt_ids) if p is not None]
    for name, ids in prompts:
        if not ids:
            raise ValueError(f"replay item {n}: {name} is empty; a prompt needs at least one token")


@torch.inference_mode()
def replay(model, items: Sequence[ReplayItem], *, js: bool = False, batch_size: int = 16, chunk_size: int = 128,
           stats: ReplayStats | None = None, on_progress: Callable[[int], None] | None = None) -> list[ReplayOutput]:
    """Replay every item; returns one `ReplayOutput` per item (NaN where nothing was replayed).

    model: a causal LM in eval mode whose logits are lm_head(last hidden state) (Llama, Qwen, Mistral).
    `P_all` is forwarded once per item and shared by its K comparisons; an item with every reward gated
    is not forwarded at all; a `P_\\k` identical to `P_all` gives q = p without a forward.
    `on_progress(tokens)` is called with the response tokens of each replayed batch of pairs.
    """
    if batch_size < 1 or chunk_size < 1:
        raise ValueError(f"batch_size and chunk_size must be >= 1, got {batch_size} and {chunk_size}")
    stats = stats if stats is not None else ReplayStats()
    out = check_items(items, stats, js)
    active = [n for n, it in enumerate(items) if it.response_ids and any(p is not None for p in it.drop_prompt_ids)]
    # by prompt: the items of one prompt group (same task prompt) share a batch and its prefix cache
    active.sort(key=lambda n: (items[n].all_prompt_ids, len(items[n].response_ids)))
    count_positions(stats, items)
    for block in _blocks(items, active, batch_size):
        _replay_block(model, items, block, out, batch_size, chunk_size, stats, on_progress)
    return out


def check_items(items: Sequence[ReplayItem], stats: ReplayStats, js: bool) -> list[ReplayOutput]:
    """ValueError naming the first item with an empty prompt; else one all-NaN `ReplayOutput` per item, and the
    pairs replayed and skipped counted into `stats`."""
    out = []
    for n, item in enumerate(items):
        _check_item(n, item)
        K, T = len(item.drop_prompt_ids), len(item.response_ids)
        done = sum(p is not None for p in item.drop_prompt_ids)
        stats.replays_done += done
        stats.replays_skipped += K - done
        stats.tokens_replayed += done * T
        nan = torch.full((K, T), float("nan"))
        out.append(ReplayOutput(torch.full((T,), float("nan")), nan.clone(), nan.clone() if js else None))
    return out


def replay_distances(model, items: Sequence[ReplayItem], **kwargs) -> list[torch.Tensor]:
    """JS replay distances per item: [K, T] float32 on CPU, NaN rows for gated rewards (the paper's score)."""
    return [o.js for o in replay(model, items, js=True, **kwargs)]


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


def _common_length(a: list[int], b: list[int]) -> int:
    """Tokens `b` shares with `a` from the start, leaving `b` at least one token of its own."""
    limit = min(len(a), len(b) - 1)
    return next((i for i in range(limit) if a[i] != b[i]), limit)


def _replay_block(model, items, block: list[int], out: list[ReplayOutput], batch_size: int, chunk_size: int,
                  stats: ReplayStats, on_progress) -> None:
    """Forward P_all for the items in `block`, then their P_\\k in batches, filling `out`."""
    head = model.get_output_embeddings()
    hidden_all, cache = _forward_all(model, [(items[n].all_prompt_ids, items[n].response_ids) for n in block], stats)
    pairs = []
    for b, n in enumerate(block):
        item, T = items[n], len(items[n].response_ids)
        out[n].logprob_all = token_logprobs(head, hidden_all[b, :T], item.response_ids, chunk_size)
        for k, drop in enumerate(item.drop_prompt_ids):
            if drop == item.all_prompt_ids:  # the same input gives the same distribution
                out[n].logprob_drop[k] = out[n].logprob_all
                if out[n].js is not None:
                    out[n].js[k] = 0.0
            elif drop is not None:
                pairs.append((b, n, k, _common_length(item.all_prompt_ids, drop)))
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start: start + batch_size]
        hidden = _forward_continuations(model, cache, [(b, c, items[n].drop_prompt_ids[k][c:], items[n].response_ids)
                                                       for b, n, k, c in batch], stats)
        for row, (b, n, k, _) in enumerate(batch):
            T, response = len(items[n].response_ids), items[n].response_ids
            out[n].logprob_drop[k] = token_logprobs(head, hidden[row, :T], response, chunk_size)
            if out[n].js is not None:
                out[n].js[k] = js_from_hidden(head, hidden_all[b, :T], hidden[row, :T], chunk_size)
        if on_progress is not None:
            on_progress(sum(len(items[n].response_ids) for _, n, _, _ in batch))


def token_logprobs(head, hidden: torch.Tensor, targets: Sequence[int], chunk_size: int) -> torch.Tensor:
    """log softmax(head(hidden))[t, targets[t]] in float32, `chunk_size` positions at a time -> [T] on CPU."""
    target = torch.tensor(list(targets), device=hidden.device)
    parts = [torch.log_softmax(head(hidden[s: s + chunk_size]).float(), -1)
             .gather(-1, target[s: s + chunk_size, None]).squeeze(-1) for s in range(0, len(target), chunk_size)]
    return torch.cat(parts).cpu() if parts else torch.zeros(0)


def js_from_hidden(head, hidden_p: torch.Tensor, hidden_q: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """JS(softmax(head(hidden_p)), softmax(head(hidden_q))) per position -> [T] float32 on CPU."""
    parts = [js_divergence(head(hidden_p[s: s + chunk_size]), head(hidden_q[s: s + chunk_size]), chunk_size)
             for s in range(0, hidden_p.shape[0], chunk_size)]
    return torch.cat(parts).cpu() if parts else torch.zeros(0)


def _decode(model, ids: torch.Tensor, attention: torch.Tensor | None, positions: torch.Tensor, cache) -> torch.Tensor:
    """Hidden states of `ids` [R, M] after the `cache` (grown in place), in query chunks whose attention
    scores stay within ATTENTION_BUDGET. attention: [R, cached + M], None when every position counts.
    Returns [R, M, d]."""
    decoder, config = model.get_decoder(), model.config.get_text_config(decoder=True)
    R, M = ids.shape
    width = cache.get_seq_length() + M
    step = max(16, ATTENTION_BUDGET // (R * config.num_attention_heads * width * 4))
    hidden = []
    for s in range(0, M, step):
        e = min(M, s + step)
        mask = None if attention is None else attention[:, : width - M + e]
        hidden.append(decoder(input_ids=ids[:, s:e], attention_mask=mask, position_ids=positions[:, s:e],
                              use_cache=True, **{cache_keyword(decoder): cache}).last_hidden_state)
    return torch.cat(hidden, 1)


def _forward_all(model, seqs: Sequence[tuple[list[int], list[int]]], stats: ReplayStats):
    """Forward (P_all, response) rows -> (hidden [B, T_max, d] predicting each response token, the KV cache).

    Row b's cache holds its token j at index j (the shared prefix, then the row's own tokens, right-padded).
    """
    device, B = model.device, len(seqs)
    T = max(len(r) for _, r in seqs)
    shared = shared_prefix_length(seqs)
    shared = shared if shared >= MIN_SHARED_PREFIX and B > 1 else 0
    cache = DynamicCache(config=model.config)
    if shared:
        prefix = torch.tensor([seqs[0][0][:shared]], device=device)
        _decode(model, prefix, None, torch.arange(shared, device=device)[None], cache)
        cache.batch_repeat_interleave(B)
        stats.tokens_forwarded += shared
    rests = [p[shared:] + r for p, r in seqs]
    L = max(len(x) for x in rests)
    ids, attention = _right_padded(rests, L, device)
    attention = torch.cat([torch.ones(B, shared, dtype=torch.long, device=device), attention], 1)
    hidden = _decode(model, ids, attention, torch.arange(shared, shared + L, device=device).expand(B, L), cache)
    stats.sequences_forwarded += B
    stats.tokens_forwarded += sum(len(x) for x in rests)
    return _response_positions(hidden, [len(p) - 1 - shared for p, _ in seqs], T), cache


def _forward_continuations(model, cache, rows: Sequence[tuple[int, int, list[int], list[int]]],
                           stats: ReplayStats) -> torch.Tensor:
    """Each row (b, c, prompt_rest, response) continues P_all row b's cache after its first c tokens.

    Returns hidden [R, T_max, d] predicting each response token. The cache is copied, cropped to the
    longest c, and positions at or past a row's own c are masked out.
    """
    device, R = model.device, len(rows)
    width = max(c for _, c, _, _ in rows)
    index = torch.tensor([b for b, _, _, _ in rows], device=device)
    rows_cache = DynamicCache([(layer.keys[index, :, :width], layer.values[index, :, :width])
                               for layer in cache.layers], config=model.config)
    tails = [rest + response for _, _, rest, response in rows]
    M = max(len(t) for t in tails)
    ids, tail_attention = _right_padded(tails, M, device)
    starts = torch.tensor([c for _, c, _, _ in rows], device=device)
    cached_attention = (torch.arange(width, device=device)[None] < starts[:, None]).long()
    positions = starts[:, None] + torch.arange(M, device=device)
    hidden = _decode(model, ids, torch.cat([cached_attention, tail_attention], 1), positions, rows_cache)
    stats.sequences_forwarded += R
    stats.tokens_forwarded += sum(len(t) for t in tails)
    T = max(len(r) for _, _, _, r in rows)
    return _response_positions(hidden, [len(rest) - 1 for _, _, rest, _ in rows], T)


def _right_padded(seqs: Sequence[list[int]], length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.zeros(len(seqs), length, dtype=torch.long)
    attention = torch.zeros(len(seqs), length, dtype=torch.long)
    for b, seq in enumerate(seqs):
        ids[b, : len(seq)] = torch.tensor(seq)
        attention[b, : len(seq)] = 1
    return ids.to(device), attention.to(device)


def _response_positions(hidden: torch.Tensor, starts: Sequence[int], T: int) -> torch.Tensor:
    """hidden [R, M, d] -> [R, T, d]: row r's positions starts[r] .. starts[r] + T - 1 (clamped at M - 1),
    the ones whose output predicts the response tokens."""
    start = torch.tensor(list(starts), device=hidden.device)
    index = (start[:, None] + torch.arange(T, device=hidden.device)).clamp(max=hidden.shape[1] - 1)
    return hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
