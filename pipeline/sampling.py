"""Sample n responses per prompt, reproducibly, with the log-probabilities the sampler saw.

The tokens of response (record, j) depend only on (seed, record id, j): each row of a batch draws one
uniform per decoding step from its own CPU `torch.Generator`, seeded from a SHA-256 of those three
values, and picks its token by inverting the CDF of its own distribution. So a record sampled alone,
in another batch, in another shard or in a resumed run gets the same tokens (batch shape changes the
logits only in the last float bits).

`sample_logprobs[t]` is log-softmax of the RAW logits (no temperature, no top-p) at the chosen token:
what a later teacher-forced forward of prompt + response reproduces, and what off-policy ratios need.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

import torch
from transformers import DynamicCache

from schemas.records import RecordError, Sample, TaskRecord

from .config import SamplingConfig
from .models import cache_keyword, load_policy, model_name
from .progress import Progress
from .prompts import sampling_prompt

BACKENDS = ("transformers", "vllm")


class Sampler(Protocol):
    def sample(self, records: Sequence[TaskRecord], config: SamplingConfig) -> list[Sample]: ...


def row_seed(seed: int, record_id: str, j: int) -> int:
    """Seed of response j of a record: stable across processes (unlike Python's salted `hash`)."""
    digest = hashlib.sha256(f"{seed}\x00{record_id}\x00{j}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # < 2**63: fits every generator's seed


def render_prompt(tokenizer, task_prompt: str) -> tuple[str, list[int]]:
    """(prompt text, the exact token ids fed to the model): the chat template when the tokenizer has
    one, else the replay-compatible `sampling_prompt` layout."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": task_prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return text, tokenizer(text, add_special_tokens=False)["input_ids"]
    text = sampling_prompt(task_prompt)
    return text, tokenizer(text)["input_ids"]


def check_records(records: Sequence[TaskRecord]) -> None:
    seen = set()
    for record in records:
        if not isinstance(record.prompt, str) or not record.prompt.strip():
            raise RecordError(record.id, "prompt", "must be a non-empty string to sample from")
        if record.id in seen:
            raise RecordError(record.id, "id", "appears twice in one sampling call; response ids would collide")
        seen.add(record.id)


def stop_reached(tokenizer, token_ids: Sequence[int], stop: Sequence[str]) -> bool:
    return bool(stop) and any(s in tokenizer.decode(token_ids, skip_special_tokens=True) for s in stop)


def truncate_at_stop(tokenizer, token_ids: list[int], stop: Sequence[str]) -> list[int]:
    """token_ids up to and including the token at which a stop string first completes (all if none)."""
    if not stop_reached(tokenizer, token_ids, stop):
        return token_ids
    end = next(t for t in range(1, len(token_ids) + 1) if stop_reached(tokenizer, token_ids[:t], stop))
    return token_ids[:end]


def build_sample(record: TaskRecord, j: int, prompt: tuple[str, list[int]], token_ids: list[int],
                 logprobs: list[float], tokenizer, name: str, seed: int) -> Sample:
    return Sample(response_id=f"{record.id}/{j}", group_id=record.id, task=record.task, prompt=prompt[0],
                  prompt_token_ids=list(prompt[1]), response=tokenizer.decode(token_ids, skip_special_tokens=True),
                  token_ids=token_ids, sample_logprobs=logprobs, model=name, seed=seed)


def choose_tokens(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """logits [B, V] raw, uniforms [B] in [0, 1) -> token ids [B].

    Greedy when temperature == 0; else softmax(logits / temperature) restricted to the nucleus (the
    smallest set of most likely tokens whose mass reaches top_p), sampled by inverse CDF with `uniforms`.
    """
    if temperature == 0:
        return logits.argmax(-1)
    probs, order = torch.sort(torch.softmax(logits.float() / temperature, -1), dim=-1, descending=True, stable=True)
    if top_p < 1:  # at top_p == 1 rounding in the cumsum must not cut the tail
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p, 0.0)  # the top token always stays
    cdf = probs.cumsum(-1)
    pick = (cdf <= uniforms[:, None] * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)
    return order.gather(-1, pick[:, None]).squeeze(-1)


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


class TransformersSampler:
    """Batched sampling with a Hugging Face causal LM: left padding, a KV cache, one token per step."""

    def __init__(self, model, tokenizer, name: str, *, progress: bool = True):
        self.model, self.tokenizer, self.name, self.progress = model, tokenizer, name, progress
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids, default=0)
        self.cache_arg = cache_keyword(model)

    def sample(self, records: Sequence[TaskRecord], config: SamplingConfig) -> list[Sample]:
        check_records(records)
        prompts = {r.id: render_prompt(self.tokenizer, r.prompt) for r in records}
        rows = [(r, j) for r in records for j in range(config.n)]
        samples = []
        with Progress("sampling", total=len(rows), unit="response", enabled=self.progress) as bar:
            for start in range(0, len(rows), config.batch_size):
                batch = rows[start: start + config.batch_size]
                tokens, logprobs = self.generate([prompts[r.id][1] for r, _ in batch],
                                                 [row_seed(config.seed, r.id, j) for r, j in batch], config)
                samples += [build_sample(r, j, prompts[r.id], t, lp, self.tokenizer, self.name, config.seed)
                            for (r, j), t, lp in zip(batch, tokens, logprobs)]
                bar.update(len(batch), tokens=sum(map(len, tokens)))
        return samples

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int],
                 config: SamplingConfig) -> tuple[list[list[int]], list[list[float]]]:
        """One batch: prompt ids per row and a seed per row -> (response ids, raw log-probs) per row.

        A row ends at eos (kept), at the token completing a stop string (kept), or at max_new_tokens.
        """
        device = self.model.device
        ids, mask, positions = (t.to(device) for t in left_pad(prompts, self.pad_id))
        cache = DynamicCache(config=self.model.config)
        generators = [torch.Generator().manual_seed(s) for s in seeds]  # CPU: same draws on any device
        tokens, logprobs, done = [[] for _ in prompts], [[] for _ in prompts], [False] * len(prompts)
        logits = self._last_logits(ids, mask, positions, cache)
        for step in range(config.max_new_tokens):
            uniforms = torch.cat([torch.rand(1, generator=g) for g in generators]).to(device)
            chosen = choose_tokens(logits, uniforms, config.temperature, config.top_p)
            chosen_logprobs = torch.log_softmax(logits, -1).gather(-1, chosen[:, None]).squeeze(-1)
            for b, (token, logprob) in enumerate(zip(chosen.tolist(), chosen_logprobs.tolist())):
                if not done[b]:
                    tokens[b].append(token)
                    logprobs[b].append(logprob)
                    done[b] = token in self.eos_ids or stop_reached(self.tokenizer, tokens[b], config.stop)
            if all(done) or step + 1 == config.max_new_tokens:
                break
            # finished rows keep decoding (their tokens are dropped) so the batch stays rectangular
            mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], -1)
            positions = positions[:, -1:] + 1
            logits = self._last_logits(chosen[:, None], mask, positions, cache)
        return tokens, logprobs

    def _last_logits(self, ids, mask, positions, cache) -> torch.Tensor:
        """Feed ids [B, S]; -> float32 logits [B, V] of the last position. `cache` grows in place."""
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **{self.cache_arg: cache})
        return out.logits[:, -1].float()


def make_sampler(backend: str, model_path: str | None = None, *, device: str = "cpu", dtype=None,
                 trust_remote_code: bool = False) -> Sampler:
    """A sampler for a local policy (None = the shipped tiny policy). vllm picks its own CUDA device."""
    if backend == "transformers":
        model, tokenizer = load_policy(model_path, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
        return TransformersSampler(model, tokenizer, model_name(model_path))
    if backend == "vllm":
        from .vllm_backend import VllmSampler  # vllm is an optional GPU extra: import only when asked

        return VllmSampler(model_path, dtype=dtype, trust_remote_code=trust_remote_code)
    raise ValueError(f"unknown sampling backend {backend!r}; choose from {', '.join(BACKENDS)}")
