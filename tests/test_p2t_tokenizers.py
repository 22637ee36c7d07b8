"""P2T with a reward model of another tokenizer: attribution over the reward model's tokens of the response
text, carried to the policy's tokens by character offsets (pipeline/credit/p2t.py); `rm train`'s reward model."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import torch
from transformers import LlamaForSequenceClassification

from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig
from tokencredit.pipeline.credit.p2t import (attribute, attribute_across_tokenizers, carry_to_tokens,
                                             encode_for_reward_model, token_rewards)
from tokencredit.pipeline.models.loading import load_reward_model, load_tokenizer
from tokencredit.pipeline.sample.rows import render_prompt
from tokencredit.pipeline.steps import Pipeline

from tests.test_models import tiny_config, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
DEMO = [json.loads(line) for line in (ROOT / "verifiers/demo/instructions.jsonl").read_text().splitlines()[:6]]


@pytest.fixture(scope="module")
def tiny_rm():
    return load_reward_model()


@pytest.fixture(scope="module")
def byte_rm(tmp_path_factory):
    """A reward model whose tokenizer is not the tiny policy's: one token per byte (vocab 259), random weights."""
    folder = tmp_path_factory.mktemp("byte-rm")
    torch.manual_seed(0)
    tokenizer = tiny_tokenizer()
    LlamaForSequenceClassification(tiny_config(len(tokenizer), num_labels=1, initializer_range=0.05)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_carry_spreads_each_token_over_its_characters():
    # reward-model tokens "abcd", "efgh" and a special token of no characters; policy tokens "ab", "cdef", "gh", eos
    out = carry_to_tokens(torch.tensor([4.0, 8.0, 5.0]), [(0, 4), (4, 8), (8, 8)], starts=[0, 2, 6, 8], ends=[2, 6, 8, 8])
    assert out.tolist() == [2.0, 2.0 + 4.0, 4.0, 0.0]


def test_offset_path_equals_direct_path_on_a_shared_tokenizer(tiny_rm):
    """The tiny reward model shares the tiny policy's tokenizer: the same responses through the direct path
    (the policy's ids) and the offset path (the text retokenized, carried back) give the same token rewards."""
    model, tokenizer = tiny_rm
    prompts = [r["prompt"] for r in DEMO]
    response_ids = [tokenizer(r["reference_response"], add_special_tokens=False)["input_ids"] for r in DEMO]
    assert all(tokenizer.decode(ids, skip_special_tokens=True) == r["reference_response"]
               for ids, r in zip(response_ids, DEMO))  # the retokenized text is these very ids
    direct = attribute(model, [render_prompt(tokenizer, p)[1] for p in prompts], response_ids, batch_size=4)
    carried = attribute_across_tokenizers(model, tokenizer, tokenizer, prompts, response_ids, batch_size=4)
    for d, c in zip(direct, carried):
        assert c.score == pytest.approx(d.score, abs=1e-5)
        torch.testing.assert_close(c.raw, d.raw, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(token_rewards(c.score, c.raw), token_rewards(d.score, d.raw), rtol=1e-5, atol=1e-6)


def test_finer_policy_tokens_split_each_reward_model_token_evenly(tiny_rm):
    """A policy of one token per byte (ASCII text: per character): each reward-model token's attribution is
    shared evenly by the characters it spans, so the response's total and score are the direct path's."""
    model, tokenizer = tiny_rm
    policy_tokenizer = tiny_tokenizer()
    prompts = [r["prompt"] for r in DEMO]
    texts = [r["reference_response"] for r in DEMO]
    assert all(t.isascii() for t in texts)
    policy_ids = [policy_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    encoded = [encode_for_reward_model(tokenizer, p, t) for p, t in zip(prompts, texts)]
    own = attribute(model, [e[0] for e in encoded], [e[1] for e in encoded])
    carried = attribute_across_tokenizers(model, tokenizer, policy_tokenizer, prompts, policy_ids)
    for text, (_, _, spans), o, c in zip(texts, encoded, own, carried):
        assert len(c.raw) == len(text) and c.score == pytest.approx(o.score, abs=1e-5)
        for (start, end), a in zip(spans, o.raw.tolist()):
            torch.testing.assert_close(c.raw[start:end], torch.full((end - start,), a / (end - start)), rtol=1e-5, atol=1e-7)
        assert float(c.raw.sum()) == pytest.approx(float(o.raw.sum()), rel=1e-4, abs=1e-6)


@pytest.mark.slow
def test_annotate_p2t_with_a_reward_model_of_another_tokenizer(tmp_path, byte_rm):
    """The tiny policy with a byte-level reward model, annotate end to end: each response's P2T credit is over the
    policy's tokens, and its score and total attribution are the reward model's own on the response text."""
    config = AnnotateConfig(prompts="demo", tasks=("instructions",), limit=2, reward_model=str(byte_rm),
                            sampling=SamplingConfig(n=2, max_new_tokens=16),
                            credit=CreditConfig(kinds=("gdpo", "p2t")))
    Pipeline(config).run(str(tmp_path / "run"))
    rows = duckdb.sql(f"select group_id, response, token_ids, p2t_raw, p2t_reward, status from "
                      f"'{tmp_path}/run/responses/*.parquet'").fetchall()
    model, tokenizer = load_reward_model(byte_rm)
    assert len(rows) == 4 and tokenizer.get_vocab() != load_tokenizer().get_vocab()
    prompts = {r["id"]: r["prompt"] for r in DEMO}
    for group_id, text, ids, raw, reward, status in rows:
        assert status == "ok" and len(raw) == len(reward) == len(ids)
        prompt_ids, rm_ids, _ = encode_for_reward_model(tokenizer, prompts[group_id], text)
        with torch.no_grad():
            score = float(model(input_ids=torch.tensor([prompt_ids + rm_ids])).logits[0, 0])
        T, omega = len(raw), config.credit.p2t_omega
        assert sum(reward) == pytest.approx((T + omega) * score, rel=1e-4, abs=1e-5)  # the paper form sums to (T+w)R
        if text:  # the policy's tokens tile the text: the carried attribution keeps the reward model's total
            own = attribute(model, [prompt_ids], [rm_ids])[0]
            assert sum(raw) == pytest.approx(float(own.raw.sum()), rel=1e-3, abs=1e-6)
