"""Training stage (method.md section 5): policy-gradient loss, batching, train_step, train() with
checkpoints and resume, and the errors of the training view, on a tiny random Llama and a small
run directory written with the real RunWriter."""
import csv
import json
import re
import shutil
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback

from tokencredit.pipeline.models.loading import DEFAULT_POLICY
from tokencredit.pipeline.train.losses import IGNORE_INDEX, kl_penalty, policy_gradient_loss, token_weighted_sft_loss
from tokencredit.pipeline.train.trainer import (
    Example,
    TrainConfig,
    batch_indices,
    collate,
    load_examples,
    token_logprobs,
    train,
    train_step,
)
from tokencredit.pipeline.dataset.training import read_training
from tokencredit.pipeline.dataset.writer import RunWriter
from tokencredit.schemas import CREDITS, RESPONSES

from tests.test_writer import rewrite_as_older_run

VOCAB = 64
PAD = 0

# (prompt ids, response ids, GDPO advantage, MRTPO per-token advantage); lengths differ on purpose
RESPONSES_SPEC = [
    ([5, 6, 7], [10, 11, 12, 13], 1.0, [1.5, 0.5, 1.5, 0.5]),
    ([5, 6, 7], [14, 15], -1.0, [-0.5, -1.5]),
    ([8, 9], [16, 17, 18, 19, 20, 21], 0.5, [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]),
    ([8, 9], [22, 23, 24], -0.5, [-1.0, -0.5, 0.0]),
    ([25, 26, 27, 28], [29, 30], 2.0, [3.0, 1.0]),
    ([25, 26, 27, 28], [31, 32, 33], -2.0, [-2.0, -3.0, -1.0]),
]


def tiny_policy(folder, seed=0):
    """A random 2-layer Llama and a word-level tokenizer ("w<id>" = id) saved as a local policy folder."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=PAD, bos_token_id=1, eos_token_id=1)
    LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    vocab = {"<pad>": PAD, "<eos>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(folder)
    return folder


def response_rows(spec=RESPONSES_SPEC, p2t=False):
    rows = []
    for i, (prompt, tokens, gdpo, mrtpo) in enumerate(spec):
        rows.append({
            "response_id": f"r{i}", "group_id": f"g{i // 2}", "shard": 0, "task": "sql",
            "prompt": " ".join(f"w{t}" for t in prompt), "response": " ".join(f"w{t}" for t in tokens),
            "prompt_token_ids": prompt, "token_ids": tokens, "sample_logprobs": [-np.log(VOCAB)] * len(tokens),
            "reward_names": ["format", "execution"], "rewards": [1.0, float(i % 2 == 0)],
            "feedback": ["ok", "ok"], "reward_advs": [0.0, gdpo], "adv_grpo": gdpo, "gdpo_sum": gdpo,
            "mrtpo_sum": mrtpo, "p2t_raw": None, "p2t_reward": [float(t) for t in range(len(tokens))] if p2t else None,
            "p2t_alpha": 0.1 if p2t else None,
            "status": "ok", "model": "tiny", "seed": 0,
        })
    return rows


def write_run(folder, rows, model=None):
    """A run directory written by the real RunWriter (an empty credits table: the trainer does not read it),
    sampled with `model` as its manifest says.

    Its GDPO batch step is "none" (c = 1, m = 0), so the views' advantages are the rows' sums as given.
    """
    writer = RunWriter(str(folder))
    writer.start("run", {"model": model, "credit": {"gdpo": {"batch": "none"}}}, "synthetic", "test")
    writer.write_shard(0, {"responses": pa.Table.from_pylist(rows, schema=RESPONSES),
                           "credits": CREDITS.empty_table()}, stats={})
    writer.finish(1, {})
    return str(folder)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return tiny_policy(tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    rows = response_rows()
    rows.append({**rows[0], "response_id": "r_err", "status": "verifier_error: timeout"})
    return write_run(tmp_path_factory.mktemp("run"), rows)


def load_model(folder):
    return LlamaForCausalLM.from_pretrained(folder)


# --- policy-gradient loss ----------------------------------------------------------------------


def test_pg_loss_with_uniform_advantages_is_the_gdpo_surrogate():
    g = torch.Generator().manual_seed(0)
    lengths, adv = [4, 2, 6], [1.3, -0.7, 0.4]
    logprobs = -torch.rand(3, 6, generator=g) * 3
    sample = logprobs + (torch.rand(3, 6, generator=g) - 0.5)  # ratios up to e^0.5: some clipped
    mask = torch.arange(6)[None] < torch.tensor(lengths)[:, None]
    logprobs[~mask] = 1e4  # padding holds garbage; it must not count
    advantages = torch.tensor(adv)[:, None].expand(3, 6)
    eps = 0.2
    total = 0.0
    for i, (T, A) in enumerate(zip(lengths, adv)):  # per response: sum_t min(rho A, clip(rho) A)
        for t in range(T):
            rho = float(np.exp(logprobs[i, t] - sample[i, t]))
            total += min(rho * A, float(np.clip(rho, 1 - eps, 1 + eps)) * A)
    expected = -total / sum(lengths)
    ours = policy_gradient_loss(logprobs, sample, advantages, mask, clip_eps=eps)
    assert ours.item() == pytest.approx(expected, rel=1e-5)
    assert np.mean([np.exp(logprobs[i, t] - sample[i, t]) > 1 + eps
                    for i, T in enumerate(lengths) for t in range(T)]) > 0  # clipping was exercised


def test_pg_loss_equal_lengths_is_the_mean_of_per_response_means_and_clips_gradients():
    logprobs = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]], requires_grad=True)
    sample = torch.tensor([[-1.5, -2.0], [-1.0, -1.0]])  # rho = [e^0.5, 1], [1, e^-1]
    adv = torch.tensor([[2.0, 2.0], [-1.0, -1.0]])
    loss = policy_gradient_loss(logprobs, sample, adv, torch.ones(2, 2, dtype=torch.bool))
    per_response = [np.mean([min(2 * np.exp(0.5), 1.2 * 2), 2.0]), np.mean([-1.0, min(-np.exp(-1), -0.8)])]
    assert loss.item() == pytest.approx(-np.mean(per_response), rel=1e-6)
    loss.backward()
    # clipped tokens (rho > 1+e with A > 0; rho < 1-e with A < 0) get no gradient, the others -A rho / N
    assert logprobs.grad[0, 0] == 0 and logprobs.grad[1, 1] == 0
    assert logprobs.grad[0, 1].item() == pytest.approx(-2.0 / 4) and logprobs.grad[1, 0].item() == pytest.approx(1 / 4)


# --- batching ------------------------------------------------------------------------------------


def examples_of(spec, weights_seed=0):
    g = np.random.default_rng(weights_seed)
    return [Example(f"r{i}", p, r, [-1.0] * len(r), g.uniform(0.1, 2.0, len(r)).tolist())
            for i, (p, r, _, _) in enumerate(spec)]


def test_padded_batch_equals_unpadded_per_example_computation(policy_dir):
    model = load_model(policy_dir).eval()
    examples = examples_of(RESPONSES_SPEC)
    batch = collate(examples, PAD)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        padded_lp = token_logprobs(logits, batch["labels"])
        sft = token_weighted_sft_loss(logits, batch["labels"], batch["credit"])
        num = den = 0.0
        for b, e in enumerate(examples):
            ids = torch.tensor([e.prompt_ids + e.token_ids])
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
            P, T = len(e.prompt_ids), len(e.token_ids)
            own = torch.stack([logp[P - 1 + t, e.token_ids[t]] for t in range(T)])
            # labels live on the response positions only, shifted by one against the logits
            assert torch.allclose(padded_lp[b, P - 1:P - 1 + T], own, atol=1e-5)
            assert (padded_lp[b, :P - 1] == 0).all() and (padded_lp[b, P - 1 + T:] == 0).all()
            num -= (torch.tensor(e.credit) * own).sum()
            den += sum(e.credit)
    assert sft.item() == pytest.approx((num / den).item(), rel=1e-5)
    assert (batch["labels"] != IGNORE_INDEX).sum() == sum(len(e.token_ids) for e in examples)


def test_batch_indices_are_seeded_epoch_permutations():
    n, bs = 7, 3
    stream = [i for step in range(7) for i in batch_indices(n, bs, seed=1, step=step)]  # 3 epochs
    for epoch in range(3):
        assert sorted(stream[epoch * n:(epoch + 1) * n]) == list(range(n))
    assert stream == [i for step in range(7) for i in batch_indices(n, bs, seed=1, step=step)]
    assert stream != [i for step in range(7) for i in batch_indices(n, bs, seed=2, step=step)]


# --- one optimizer step ----------------------------------------------------------------------------


def credited_batch(model):
    """Responses whose tokens carry +1 or -1; sample log-probs = the model's own (rho = 1)."""
    spec = [([5, 6, 7], [10, 11, 12, 13], [1, 1, -1, -1]), ([5, 6, 7], [14, 15, 16], [-1, -1, -1]),
            ([8, 9], [17, 18, 19, 20, 21], [1, -1, 1, -1, 1])]
    examples = [Example(f"r{i}", p, r, [0.0] * len(r), [float(a) for a in adv]) for i, (p, r, adv) in enumerate(spec)]
    batch = collate(examples, PAD)
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                            batch["labels"])
    batch["sample_logprobs"][:, 1:] = lp
    return batch, lp


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_one_pg_step_raises_credited_and_lowers_debited_tokens(policy_dir, optim):
    model = load_model(policy_dir)
    batch, before = credited_batch(model)
    opt = (torch.optim.SGD(model.parameters(), lr=0.5) if optim == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=1e-3))
    metrics = train_step(model, batch, "pg", opt, clip_eps=0.2)
    with torch.no_grad():
        after = token_logprobs(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                               batch["labels"])
    credit, mask = batch["credit"][:, 1:], batch["labels"][:, 1:] != IGNORE_INDEX
    change = after - before
    assert change[mask & (credit > 0)].mean() > 0 and change[mask & (credit < 0)].mean() < 0
    # at this size every single token moves the way its own credit points
    assert torch.equal(torch.sign(change[mask]), torch.sign(credit[mask]))
    assert metrics["tokens"] == 12 and metrics["mean_advantage"] == pytest.approx(-2 / 12)
    assert metrics["loss"] == pytest.approx(2 / 12, rel=1e-4)  # rho = 1: loss = -mean A


def test_one_sft_step_lowers_the_weighted_loss(policy_dir):
    model = load_model(policy_dir)
    batch = collate(examples_of(RESPONSES_SPEC), PAD)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    first = train_step(model, batch, "sft", opt)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert token_weighted_sft_loss(logits, batch["labels"], batch["credit"]).item() < first["loss"]


# --- reading the training view -----------------------------------------------------------------------


def test_advantage_kinds_mixes_and_sft_weights(run_dir):
    rows = {r["response_id"]: r for r in read_training(run_dir, "mrtpo:0.25,gdpo:2")}
    assert sorted(rows) == [f"r{i}" for i in range(6)]  # the verifier_error row is not trained on
    for i, (_, tokens, gdpo, mrtpo) in enumerate(RESPONSES_SPEC):
        assert rows[f"r{i}"]["advantages"] == pytest.approx([0.25 * m + 2 * gdpo for m in mrtpo])
    pg = {e.response_id: e for e in load_examples(run_dir, "gdpo", "pg")}
    assert pg["r1"].credit == [-1.0, -1.0] and pg["r1"].prompt_ids == [5, 6, 7]
    sft = {e.response_id: e for e in load_examples(run_dir, "mrtpo", "sft")}
    assert set(sft) == {"r0", "r2", "r4"}  # all-zero weights (negative advantages) add nothing: dropped
    assert sft["r2"].credit == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    default = {e.response_id: e.credit for e in load_examples(run_dir, None, "sft")}
    assert default == {k: e.credit for k, e in sft.items()}  # sft_weight = positive part of MRTPO


def test_unknown_kind_null_and_missing_columns_are_clear_errors(run_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown advantage kind 'grpo'"):
        TrainConfig(data=run_dir, out=str(tmp_path), advantage="mrtpo:0.5,grpo:0.5")
    with pytest.raises(ValueError, match=rf"run dir {run_dir}: advantage kind 'p2t' \(column adv_p2t\) is NULL "
                                         r"for 6 of 6 responses, e.g. response 'r0'"):
        load_examples(run_dir, "p2t", "pg")
    rows = response_rows()
    rows[4]["mrtpo_sum"] = rows[4]["mrtpo_sum"][:1]
    with pytest.raises(ValueError, match="response 'r4': field 'adv_mrtpo' has 1 values for 2 tokens"):
        read_training(write_run(tmp_path / "misaligned", rows), "mrtpo")
    # a run written by an older schema, without the column at all: it reads as NULL, and trains on the others
    old = tmp_path / "old"
    write_run(old, response_rows())
    table = pq.read_table(old / "responses" / "part-00000.parquet").drop_columns(["p2t_alpha"])
    rewrite_as_older_run(old, "responses/part-00000.parquet", table)
    with pytest.raises(ValueError, match=rf"run dir {old}: advantage kind 'p2t' \(column adv_p2t\) is NULL "
                                         r"for 6 of 6 responses"):
        read_training(old, "p2t")
    assert len(read_training(old, "gdpo")) == 6


def test_lora_without_peft_is_a_clear_error(run_dir, policy_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # makes `import peft` fail as when it is not installed
    config = TrainConfig(data=run_dir, out=str(tmp_path), model=str(policy_dir), lora=True, steps=1)
    with pytest.raises(ImportError, match="lora=True needs the optional package `peft`"):
        train(config)


# --- train(): checkpoints, metrics, resume ----------------------------------------------------------


def read_metrics(out):
    with open(out / "metrics.csv") as f:
        return list(csv.DictReader(f))


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


def test_train_writes_checkpoints_and_resumes_where_it_stopped(run_dir, policy_dir, tmp_path, capsys):
    base = shutil.copytree(policy_dir, tmp_path / "base")
    settings = dict(data=run_dir, model=str(base), advantage="mrtpo", batch_size=3, lr=1e-3, save_every=2,
                    save_optimizer=True)
    out = tmp_path / "out"
    final = train(TrainConfig(out=str(out), steps=4, **settings))
    assert final == out / "final"
    for name in ("checkpoint-2", "checkpoint-4"):  # Trainer's checkpoints, AdamW's moments included
        assert {"model.safetensors", "config.json", "tokenizer.json", "trainer_state.json", "rng_state.pth",
                "optimizer.pt", "train_config.json"} <= {p.name for p in (out / name).iterdir()}
    # final: weights only (AdamW's moments would double its size)
    final_files = {p.name for p in (out / "final").iterdir()}
    assert {"model.safetensors", "tokenizer.json", "train_config.json"} <= final_files
    assert not final_files & {"trainer_state.json", "optimizer.pt"}
    assert [int(r["step"]) for r in read_metrics(out)] == [1, 2, 3, 4]
    assert all(int(r["tokens"]) > 0 and np.isfinite(float(r["loss"])) for r in read_metrics(out))
    assert (out / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    step4 = weights(out / "checkpoint-4")
    assert any(not torch.equal(step4[k], v) for k, v in weights(base).items())  # it trained

    with pytest.raises(ValueError, match="holds a run with another configuration"):
        train(TrainConfig(out=str(out), steps=6, **{**settings, "lr": 1e-2}))

    # Resume to 6 steps without the base model: only checkpoint-4 can supply the weights.
    shutil.rmtree(base)
    train(TrainConfig(out=str(out), steps=6, **settings))
    assert f"resuming from {out / 'checkpoint-4'} (step 4 of 6)" in capsys.readouterr().out
    assert [int(r["step"]) for r in read_metrics(out)] == [1, 2, 3, 4, 5, 6]
    assert json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6

    # ... and it lands where an uninterrupted 6-step run lands (same batches, AdamW moments, RNG).
    shutil.copytree(policy_dir, base)
    straight = tmp_path / "straight"
    train(TrainConfig(out=str(straight), steps=6, **settings))
    resumed, uninterrupted = weights(out / "final"), weights(straight / "final")
    for key, value in uninterrupted.items():
        assert torch.allclose(resumed[key], value, atol=1e-6), key
    assert [float(r["loss"]) for r in read_metrics(out)] == pytest.approx(
        [float(r["loss"]) for r in read_metrics(straight)], rel=1e-6)


def test_checkpoints_hold_no_optimizer_state_unless_asked(run_dir, policy_dir, tmp_path):
    out = tmp_path / "out"
    train(TrainConfig(data=run_dir, model=str(policy_dir), out=str(out), steps=2, batch_size=3, save_every=100))
    files = {p.name for p in (out / "checkpoint-2").iterdir()}
    assert {"model.safetensors", "trainer_state.json", "rng_state.pth"} <= files and "optimizer.pt" not in files
    train(TrainConfig(data=run_dir, model=str(policy_dir), out=str(out), steps=3, batch_size=3, save_every=100))
    assert [int(r["step"]) for r in read_metrics(out)] == [1, 2, 3]  # it still resumes, with fresh moments


class Interrupt(TrainerCallback):
    """Raises once step `at` is logged (its metrics row written), as a killed run would stop."""

    def __init__(self, at):
        self.at = at

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step == self.at and "tokens" in (logs or {}):
            raise KeyboardInterrupt(f"interrupted at step {self.at}")


def test_a_run_interrupted_and_resumed_ends_as_an_uninterrupted_one(run_dir, policy_dir, tmp_path, capsys):
    settings = dict(data=run_dir, model=str(policy_dir), advantage="gdpo", steps=5, batch_size=2, grad_accum=2,
                    lr=1e-2, save_every=2, save_optimizer=True)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(out=str(out), **settings), callbacks=[Interrupt(3)])
    assert [int(r["step"]) for r in read_metrics(out)] == [1, 2, 3]
    (out / "checkpoint-4").mkdir()  # a save cut short: no train_config.json, so not a checkpoint to resume
    train(TrainConfig(out=str(out), **settings))
    assert f"resuming from {out / 'checkpoint-2'} (step 2 of 5)" in capsys.readouterr().out
    straight = tmp_path / "straight"
    train(TrainConfig(out=str(straight), **settings))
    assert read_metrics(out) == read_metrics(straight)  # every figure of every step, as written
    resumed, uninterrupted = weights(out / "final"), weights(straight / "final")
    assert all(torch.equal(resumed[k], v) for k, v in uninterrupted.items())


@pytest.mark.parametrize("objective", ["pg", "sft"])
def test_trainer_losses_equal_a_plain_adamw_loop_on_the_union_batches(run_dir, policy_dir, tmp_path, objective):
    """train's Trainer (micro-batches of 2, accumulated over 2) against AdamW on one batch of the 4 responses
    of each step (batch_indices), with the loss written out on that batch."""
    steps, batch_size, accum, lr = 4, 2, 2, 1e-2
    out = tmp_path / "out"
    train(TrainConfig(data=run_dir, out=str(out), model=str(policy_dir), objective=objective, advantage="mrtpo",
                      steps=steps, batch_size=batch_size, grad_accum=accum, lr=lr, save_every=100))
    examples = load_examples(run_dir, "mrtpo", objective)
    model = load_model(policy_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    expected = []
    for step in range(steps):
        batch = collate([examples[i] for i in batch_indices(len(examples), batch_size * accum, 0, step)], PAD)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        if objective == "sft":
            loss = token_weighted_sft_loss(logits, batch["labels"], batch["credit"])
        else:
            loss = policy_gradient_loss(token_logprobs(logits, batch["labels"]), batch["sample_logprobs"][:, 1:],
                                        batch["credit"][:, 1:], batch["labels"][:, 1:] != IGNORE_INDEX)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
    losses = [float(r["loss"]) for r in read_metrics(out)]
    assert losses == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert len(set(np.round(expected, 4))) == steps  # the steps differ: the comparison follows training


# --- gradient accumulation, KL to the reference, bf16, LoRA from the CLI ------------------------------


@pytest.mark.parametrize("objective", ["pg", "sft"])
def test_accumulated_micro_batches_equal_one_step_on_their_union(policy_dir, objective):
    examples = examples_of(RESPONSES_SPEC)
    for e, (_, _, _, mrtpo) in zip(examples, RESPONSES_SPEC):  # signed credit for pg, positive for sft
        e.credit[:] = mrtpo if objective == "pg" else [abs(a) + 0.1 for a in mrtpo]
    one, accumulated = load_model(policy_dir), load_model(policy_dir)
    whole = train_step(one, collate(examples, PAD), objective, torch.optim.SGD(one.parameters(), lr=0.5))
    parts = train_step(accumulated, [collate(examples[:2], PAD), collate(examples[2:5], PAD), collate(examples[5:], PAD)],
                       objective, torch.optim.SGD(accumulated.parameters(), lr=0.5))
    assert parts["loss"] == pytest.approx(whole["loss"], rel=1e-5) and parts["tokens"] == whole["tokens"]
    assert parts["mean_advantage"] == pytest.approx(whole["mean_advantage"], rel=1e-6)
    for (name, a), b in zip(one.named_parameters(), accumulated.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_kl_penalty_is_the_k3_estimate_and_pulls_towards_the_reference(policy_dir, tmp_path):
    lp = torch.tensor([[-1.0, -2.0, 5.0]])
    ref = torch.tensor([[-1.5, -2.0, -9.0]])
    mask = torch.tensor([[True, True, False]])
    assert kl_penalty(lp, ref, mask).item() == pytest.approx((np.exp(-0.5) + 0.5 - 1) / 2)
    assert kl_penalty(lp, lp, mask).item() == 0.0

    policy, reference = load_model(policy_dir), load_model(tiny_policy(tmp_path / "other", seed=1)).eval()
    batch = collate(examples_of(RESPONSES_SPEC), PAD)
    batch["credit"].zero_()  # no advantage: the step only follows the KL term
    ref_logprobs = lambda b: token_logprobs(reference(input_ids=b["input_ids"]).logits, b["labels"])  # noqa: E731
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    first = train_step(policy, batch, "pg", opt, reference=ref_logprobs, kl_coef=1.0)
    second = train_step(policy, batch, "pg", opt, reference=ref_logprobs, kl_coef=1.0)
    assert 0 < second["kl"] < first["kl"] and first["loss"] == pytest.approx(first["kl"])
    with pytest.raises(ValueError, match="needs a reference"):
        train_step(policy, batch, "pg", opt, kl_coef=1.0)


def test_train_with_kl_starts_at_zero_kl_to_the_initial_policy(run_dir, policy_dir, tmp_path):
    train(TrainConfig(data=run_dir, out=str(tmp_path / "kl"), model=str(policy_dir), steps=3, batch_size=3, lr=1e-2,
                      kl_coef=0.1, grad_accum=2))
    kl = [float(r["kl"]) for r in read_metrics(tmp_path / "kl")]
    assert kl[0] == pytest.approx(0.0, abs=1e-7) and kl[-1] > 1e-6  # the policy starts as the reference


def test_bf16_autocast_step_follows_the_fp32_step(policy_dir):
    model = load_model(policy_dir)
    batch, _ = credited_batch(model)
    bf16 = train_step(load_model(policy_dir), batch, "pg", torch.optim.SGD(model.parameters(), lr=0.0), bf16=True)
    fp32 = train_step(model, batch, "pg", torch.optim.SGD(model.parameters(), lr=0.0))
    assert bf16["loss"] == pytest.approx(fp32["loss"], abs=5e-2) and bf16["loss"] != fp32["loss"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_autocast_on_cuda(run_dir, policy_dir, tmp_path):
    final = train(TrainConfig(data=run_dir, out=str(tmp_path / "cuda"), model=str(policy_dir), steps=2, batch_size=3,
                              device="cuda", bf16=True, kl_coef=0.1))
    assert all(np.isfinite(float(r["loss"])) for r in read_metrics(tmp_path / "cuda"))
    assert (final / "model.safetensors").is_file()


def test_lora_from_the_cli_trains_adapters_only(run_dir, policy_dir, tmp_path):
    pytest.importorskip("peft")
    from tokencredit.flows.cli import main

    out = tmp_path / "lora"
    assert main(["train", "--data", run_dir, "--model", str(policy_dir), "--out", str(out), "--lora", "--steps", "2",
                 "--batch-size", "2", "--grad-accum", "2", "--kl-coef", "0.1", "--lr", "1e-2", "--save-every", "1",
                 "--save-total-limit", "1"]) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]  # save_total_limit 1
    checkpoint = {p.name: p.stat().st_size for p in (out / "checkpoint-2").iterdir()}
    assert "adapter_model.safetensors" in checkpoint and "model.safetensors" not in checkpoint
    assert sum(checkpoint.values()) < 50 * 2**20
    files = {p.name for p in (out / "final").iterdir()}
    assert "adapter_model.safetensors" in files and "model.safetensors" not in files and "trainer_state.pt" not in files
    adapter = load_file(str(out / "final" / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # B starts at 0: it trained
    kl = [float(r["kl"]) for r in read_metrics(out)]
    assert kl[0] == pytest.approx(0.0, abs=1e-7) and kl[1] > 0  # reference: the base model, adapters off


def test_train_defaults_to_the_runs_model_and_refuses_another_tokenizer(policy_dir, tmp_path):
    """Without --model the trainer loads the policy the manifest records; a model whose tokenizer does not
    produce the run's tokens is a one-line error naming both models."""
    run = write_run(tmp_path / "run", response_rows(), model=str(policy_dir))
    final = train(TrainConfig(data=run, out=str(tmp_path / "out"), advantage="gdpo", steps=1, batch_size=2))
    assert load_file(final / "model.safetensors")["model.embed_tokens.weight"].shape[0] == VOCAB
    shipped = str(DEFAULT_POLICY)
    with pytest.raises(ValueError, match=f"sampled with {policy_dir}, but the model to train is {shipped}: "
                                         "response 'r0' decodes to other text") as error:
        train(TrainConfig(data=run, out=str(tmp_path / "x"), advantage="gdpo", steps=1, model=shipped))
    assert "\n" not in str(error.value)


def test_rejection_sampling_keeps_the_responses_that_pass_every_reward_with_weight_one(run_dir, policy_dir, tmp_path):
    examples = load_examples(run_dir, None, "rs")
    assert [e.response_id for e in examples] == ["r0", "r2", "r4"]  # rewards [1, 1]; odd rows fail one
    assert all(e.credit == [1.0] * len(e.token_ids) for e in examples)
    with pytest.raises(ValueError, match="objective 'rs' weighs every token"):
        TrainConfig(data=run_dir, out=str(tmp_path), objective="rs", advantage="gdpo")
    final = train(TrainConfig(data=run_dir, out=str(tmp_path / "rs"), objective="rs", advantage=None,
                              model=str(policy_dir), steps=1, batch_size=3))
    assert (final / "model.safetensors").is_file()


def test_training_on_an_incomplete_run_is_refused_without_creating_the_output_folder(tmp_path, capsys):
    from tokencredit.flows.cli import main

    writer = RunWriter(str(tmp_path / "run"))
    writer.start("run", {}, "h", "c", n_shards=2)
    out = tmp_path / "ckpt"
    assert main(["train", "--data", str(tmp_path / "run"), "--out", str(out), "--steps", "1"]) == 2
    assert "not complete" in capsys.readouterr().err
    assert not out.exists()


# --- non-finite values (issue 49, item 2) -------------------------------------------------------------


@pytest.mark.parametrize("lr", [float("inf"), float("nan"), 1e30, 0.0, -1e-3])
def test_a_learning_rate_outside_its_range_is_refused_where_parsed(run_dir, tmp_path, lr):
    with pytest.raises(ValueError, match=r"TrainConfig.lr: .* is no learning rate"):
        TrainConfig(data=run_dir, out=str(tmp_path / "out"), lr=lr)


def huge_run(folder, advantage: float) -> str:
    """A run whose MRTPO advantage is `advantage` on each response's first token (0 elsewhere)."""
    rows = response_rows()
    for row in rows:
        row["mrtpo_sum"] = [advantage] + [0.0] * (len(row["token_ids"]) - 1)
    return write_run(folder, rows)


def test_advantages_past_float32_are_refused_naming_the_response(tmp_path):
    run = huge_run(tmp_path / "run", 3e38)  # float32 holds it; twice it does not
    assert len(read_training(run, "mrtpo")) == 6
    with pytest.raises(ValueError, match=r"response 'r0': advantage 'mrtpo:2' is 6e\+38 at token 0 \(1 of 4 tokens"):
        read_training(run, "mrtpo:2")


# The first step's loss of huge_run(1e38) is -inf; with 5e37 the loss is finite and the gradients are not.
@pytest.mark.parametrize("advantage,what", [(1e38, r"the loss is not finite \(-inf\)"),
                                            (5e37, r"the gradient of model\.\S+ is not finite")])
def test_training_stops_at_the_first_non_finite_loss_or_gradient_writing_no_checkpoint(policy_dir, tmp_path, capsys,
                                                                                       advantage, what):
    from tokencredit.flows.cli import main

    run, out = huge_run(tmp_path / "run", advantage), tmp_path / "out"
    assert main(["train", "--data", run, "--out", str(out), "--model", str(policy_dir), "--steps", "2",
                 "--batch-size", "6", "--save-every", "1"]) == 2
    err = capsys.readouterr().err  # with the loading and progress bars around it
    errors = [line for line in re.split(r"[\r\n]", err) if "error" in line]
    assert "Traceback" not in err and len(errors) == 1, err
    assert re.search(rf"tokencredit train: error: step 1: {what}.*training stopped", errors[0]), err
    assert not list(out.glob("checkpoint-*")) and not (out / "final").exists()
    # the plain loop stops there too, before the optimizer moves a weight
    model = load_model(policy_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = collate(load_examples(run, "mrtpo", "pg"), PAD)
    with pytest.raises(ValueError, match=f"train_step: {what}"):
        train_step(model, batch, "pg", torch.optim.AdamW(model.parameters(), lr=1e-3))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
