"""MRTPO's replay: batched, padded, chunked, prefix-cached replay equals one plain forward per sequence;
the replay frame equals the sampling frame plus the feedback block."""
import copy
import random
import string
from contextlib import contextmanager

import pytest
import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

import tokencredit.pipeline.credit.replay as replay_module
from tokencredit.pipeline.sample.prompts import NULL_FILLER, prompt_frame, replay_prompt, sampling_prompt
from tokencredit.pipeline.credit.replay import ReplayItem, ReplayStats, build_replay_item, replay, replay_distances, shared_prefix_length

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def char_tokenizer_with(template=None, bos=True):
    """One token per printable character (so any text splits the same way wherever it is cut)."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: i + 4 for i, c in enumerate(sorted(set(string.printable) - set("\t\r\x0b\x0c")))})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    out.chat_template = template
    return out


@pytest.fixture(scope="module")
def char_tokenizer():
    """BOS prepended by default, as Llama's tokenizer does; no chat template (the raw frame)."""
    return char_tokenizer_with()


@pytest.fixture(scope="module")
def chat_tokenizer():
    return char_tokenizer_with(CHAT_TEMPLATE, bos=False)


# --- reference: one plain full forward per sequence, float64 ---------------------------------------
def reference_logprobs(model, prompt, response):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response], device=model.device)).logits[0].double().cpu()
    return torch.log_softmax(logits[len(prompt) - 1: len(prompt) - 1 + len(response)], -1)


def reference_outputs(model, items):
    """Per item (log p_t(y_t) [T], log q_t(y_t) [K, T], JS [K, T]) with NaN rows for gated rewards."""
    out = []
    for it in items:
        y = torch.tensor(it.response_ids)[:, None]
        lp = reference_logprobs(model, it.all_prompt_ids, it.response_ids)
        K, T = len(it.drop_prompt_ids), len(it.response_ids)
        drop, js = torch.full((K, T), float("nan")), torch.full((K, T), float("nan"))
        for k, other in enumerate(it.drop_prompt_ids):
            if other is not None:
                lq = reference_logprobs(model, other, it.response_ids)
                p, q = lp.exp(), lq.exp()
                m = (p + q) / 2
                kl = lambda a: torch.where(a > 0, a * (a / m).log(), 0.0).sum(-1)  # noqa: E731
                drop[k], js[k] = lq.gather(-1, y).squeeze(-1).float(), ((kl(p) + kl(q)) / 2).float()
        replayed = any(d is not None for d in it.drop_prompt_ids)  # else P_all is not forwarded either
        out.append((lp.gather(-1, y).squeeze(-1).float() if replayed else torch.full((T,), float("nan")), drop, js))
    return out
# ----------------------------------------------------------------------------------------------------


def random_items(seed, n=8, vocab=128):
    """Prompt groups (items sharing a task prefix), 1-4 sections, mixed lengths, some gated pairs, one
    P_\\k sharing nothing with P_all and one shorter than its common part."""
    rng = random.Random(seed)
    tokens = lambda m: [rng.randrange(4, vocab) for _ in range(m)]  # noqa: E731
    tasks = [[1] + tokens(rng.randint(9, 14)) for _ in range(3)]
    items = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        sections = [tokens(rng.randint(1, 8)) for _ in range(rng.randint(1, 4))]
        tail = tokens(3)
        drops = [task + sum((s for j, s in enumerate(sections) if j != k), []) + tail for k in range(len(sections))]
        drops = [d if rng.random() < 0.7 else None for d in drops]
        items.append(ReplayItem(task + sum(sections, []) + tail, drops, tokens(rng.randint(1, 20))))
    items[0].drop_prompt_ids = [None] * len(items[0].drop_prompt_ids)  # every reward gated
    items[1].drop_prompt_ids[0] = tokens(5)  # no common prefix at all
    items[2].drop_prompt_ids[0] = items[2].all_prompt_ids[:4]  # a prefix of P_all
    return items


@contextmanager
def count_sequences(model):
    """Counts the sequences (batch rows) that go through the model's decoder; the forward of a batch's
    shared prompt prefix (one row, no attention mask) is not a sequence."""
    seen = []

    def count(module, args, kwargs):
        if kwargs.get("attention_mask") is not None:
            seen.append(kwargs["input_ids"].shape[0])

    hook = model.get_decoder().register_forward_pre_hook(count, with_kwargs=True)
    try:
        yield seen
    finally:
        hook.remove()


def assert_outputs_close(got, expected, atol):
    assert len(got) == len(expected)
    for g, (lp, drop, js) in zip(got, expected):
        for tensor, want in ((g.logprob_all, lp), (g.logprob_drop, drop), (g.js, js)):
            assert tensor.shape == want.shape and tensor.dtype == torch.float32
            assert torch.equal(torch.isnan(tensor), torch.isnan(want))
            torch.testing.assert_close(tensor.nan_to_num(-1.0), want.nan_to_num(-1.0), atol=atol, rtol=0)


@pytest.fixture(scope="module")
def items_and_reference(tiny_causal_lm):
    items = random_items(0)
    return items, reference_outputs(tiny_causal_lm, items)


@pytest.mark.parametrize("batch_size,chunk_size", [(1, 128), (3, 5), (4, 1), (16, 7)])
def test_batched_equals_unbatched_loop(tiny_causal_lm, items_and_reference, batch_size, chunk_size):
    items, expected = items_and_reference
    got = replay(tiny_causal_lm, items, js=True, batch_size=batch_size, chunk_size=chunk_size)
    assert_outputs_close(got, expected, atol=1e-5)
    js = torch.cat([e[~torch.isnan(e[:, 0])].flatten() for _, _, e in expected])
    assert js.mean() > 1e-2  # the model is far from uniform: the comparison is not vacuous


def test_query_chunked_forwards_equal_one_pass(tiny_causal_lm, items_and_reference, monkeypatch):
    """Long inputs are forwarded in query chunks that append to the KV cache: same numbers."""
    items, expected = items_and_reference
    monkeypatch.setattr(replay_module, "ATTENTION_BUDGET", 1)  # every chunk at its minimum, 16 queries
    assert_outputs_close(replay(tiny_causal_lm, items, js=True, batch_size=5), expected, atol=1e-5)


def test_replay_distances_is_the_js_of_replay(tiny_causal_lm, items_and_reference):
    items, expected = items_and_reference
    for got, (_, _, js) in zip(replay_distances(tiny_causal_lm, items, batch_size=4), expected):
        torch.testing.assert_close(got.nan_to_num(-1.0), js.nan_to_num(-1.0), atol=1e-5, rtol=0)
    assert all(o.js is None for o in replay(tiny_causal_lm, items[:2]))  # JS only when asked


def test_gated_rows_are_nan_and_not_forwarded(tiny_causal_lm, items_and_reference):
    items, _ = items_and_reference
    stats = ReplayStats()
    progress = []
    with count_sequences(tiny_causal_lm) as seen:
        got = replay(tiny_causal_lm, items, batch_size=3, stats=stats, on_progress=progress.append)
    pairs = [(n, k) for n, it in enumerate(items) for k, d in enumerate(it.drop_prompt_ids)]
    done = [(n, k) for n, k in pairs if items[n].drop_prompt_ids[k] is not None]
    prefills = sum(any(d is not None for d in it.drop_prompt_ids) for it in items)
    assert sum(seen) == prefills + len(done) == stats.sequences_forwarded
    assert stats.replays_done == len(done) and stats.replays_skipped == len(pairs) - len(done)
    assert stats.tokens_replayed == sum(len(items[n].response_ids) for n, _ in done) == sum(progress)
    assert torch.isnan(got[0].logprob_drop).all() and torch.isnan(got[0].logprob_all).all()  # all gated: no forward
    for n, k in pairs:
        assert torch.isnan(got[n].logprob_drop[k]).all() == (items[n].drop_prompt_ids[k] is None)
    replay(tiny_causal_lm, items, stats=stats)  # stats accumulate over calls
    assert stats.replays_done == 2 * len(done)


def test_continuations_forward_only_what_differs_from_p_all(tiny_causal_lm):
    """Each P_\\k continues from P_all's cache: the tokens forwarded are P_all's, plus per pair only
    the part of P_\\k from its first differing token on, plus the response."""
    items = random_items(5, n=4)
    for it in items:
        it.drop_prompt_ids = [d if d is not None else list(it.all_prompt_ids[:-2]) + [7] for d in it.drop_prompt_ids]
    stats = ReplayStats()
    replay(tiny_causal_lm, items, batch_size=1, stats=stats)
    expected = 0
    for it in items:
        expected += len(it.all_prompt_ids) + len(it.response_ids)
        for d in it.drop_prompt_ids:
            common = replay_module._common_length(it.all_prompt_ids, d)
            expected += len(d) - common + len(it.response_ids)
    assert stats.tokens_forwarded == expected  # batch_size 1: no shared-prefix forward either


def test_identical_prompt_gives_exactly_zero(tiny_causal_lm):
    items = random_items(1, n=3)
    items[2].drop_prompt_ids = [list(items[2].all_prompt_ids), None]
    with count_sequences(tiny_causal_lm) as seen:
        (got,) = replay(tiny_causal_lm, items[2:], js=True, batch_size=4)
    assert torch.equal(got.js[0], torch.zeros(len(items[2].response_ids)))
    assert torch.equal(got.logprob_drop[0], got.logprob_all)
    assert torch.isnan(got.js[1]).all()
    assert sum(seen) == 1  # P_all only


def test_raw_frame_items(char_tokenizer):
    """Without a chat template: the raw layout (the tiny policy's), P_all minus the block = sampling ids."""
    task = "List the concert names."
    sections = [("format", "Wrap the query in <sql>."), ("execution", "Expected rows: 3"), ("tables", "concert")]
    response = char_tokenizer("<sql>SELECT 1</sql>", add_special_tokens=False)["input_ids"]
    item = build_replay_item(char_tokenizer, task, sections, response, [True, False, True])
    frame = prompt_frame(char_tokenizer, task)
    assert frame.ids == char_tokenizer(sampling_prompt(task))["input_ids"] and frame.ids[0] == char_tokenizer.bos_token_id
    assert item.all_prompt_ids == char_tokenizer(replay_prompt(task, sections))["input_ids"]
    assert item.drop_prompt_ids[1] is None
    for k in (0, 2):
        assert item.drop_prompt_ids[k] == char_tokenizer(replay_prompt(task, sections, drop=k))["input_ids"]
    block = len(item.all_prompt_ids) - len(frame.ids)
    assert item.all_prompt_ids[: frame.insert_at] + item.all_prompt_ids[frame.insert_at + block:] == frame.ids
    assert item.response_ids == response
    with pytest.raises(ValueError, match="replay_mask has 2 entries for 3 feedback sections"):
        build_replay_item(char_tokenizer, task, sections, response, [True, True])


def test_chat_frame_items(chat_tokenizer):
    """With a chat template: the feedback block sits in the user turn after the task prompt; removing it
    gives the sampling prompt's ids exactly; `null` keeps every token position."""
    task = "How many singers are there?"
    sections = [("format", "Use <sql> tags."), ("execution", "The reference query is: SELECT COUNT(*) FROM singer.")]
    frame = prompt_frame(chat_tokenizer, task)
    assert frame.chat and frame.text == f"<|user|>\n{task}</s>\n<|assistant|>\n"
    assert frame.ids == chat_tokenizer(frame.text, add_special_tokens=False)["input_ids"]
    item = build_replay_item(chat_tokenizer, task, sections, [5, 6], [True, True])
    text = "".join(chat_tokenizer.convert_ids_to_tokens(item.all_prompt_ids))
    assert text == (f"<|user|>\n{task}\n\n### Feedback\n[format] Use <sql> tags.\n[execution] The reference query "
                    f"is: SELECT COUNT(*) FROM singer.</s>\n<|assistant|>\n")
    block = len(item.all_prompt_ids) - len(frame.ids)
    assert item.all_prompt_ids[: frame.insert_at] + item.all_prompt_ids[frame.insert_at + block:] == frame.ids
    assert "".join(chat_tokenizer.convert_ids_to_tokens(item.drop_prompt_ids[1])) == text.replace(
        "\n[execution] The reference query is: SELECT COUNT(*) FROM singer.", "")
    dropped_all = build_replay_item(chat_tokenizer, task, sections[:1], [5], [True]).drop_prompt_ids[0]
    assert dropped_all == frame.ids  # no section left: no block at all
    null = build_replay_item(chat_tokenizer, task, sections, [5, 6], [True, True], ablation="null")
    for k, (name, _) in enumerate(sections):
        assert len(null.drop_prompt_ids[k]) == len(item.all_prompt_ids)
        assert f"[{name}]" + NULL_FILLER[:5] in "".join(chat_tokenizer.convert_ids_to_tokens(null.drop_prompt_ids[k]))
    with pytest.raises(ValueError, match="ablation 'zero'"):
        build_replay_item(chat_tokenizer, task, sections, [5], [True, True], ablation="zero")


def test_empty_prompt_is_an_error(tiny_causal_lm):
    items = random_items(3, n=3)
    items[2].drop_prompt_ids[0] = []
    with pytest.raises(ValueError, match=r"replay item 2: drop_prompt_ids\[0\] is empty"):
        replay(tiny_causal_lm, items)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_batched_equals_unbatched_loop(tiny_causal_lm):
    model = copy.deepcopy(tiny_causal_lm).to("cuda", torch.bfloat16)
    items = random_items(4)
    got = replay(model, items, js=True, batch_size=4, chunk_size=16)
    # bf16 kernels round differently for different batch shapes; outputs stay float32
    assert_outputs_close(got, reference_outputs(model, items), atol=5e-2)


def test_shared_prefix_length():
    assert shared_prefix_length([([1, 2, 3], [9]), ([1, 2, 3], [8])]) == 2  # one prompt token stays per row
    assert shared_prefix_length([([1, 2, 3], [9]), ([1, 5, 3], [8])]) == 1
