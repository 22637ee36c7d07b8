"""The shipped tiny models (pipeline/models/*) and the code that builds them."""
import random
import re

import pytest
import torch
from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, LlamaConfig,
                          LlamaForCausalLM)

from tokencredit import verifiers
from tokencredit.pipeline.train.feedback_training import Example, as_reference, build_pool, changed_span, record_examples, sections_of
from tokencredit.pipeline.models.loading import DEFAULT_POLICY, DEFAULT_REWARD_MODEL
from tokencredit.pipeline.sample.prompts import replay_prompt, sampling_prompt
from tokencredit.pipeline.train.losses import token_weighted_sft_loss
from tokencredit.pipeline.models.tiny import (auc, collate, encode_example, pass_rates, rm_rows, rm_scores, tail_loss,
                                  train_tokenizer)

MAX_BYTES = 25 * 2**20


@pytest.fixture(scope="module")
def records():
    return verifiers.load_tasks("demo")[0]


@pytest.fixture(scope="module")
def policy():
    tok = AutoTokenizer.from_pretrained(DEFAULT_POLICY, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_POLICY, local_files_only=True, use_safetensors=True)
    return model.eval(), tok


@pytest.fixture(scope="module")
def reward_model():
    tok = AutoTokenizer.from_pretrained(DEFAULT_REWARD_MODEL, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(DEFAULT_REWARD_MODEL, local_files_only=True,
                                                               use_safetensors=True)
    return model.eval(), tok


# ------------------------------------------------------------------------- shipped files


def test_shipped_models_are_small_safetensors_with_pad_and_eos(policy, reward_model):
    files = [f for d in (DEFAULT_POLICY, DEFAULT_REWARD_MODEL) for f in d.iterdir()]
    assert sum(f.stat().st_size for f in files) <= MAX_BYTES
    assert not [f for f in files if f.suffix in (".bin", ".pt", ".pkl")]
    for model, tok in (policy, reward_model):
        assert tok.pad_token == "<pad>" and tok.eos_token == "<eos>"
        assert model.config.pad_token_id == tok.pad_token_id
    assert policy[0].generation_config.eos_token_id == policy[1].eos_token_id
    assert reward_model[0].config.num_labels == 1
    assert policy[1].get_vocab() == reward_model[1].get_vocab()  # P2T needs the policy's tokenizer


def test_tokenizer_splits_operators_and_keeps_tags_whole(policy):
    tok = policy[1]
    pieces = tok.convert_ids_to_tokens(tok("<sql>SELECT a FROM t WHERE x >= 30 AND y > 4</sql>")["input_ids"])
    assert pieces[0] == "<sql>" and pieces[-1] == "</sql>"
    assert pieces[pieces.index("Ġ>") + 1] == "="  # `>=` is `>` then `=`
    assert [p for p in pieces if re.fullmatch(r"Ġ?\d+", p)] == ["Ġ3", "0", "Ġ4"]  # one digit per token
    assert tok.decode(tok("a >= 3, 'b'")["input_ids"]) == "a >= 3, 'b'"


def _logprob(model, tok, prompt: str, response: str) -> float:
    p = tok(prompt)["input_ids"]
    r = tok(response)["input_ids"] + [tok.eos_token_id]
    with torch.no_grad():
        logp = model(torch.tensor([p + r])).logits[0, len(p) - 1:-1].log_softmax(-1)
    return logp.gather(1, torch.tensor(r)[:, None]).sum().item()


@pytest.mark.parametrize("task", ["sql", "tools"])
def test_policy_uses_the_reference_in_the_feedback(policy, records, task):
    """On held-out records, quoting the reference in the feedback makes the reference more likely."""
    model, tok = policy
    test = [r for r in records if r.task == task and r.split == "test"][:12]
    gains = [_logprob(model, tok, replay_prompt(r.prompt, sections_of(r, r.reference_response)), r.reference_response)
             - _logprob(model, tok, sampling_prompt(r.prompt), r.reference_response) for r in test]
    assert sum(g > 0 for g in gains) >= 0.75 * len(gains)
    # nats; bounded by how unsure the policy was without feedback (it often knows from the question)
    assert sum(gains) / len(gains) > 0.5


def test_reward_model_ranks_references_above_corruptions(reward_model, records):
    model, tok = reward_model
    rng = random.Random(0)
    test = [r for r in records if r.task in ("sql", "tools") and r.split == "test"][:24]
    good, bad = [], []
    for r in test:
        wrong = rng.choice(build_pool(r, rng).corruptions)
        for text, out in ((r.reference_response, good), (wrong, bad)):
            out.append((r, tok(text)["input_ids"] + [tok.eos_token_id], [1.0]))
    scores_good = rm_scores(model, tok, rm_rows(tok, good))
    scores_bad = rm_scores(model, tok, rm_rows(tok, bad))
    assert sum(scores_good) / len(scores_good) > sum(scores_bad) / len(scores_bad)


# ------------------------------------------------------------------------- training data


def _first(records, task):
    return next(r for r in records if r.task == task)


def test_sql_corruptions_belong_to_the_reward_they_break(records):
    r = next(r for r in records if r.task == "sql" and " > " in r.reference_response)
    pool = build_pool(r, random.Random(0))
    by = dict(zip(pool.reward_names, pool.by_reward))
    assert r.reference_response.replace(" > ", " >= ", 1) in by["execution"]
    assert r.reference_response[len("<sql>"):-len("</sql>")] in by["format"]  # the bare query
    assert all("<sql>" in t and "</sql>" in t for t in by["execution"] + by["executable"])
    assert all(verifiers.verify(r, t)[1].score == 0.0 for t in by["executable"])


def test_instruction_corruptions_break_exactly_one_constraint(records):
    r = _first(records, "instructions")
    pool = build_pool(r, random.Random(0))
    for k, group in enumerate(pool.by_reward):
        for text in group:
            assert [s.score < 1.0 for s in verifiers.verify(r, text)] == [j == k for j in range(len(pool.by_reward))]


def test_counterfactual_record_quotes_its_new_reference(records):
    r = next(r for r in records if r.task == "tools")
    pool = build_pool(r, random.Random(0), {"city": ["Oslo", "Lima"]})
    alt = pool.alternatives[0]
    assert alt.reference_response != r.reference_response
    assert all(s.score == 1.0 for s in verifiers.verify(alt, alt.reference_response))
    assert verifiers.verify(alt, r.reference_response)[1].score < 1.0
    assert as_reference(_first(records, "instructions"), "anything") is None


def test_replay_examples_drop_only_their_section(records):
    r = _first(records, "sql")
    examples = record_examples(build_pool(r, random.Random(0)), random.Random(1))
    headers = [set(re.findall(r"^\[(\w+)\]", e.prompt, re.MULTILINE)) for e in examples]
    assert {frozenset(h) for h in headers} == {frozenset(), frozenset({"format", "executable", "execution"}),
                                               frozenset({"executable", "execution"}),
                                               frozenset({"format", "execution"}), frozenset({"format", "executable"})}
    assert all(e.prompt.startswith(r.prompt) and e.prompt.endswith("### Response\n") for e in examples)


def test_changed_span_and_zero_weights_cover_only_the_edit():
    assert changed_span("<sql>a > 3</sql>", "<sql>a >= 3</sql>") == (8, 9)
    assert changed_span("<sql>q</sql>", "<sql>q") == (6, 7)  # deletion at the end: the eos slot
    wrong = "<sql>SELECT a FROM t WHERE a >= 3</sql>"
    tok = train_tokenizer([wrong] * 5, ["<sql>", "</sql>"], vocab_size=300)
    span = changed_span(wrong.replace(">=", ">"), wrong)
    ids, labels, weights = encode_example(tok, Example("Q\n", wrong, *span))
    pieces = tok.convert_ids_to_tokens(ids)
    assert [p for p, l, w in zip(pieces, labels, weights) if l != -100 and w == 0.0] == ["="]
    assert labels[-1] == tok.eos_token_id and weights[-1] == 1.0
    ids2, labels2, weights2, mask = collate([(ids, labels, weights), (ids[:3], labels[:3], weights[:3])], tok.pad_token_id)
    assert mask[1].tolist() == [0] * (len(ids) - 3) + [1] * 3 and (labels2[1, :-3] == -100).all()


def test_tail_loss_equals_the_full_loss_on_a_left_padded_batch():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4)).eval()
    rows = [([5, 6, 7, 8, 9, 10], [-100, -100, -100, 8, 9, 10], [0, 0, 0, 1, 1, 1]),
            ([11, 12, 13], [-100, 13, 13], [0, 2.0, 0.5])]
    ids, labels, weights, mask = collate(rows, 0)
    full = sum(token_weighted_sft_loss(model(torch.tensor([i])).logits, torch.tensor([l]), torch.tensor([w]))
               * sum(w[1:]) for i, l, w in rows) / sum(sum(w[1:]) for _, _, w in rows)
    assert torch.allclose(tail_loss(model, ids, labels, weights, mask), full, atol=1e-5)


def test_tokenizer_training_is_deterministic():
    texts = ["<sql>SELECT name FROM singer WHERE age > 3</sql>", "How many singers are there?"] * 10
    a = train_tokenizer(texts, ["<sql>", "</sql>"], vocab_size=300)
    b = train_tokenizer(texts, ["<sql>", "</sql>"], vocab_size=300)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()


# ------------------------------------------------------------------------- metrics


def test_auc_matches_pairwise_count():
    rng = random.Random(3)
    scores = [rng.choice([0.1, 0.5, 0.9, rng.random()]) for _ in range(40)]
    labels = [float(rng.random() < 0.4) for _ in range(40)]
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    want = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg) / (len(pos) * len(neg))
    assert auc(scores, labels) == pytest.approx(want)
    assert auc([1, 2, 3], [0, 1, 1]) == 1.0 and auc([3, 2, 1], [0, 1, 1]) == 0.0


def test_pass_rates_pool_instruction_rewards_by_kind(records):
    r = next(r for r in records if r.task == "instructions" and r.split == "train")
    scored = [(r, [], [1.0] * len(r.spec.constraints)), (r, [], [0.0] + [1.0] * (len(r.spec.constraints) - 1))]
    rates = pass_rates(scored)[f"instructions/{r.split}"]
    assert rates[r.spec.constraints[0].kind] == 0.5 and rates["all"] == 0.5
