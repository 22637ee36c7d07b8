"""The sampler's shortcuts against the plain algorithm they replace.

`ReferenceSampler` is the sampler as it was before them: every row prefilled on its own copy of the
prompt, finished rows decoded to the end of the batch, the whole vocabulary sorted at every step, stop
strings searched in the decode of the whole response. The shortcuts (top-k first, one prefill per
prompt, finished rows dropped, windowed decoding) must give the same tokens; where they change the
batch the model sees, log-probs may move in the last float bits (asserted within 1e-5), and where they
cannot (one row per batch), the dataset must not change a byte.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from tokencredit.pipeline.annotate import AnnotateConfig, annotate_shard, load_models, load_prompt_set, prepare_run
from tokencredit.pipeline.credit.assign import CreditConfig
from tokencredit.pipeline.models.loading import load_policy
from tokencredit.pipeline.models.registry import is_pulled
from tokencredit.pipeline.sample.transformers_backend import TOP_K, TransformersSampler, _choose_in_top_k, choose_tokens, left_pad
from tokencredit.pipeline.config import SamplingConfig

SMOLLM2 = "smollm2-135m-instruct"


def full_sort_choice(logits, uniforms, temperature, top_p):
    """The token choice before top-k-first: inverse CDF over the whole vocabulary, sorted."""
    if temperature == 0:
        return logits.argmax(-1)
    probs, order = torch.sort(torch.softmax(logits.float() / temperature, -1), dim=-1, descending=True, stable=True)
    if top_p < 1:
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p, 0.0)
    cdf = probs.cumsum(-1)
    pick = (cdf <= uniforms[:, None] * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)
    return order.gather(-1, pick[:, None]).squeeze(-1)


class ReferenceSampler(TransformersSampler):
    @torch.inference_mode()
    def generate(self, prompts, seeds, config):
        ids, mask, positions = left_pad(prompts, self.pad_id)
        cache = DynamicCache(config=self.model.config)
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        tokens, logprobs, done = [[] for _ in prompts], [[] for _ in prompts], [False] * len(prompts)
        logits = self._last_logits(ids, mask, positions, cache)
        for step in range(config.max_new_tokens):
            uniforms = torch.cat([torch.rand(1, generator=g) for g in generators])
            chosen = full_sort_choice(logits, uniforms, config.temperature, config.top_p)
            chosen_logprobs = torch.log_softmax(logits, -1).gather(-1, chosen[:, None]).squeeze(-1)
            for b, (token, logprob) in enumerate(zip(chosen.tolist(), chosen_logprobs.tolist())):
                if not done[b]:
                    tokens[b].append(token)
                    logprobs[b].append(logprob)
                    text = self.tokenizer.decode(tokens[b], skip_special_tokens=True)
                    done[b] = token in self.eos_ids or any(s in text for s in config.stop)
            if all(done) or step + 1 == config.max_new_tokens:
                break
            mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], -1)
            positions = positions[:, -1:] + 1
            logits = self._last_logits(chosen[:, None], mask, positions, cache)
        return tokens, logprobs


def test_choose_tokens_picks_the_full_sort_s_token():
    """Random logits over small and real vocabularies, flat ones (the top-k cannot decide: fallback),
    ties (logits on a coarse grid, all equal), and uniforms at 0, at the largest float below 1 and
    exactly on CDF steps."""
    g = torch.Generator().manual_seed(0)
    rows = decided = 0
    for trial in range(30):
        vocab = (7, TOP_K, TOP_K + 2, 2210, 49152)[trial % 5]
        batch = 16 if vocab < 10000 else 3  # keep the full sorts of the reference affordable
        logits = torch.randn(batch, vocab, generator=g) * (0.05, 1.0, 4.0, 12.0)[trial % 4]
        if trial % 3 == 0:
            logits = (logits * 2).round() / 2
        logits[-1] = 0.0
        uniforms = torch.rand(batch, generator=g)
        uniforms[0], uniforms[1] = 0.0, 1 - 2 ** -24
        for temperature in (0.0, 0.6, 1.0, 1.7):
            probs, _ = torch.sort(torch.softmax(logits / max(temperature, 1e-3), -1), descending=True, stable=True)
            cdf = probs.cumsum(-1)
            uniforms[2] = cdf[2, 3] / cdf[2, -1]  # a draw on a step of the CDF
            for top_p in (0.05, 0.5, 0.9, 1.0):
                chosen = choose_tokens(logits, uniforms, temperature, top_p)
                assert torch.equal(chosen, full_sort_choice(logits, uniforms, temperature, top_p)), \
                    (trial, temperature, top_p)
                if temperature:
                    rows += batch
                    decided += int(_choose_in_top_k(torch.softmax(logits / temperature, -1), uniforms, top_p,
                                                    TOP_K)[1].sum())
    assert 0.3 * rows < decided < rows  # both the top-k path and the fallback ran


def demo_records(count: int):
    records, _ = load_prompt_set(AnnotateConfig(limit=None))
    return records[:: len(records) // count][:count]  # spread over the tasks


@pytest.fixture(scope="module")
def shipped_policy():
    return load_policy()


def compare_with_reference(model, tokenizer, records, config):
    fast = TransformersSampler(model, tokenizer, "m", progress=False).sample(records, config)
    plain = ReferenceSampler(model, tokenizer, "m", progress=False).sample(records, config)
    assert [s.token_ids for s in fast] == [s.token_ids for s in plain]
    assert [s.response for s in fast] == [s.response for s in plain]
    for a, b in zip(fast, plain):
        # 1e-5 relative and absolute: SmolLM2's log-probs reach -20, where float32 steps are 2e-6; the plain
        # sampler alone moves them by up to 2.4e-5 between batch sizes 16 and 1
        torch.testing.assert_close(torch.tensor(a.sample_logprobs), torch.tensor(b.sample_logprobs),
                                   rtol=1e-5, atol=1e-5)
    return fast


def test_shared_prefill_and_dropped_rows_give_the_reference_tokens(shipped_policy):
    model, tokenizer = shipped_policy
    # 7 rows per batch: a prompt's 3 rows are split over two batches; stop strings end rows early
    config = SamplingConfig(n=3, max_new_tokens=40, temperature=0.8, top_p=0.9, stop=("</sql>", "\n\n", ". "),
                            batch_size=7, seed=5)
    samples = compare_with_reference(model, tokenizer, demo_records(6), config)
    lengths = {len(s.token_ids) for s in samples}
    assert min(lengths) < 40 and max(lengths) > min(lengths)  # rows did leave the batch early


@pytest.mark.real
@pytest.mark.skipif(not is_pulled(SMOLLM2), reason=f"run `tokencredit models pull {SMOLLM2}` first")
def test_smollm2_samples_the_reference_tokens():
    model, tokenizer = load_policy(SMOLLM2)
    compare_with_reference(model, tokenizer, demo_records(3),
                           SamplingConfig(n=2, max_new_tokens=24, stop=("\n\n",), seed=1))


def prefix_token_spans(tokenizer, token_ids):
    """`token_spans` before windowed decoding: one decode per prefix."""
    ends = [len(tokenizer.decode(token_ids[:t + 1], skip_special_tokens=True)) for t in range(len(token_ids))]
    starts, text = [0, *ends[:-1]], tokenizer.decode(token_ids, skip_special_tokens=True)
    return [text[s:e] if e > s else tokenizer.decode([t]) for t, s, e in zip(token_ids, starts, ends)], starts, ends


def annotated_checksum(config: AnnotateConfig, sampler_class, out: Path) -> str:
    """The dataset checksum of annotating `config` with `sampler_class` sampling."""
    models = load_models(config)
    sampler = sampler_class(models.policy, models.tokenizer, "tokencredit/tiny-policy", progress=False)
    models = dataclasses.replace(models, sampler=sampler)
    writer, shards, _ = prepare_run(config, str(out))
    for s, records in enumerate(shards):
        tables, stats = annotate_shard(records, s, config, models)
        writer.write_shard(s, tables, stats)
    return writer.finish(len(shards), {})["dataset_checksum"]


def test_one_row_batches_write_the_reference_dataset_byte_for_byte(tmp_path, monkeypatch):
    """With one row per batch, nothing the shortcuts do can change the batch the model sees."""
    config = AnnotateConfig(limit=2, shard_size=3, credit=CreditConfig(kinds=("gdpo", "mrtpo")),
                            sampling=SamplingConfig(n=1, batch_size=1, max_new_tokens=48, top_p=0.95,
                                                    stop=("</sql>", "\n\n")))
    fast = annotated_checksum(config, TransformersSampler, tmp_path / "fast")
    monkeypatch.setattr("tokencredit.pipeline.dataset.tables.token_spans", prefix_token_spans)
    assert fast == annotated_checksum(config, ReferenceSampler, tmp_path / "plain")


def test_sampling_and_replay_share_one_copy_of_the_policy():
    models = load_models(AnnotateConfig())
    assert models.sampler.model is models.policy and models.sampler.tokenizer is models.tokenizer
