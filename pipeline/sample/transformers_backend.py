"""Sample n responses per prompt, reproducibly, with the log-probabilities the sampler saw.

The tokens of response (record, j) depend only on (seed, record id, j): each row of a batch draws one
uniform per decoding step from its own CPU `torch.Generator`, seeded from a SHA-256 of those three
values, and picks its token by inverting the CDF of its own distribution. So a record sampled alone,
in another batch, in another shard or in a resumed run gets the same draws. Batch shape changes the
logits in their last float bits (the samples of a prompt share one prefill, rows are padded to the
longest prompt, finished rows leave the decode batch, so what the model sees depends on its
neighbours); where a draw falls within such a change of a boundary of the CDF the token differs, and
the response goes on from there (README, "The dataset": 4 of 48 SmolLM2 responses between shard
sizes 12 and 2). The same batches, as a resumed or repeated run of one config has, give the same bytes.

`sample_logprobs[t]` is log-softmax of the RAW logits (no temperature, no top-p) at the chosen token:
what a later teacher-forced forward of prompt + response reproduces, and what off-policy ratios need.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import DynamicCache

from tokencredit.schemas.records import Sample, TaskRecord

from tokencredit.pipeline.config import SamplingConfig
from tokencredit.pipeline.sample.detokenize import StopChecker
from tokencredit.pipeline.models.loading import cache_keyword
from tokencredit.pipeline.progress import Progress
from tokencredit.pipeline.sample.rows import Row, build_sample, check_records, render_prompt, row_seed

# The sampler's rows per forward when SamplingConfig.batch_size is None. Seconds per SmolLM2-135M token of flat
# sampling on the shared 2-core CPU (bench/bench_tree.py --quick, now part of bench/bench_sampling.py): batch 16
# 0.0218, 32 0.0138, 64 0.0103, 128 0.0108, 256 0.0110 (the issue measured 32 at 1.32x 128's time): past 64 the
# time is flat, and 128 keeps the margin where prompts are short; larger batches only hold more memory.
AUTO_BATCH = 128
# Bytes the KV caches and logits of one batch may take when SamplingConfig.batch_size is None. A fixed budget, not
# a share of the memory free at the time: the batch a row is sampled in moves its logits' last bits and so its
# tokens, so the batches must follow from the config and the model alone. Sized from the free memory (a quarter of
# it), a run beside other jobs with under 6 GiB free sampled 24 SmolLM2 prompts x 4 (128 new tokens) in batches of
# 64 instead of one of 96, and 7 of the 96 responses came out other tokens from token 5 to 114 on (docs/engine.md,
# "Speed and determinism"). A batch too large for a busy machine's memory now fails loudly; `--batch-size` sets one.
AUTO_BATCH_BYTES = 4 << 30


def auto_batch(model, context_tokens: int) -> int:
    """Rows per forward for `model` with responses of up to `context_tokens` (prompt + response): AUTO_BATCH,
    or the largest power of two whose KV cache and logits fit AUTO_BATCH_BYTES when that is fewer."""
    config = model.config
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    width = next(model.parameters()).element_size()
    per_row = 2 * layers * heads * head_dim * width * context_tokens + 4 * 4 * config.vocab_size
    rows = int(AUTO_BATCH_BYTES // per_row)
    return max(1, min(AUTO_BATCH, 1 << max(0, rows.bit_length() - 1)))


# Tokens whose order is sorted first when sampling; the rest of the vocabulary is sorted only for the rows
# whose draw falls beyond them (see `choose_tokens`).
TOP_K = 64


def choose_tokens(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """logits [B, V] raw, uniforms [B] in [0, 1) -> token ids [B].

    Greedy when temperature == 0; else softmax(logits / temperature) restricted to the nucleus (the
    smallest set of most likely tokens whose mass reaches top_p), sampled by inverse CDF with `uniforms`
    over the tokens sorted by probability (ties: lower id first). On CPU the sort covers the TOP_K most
    likely tokens first and the full vocabulary only for the rows the top-k cannot decide, with the very
    same tokens as sorting everything (`_choose_in_top_k` says why).
    """
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    if probs.device.type != "cpu":  # the exactness argument rests on CPU's sequential cumsum
        return _choose_in_sorted(probs, uniforms, top_p)
    chosen, decided = _choose_in_top_k(probs, uniforms, top_p, TOP_K)
    if not decided.all():
        rows = (~decided).nonzero().squeeze(-1)
        chosen[rows] = _choose_in_sorted(probs[rows], uniforms[rows], top_p)
    return chosen


def _choose_in_sorted(probs: torch.Tensor, uniforms: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [B, V], uniforms [B] -> token ids [B]: inverse CDF over the fully sorted vocabulary."""
    probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    if top_p < 1:  # at top_p == 1 rounding in the cumsum must not cut the tail
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p, 0.0)  # the top token always stays
    cdf = probs.cumsum(-1)
    pick = (cdf <= uniforms[:, None] * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)
    return order.gather(-1, pick[:, None]).squeeze(-1)


def _choose_in_top_k(probs: torch.Tensor, uniforms: torch.Tensor, top_p: float,
                     k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """probs [B, V] on CPU -> (token ids [B], decided [B]): where `decided`, the token `_choose_in_sorted`
    picks, found by sorting only the k + 1 most likely tokens.

    Why the tokens agree: CPU's cumsum adds in order, so the cumsum of the sorted top k + 1 is bit for bit
    the first k + 1 entries of the full one. A token's identity is certain where its probability is above
    the (k + 1)-th (ties at the cut may hold other ids). Nucleus: the mask test is monotone along the sorted
    order, so if the (k + 1)-th is masked so is every later token, and the masked total is the last prefix
    entry exactly. Full vocabulary (top_p == 1): the total is a sum over all V, whose float64 rounding
    depends on the order; it is bracketed by a bound on that rounding, and the row is decided when both
    ends of the bracket give the same pick.
    """
    values, ids = torch.topk(probs, min(k + 1, probs.shape[-1]), dim=-1)
    ids, by_id = ids.sort(dim=-1)  # then a stable sort by probability puts equal ones in id order, as the full sort
    values, by_value = values.gather(-1, by_id).sort(dim=-1, descending=True, stable=True)
    ids = ids.gather(-1, by_value)
    certain = (values > values[:, -1:]).sum(-1)  # leading positions whose token id is certain
    if top_p < 1:
        masked = values.cumsum(-1) - values >= top_p
        values = values.masked_fill(masked, 0.0)
        cdf = values.cumsum(-1)
        low = high = cdf[:, -1]
        decided = masked[:, -1]
    else:
        cdf = values.cumsum(-1)
        total = probs.sum(-1, dtype=torch.float64)
        # twice the widest float64 rounding gap between two orders of summing V terms
        slack = total * probs.shape[-1] * 2.0 ** -51
        low, high = (total - slack).float(), (total + slack).float()
        decided = torch.ones_like(certain, dtype=torch.bool)
    pick = (cdf <= (uniforms * low)[:, None]).sum(-1)
    decided &= (pick == (cdf <= (uniforms * high)[:, None]).sum(-1)) & (pick < certain)
    return ids.gather(-1, pick.clamp(max=ids.shape[-1] - 1)[:, None]).squeeze(-1), decided


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> input_ids [B, L], attention_mask [B, L], position_ids [B, L] (0 at each row's first real token)."""
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, length - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[b, length - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def eos_token_ids(model, tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id}
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(generation_eos) if isinstance(generation_eos, (list, tuple)) else {generation_eos}
    return ids - {None}


# Called before each decoding step with the active rows and their logits [B, V]: the rows that take each one's
# place in the batch ([row] to go on; several to branch there, each drawing the next token from the same
# logits and cache; [] to end it), or None when no row changes this step.
Split = Callable[[list[Row], torch.Tensor], "list[list[Row]] | None"]


class TransformersSampler:
    """Batched sampling with a Hugging Face causal LM: left padding, a KV cache, one token per step.

    `prefilled_tokens` counts the prompt tokens fed to the model at once (each distinct prompt of a batch
    once), `decoded_tokens` the tokens fed one step at a time: what sharing a prefix saves shows in both."""

    def __init__(self, model, tokenizer, name: str, *, progress: bool = True):
        self.model, self.tokenizer, self.name, self.progress = model, tokenizer, name, progress
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids, default=0)
        self.cache_arg = cache_keyword(model)
        self.prefilled_tokens = self.decoded_tokens = 0

    def sample(self, records: Sequence[TaskRecord], config: SamplingConfig) -> list[Sample]:
        check_records(records)
        if config.tree is not None:
            from tokencredit.pipeline.sample.tree import sample_trees

            return sample_trees(self, records, config)
        prompts = {r.id: render_prompt(self.tokenizer, r.prompt) for r in records}
        rows = [(r, j) for r in records for j in range(config.n)]
        samples, size = [], self.batch_rows(config, max(len(p[1]) for p in prompts.values()))
        with Progress("sampling", total=len(rows), unit="response", enabled=self.progress) as bar:
            for start in range(0, len(rows), size):
                batch = rows[start: start + size]
                tokens, logprobs = self.generate([prompts[r.id][1] for r, _ in batch],
                                                 [row_seed(config.seed, r.id, j) for r, j in batch], config)
                samples += [build_sample(r, j, prompts[r.id], t, lp, self.tokenizer, self.name, config.seed)
                            for (r, j), t, lp in zip(batch, tokens, logprobs)]
                bar.update(len(batch), tokens=sum(map(len, tokens)))
        return samples

    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int],
                 config: SamplingConfig) -> tuple[list[list[int]], list[list[float]]]:
        """One batch: prompt ids per row and a seed per row -> (response ids, raw log-probs) per row.

        A row ends at eos (kept), at the token completing a stop string (kept), or at max_new_tokens.
        Rows with the same prompt share one prefill (its KV cache is copied to each), and a row that
        ends leaves the decode batch. Both change the batch the model sees, so a row's logits can move
        in the last float bits against decoding it alone, never its draws (its own generator).
        """
        rows = [self.row(seed, config.max_new_tokens, StopChecker(self.tokenizer, config.stop)) for seed in seeds]
        self.decode(prompts, rows, config)
        return [row.tokens for row in rows], [row.logprobs for row in rows]

    def batch_rows(self, config: SamplingConfig, prompt_tokens: int) -> int:
        """`config.batch_size`, or `auto_batch`'s choice for prompts of up to `prompt_tokens`."""
        return config.batch_size or auto_batch(self.model, prompt_tokens + config.max_new_tokens)

    @staticmethod
    def row(seed: int, limit: int, stop: StopChecker) -> Row:
        return Row(torch.Generator().manual_seed(seed), stop, limit)  # CPU: same draws on any device

    @torch.inference_mode()
    def decode(self, prompts: Sequence[Sequence[int]], rows: list[Row], config: SamplingConfig,
               split: Split | None = None) -> list[Row]:
        """Decode `rows` (row i after `prompts[i]`) until each ends; -> every row that ended, in the order they
        ended (with `split`, rows that branched are replaced by theirs). Temperature and top-p: `config`'s.

        Each distinct prompt is prefilled once and its KV cache copied to its rows; a split copies a row's
        cache to the rows that replace it (`DynamicCache.batch_select_indices` with repeated indices)."""
        device = self.model.device
        distinct = {tuple(p): i for i, p in enumerate(dict.fromkeys(map(tuple, prompts)))}
        ids, mask, positions = (t.to(device) for t in left_pad(list(distinct), self.pad_id))
        self.prefilled_tokens += sum(map(len, distinct))
        cache = DynamicCache(config=self.model.config)
        logits = self._last_logits(ids, mask, positions, cache)
        index = torch.tensor([distinct[tuple(p)] for p in prompts], device=device)  # each row's prompt
        active, ended = list(rows), []
        while True:
            replaced = split(active, logits) if split is not None else None
            if replaced is not None:
                kept = torch.tensor([i for i, kids in enumerate(replaced) for _ in kids], dtype=torch.long,
                                    device=device)
                index = kept if index is None else index[kept]
                active = [kid for kids in replaced for kid in kids]
                if not active:
                    break
            if index is not None:  # the rows' caches, from the rows they continue
                cache.batch_select_indices(index)
                logits, mask, positions = logits[index], mask[index], positions[index]
                index = None
            uniforms = torch.cat([torch.rand(1, generator=row.generator) for row in active]).to(device)
            chosen = choose_tokens(logits, uniforms, config.temperature, config.top_p)
            chosen_logprobs = torch.log_softmax(logits, -1).gather(-1, chosen[:, None]).squeeze(-1)
            going = []
            for i, (row, token, logprob) in enumerate(zip(active, chosen.tolist(), chosen_logprobs.tolist())):
                row.tokens.append(token)
                row.logprobs.append(logprob)
                if token in self.eos_ids or row.stop.add(token) or len(row.tokens) >= row.limit:
                    ended.append(row)
                else:
                    going.append(i)
            if not going:
                break
            if len(going) < len(active):
                keep = torch.tensor(going, device=device)
                cache.batch_select_indices(keep)
                chosen, mask, positions = chosen[keep], mask[keep], positions[keep]
                active = [active[i] for i in going]
            mask = torch.cat([mask, mask.new_ones(len(active), 1)], -1)
            positions = positions[:, -1:] + 1
            self.decoded_tokens += len(active)
            logits = self._last_logits(chosen[:, None], mask, positions, cache)
        return ended

    def _last_logits(self, ids, mask, positions, cache) -> torch.Tensor:
        """Feed ids [B, S]; -> float32 logits [B, V] of the last position. `cache` grows in place."""
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self.cache_arg: cache})
        return out.logits[:, -1].float()


def load_sampler(model: str | None, device: str = "cpu"):
    """(sampler, tokenizer) of the run's policy: the transformers sampler, whose `generate` continues a prefix."""
    from tokencredit.pipeline.models.loading import load_policy, model_name

    policy, tokenizer = load_policy(model, device=device)
    return TransformersSampler(policy, tokenizer, model_name(model), progress=False), tokenizer
