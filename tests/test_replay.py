import copy
import random
import string
from contextlib import contextmanager

import pytest
import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from pipeline.prompts import replay_prompt, sampling_prompt
from pipeline.replay import (ReplayItem, ReplayStats, build_replay_item, replay_distances, response_logits,
                             shared_prefix_length)


@pytest.fixture(scope="module")
def char_tokenizer():
    """One token per printable character, BOS prepended by default (as Llama's tokenizer does)."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({c: i + 4 for i, c in enumerate(sorted(set(string.printable) - set("\t\r\x0b\x0c")))})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", unk_token="<unk>")


# --- reference: one plain full forward per sequence, textbook JS in float64 ---------------------
def reference_js(model, prompt, response, other_prompt):
    def next_token_probs(p):
        with torch.no_grad():
            logits = model(torch.tensor([p + response], device=model.device)).logits[0].double().cpu()
        return torch.softmax(logits[len(p) - 1 : len(p) - 1 + len(response)], -1)

    p, q = next_token_probs(prompt), next_token_probs(other_prompt)
    m = (p + q) / 2
    kl = lambda a: torch.where(a > 0, a * (a / m).log(), 0.0).sum(-1)  # noqa: E731
    return ((kl(p) + kl(q)) / 2).float()


def reference_distances(model, items):
    out = []
    for it in items:
        d = torch.full((len(it.drop_prompt_ids), len(it.response_ids)), float("nan"))
        for k, drop in enumerate(it.drop_prompt_ids):
            if drop is not None:
                d[k] = reference_js(model, it.all_prompt_ids, it.response_ids, drop)
        out.append(d)
    return out
# -----------------------------------------------------------------------------------------------


def random_items(seed, n=7, vocab=128):
    """Items with a shared task prefix, 1-4 sections, mixed prompt/response lengths, some gated pairs."""
    rng = random.Random(seed)
    tokens = lambda m: [rng.randrange(4, vocab) for _ in range(m)]  # noqa: E731
    items = []
    for _ in range(n):
        task = [1] + tokens(rng.randint(2, 12))
        sections = [tokens(rng.randint(1, 8)) for _ in range(rng.randint(1, 4))]
        drops = [task + sum((s for j, s in enumerate(sections) if j != k), []) for k in range(len(sections))]
        drops = [d if rng.random() < 0.7 else None for d in drops]
        items.append(ReplayItem(task + sum(sections, []), drops, tokens(rng.randint(1, 20))))
    items[0].drop_prompt_ids = [None] * len(items[0].drop_prompt_ids)  # every reward gated
    if all(d is None for d in items[1].drop_prompt_ids):
        items[1].drop_prompt_ids[0] = items[1].all_prompt_ids[:-1]
    return items


@contextmanager
def count_sequences(model):
    """Counts the sequences (batch rows) that go through the model's decoder.

    The forward of a batch's shared prompt prefix (one row, no attention mask) is not a sequence.
    """
    seen = []

    def count(module, args, kwargs):
        if kwargs.get("attention_mask") is not None:
            seen.append(kwargs["input_ids"].shape[0])

    hook = model.get_decoder().register_forward_pre_hook(count, with_kwargs=True)
    try:
        yield seen
    finally:
        hook.remove()


def assert_distances_close(got, expected, atol):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == torch.float32
        assert torch.equal(torch.isnan(g), torch.isnan(e))
        torch.testing.assert_close(g.nan_to_num(-1.0), e.nan_to_num(-1.0), atol=atol, rtol=0)


@pytest.fixture(scope="module")
def items_and_reference(tiny_causal_lm):
    items = random_items(0)
    return items, reference_distances(tiny_causal_lm, items)


@pytest.mark.parametrize("batch_size,chunk_size", [(1, 128), (3, 5), (4, 1), (16, 7)])
def test_batched_equals_unbatched_loop(tiny_causal_lm, items_and_reference, batch_size, chunk_size):
    items, expected = items_and_reference
    got = replay_distances(tiny_causal_lm, items, batch_size=batch_size, chunk_size=chunk_size)
    assert_distances_close(got, expected, atol=1e-5)
    replayed = torch.cat([e[~torch.isnan(e[:, 0])].flatten() for e in expected])
    assert replayed.mean() > 1e-2  # the model is far from uniform: the comparison is not vacuous


def test_gated_rows_are_nan_and_not_forwarded(tiny_causal_lm, items_and_reference):
    items, _ = items_and_reference
    stats = ReplayStats()
    with count_sequences(tiny_causal_lm) as seen:
        got = replay_distances(tiny_causal_lm, items, batch_size=3, stats=stats)
    pairs = [(n, k) for n, it in enumerate(items) for k, d in enumerate(it.drop_prompt_ids)]
    done = [(n, k) for n, k in pairs if items[n].drop_prompt_ids[k] is not None]
    prefills = sum(any(d is not None for d in it.drop_prompt_ids) for it in items)
    assert sum(seen) == prefills + len(done) == stats.sequences_forwarded
    assert stats.replays_done == len(done) and stats.replays_skipped == len(pairs) - len(done)
    assert stats.tokens_replayed == sum(len(items[n].response_ids) for n, _ in done)
    assert torch.isnan(got[0]).all()  # all gated: no P_all forward either
    for n, k in pairs:
        assert torch.isnan(got[n][k]).all() == (items[n].drop_prompt_ids[k] is None)
    replay_distances(tiny_causal_lm, items, stats=stats)  # stats accumulate over calls
    assert stats.replays_done == 2 * len(done)


def test_identical_prompt_gives_exactly_zero(tiny_causal_lm):
    items = random_items(1, n=3)
    items[2].drop_prompt_ids = [list(items[2].all_prompt_ids), None]
    with count_sequences(tiny_causal_lm) as seen:
        got = replay_distances(tiny_causal_lm, items[2:], batch_size=4)
    assert torch.equal(got[0][0], torch.zeros(len(items[2].response_ids)))
    assert torch.isnan(got[0][1]).all()
    assert sum(seen) == 1  # P_all only


def test_build_replay_item(char_tokenizer):
    task = "List the concert names."
    sections = [("format", "Wrap the query in <sql>."), ("execution", "Expected rows: 3"), ("tables", "concert")]
    response = char_tokenizer("<sql>SELECT 1</sql>", add_special_tokens=False)["input_ids"]
    item = build_replay_item(char_tokenizer, task, sections, response, [True, False, True])
    assert item.all_prompt_ids == char_tokenizer(replay_prompt(task, sections))["input_ids"]
    assert item.all_prompt_ids[0] == char_tokenizer.bos_token_id
    assert item.drop_prompt_ids[1] is None
    for k in (0, 2):
        assert item.drop_prompt_ids[k] == char_tokenizer(replay_prompt(task, sections, drop=k))["input_ids"]
        assert f"[{sections[k][0]}]" not in char_tokenizer.decode(item.drop_prompt_ids[k]).replace(" ", "")
    assert item.response_ids == response
    # the task prompt is a shared prefix of P_all and every P_\k
    prefix = char_tokenizer(task)["input_ids"]
    assert all(p[: len(prefix)] == prefix for p in [item.all_prompt_ids, item.drop_prompt_ids[0]])
    with pytest.raises(ValueError, match="replay_mask has 2 entries for 3 feedback sections"):
        build_replay_item(char_tokenizer, task, sections, response, [True, True])


def test_tokenized_items_end_to_end(tiny_causal_lm, char_tokenizer):
    rng = random.Random(2)
    items = []
    for n in range(5):
        sections = [(f"r{k}", "".join(rng.choices(string.ascii_lowercase + " ", k=rng.randint(3, 15))))
                    for k in range(rng.randint(2, 4))]
        response = char_tokenizer("".join(rng.choices(string.ascii_letters, k=rng.randint(1, 25))),
                                  add_special_tokens=False)["input_ids"]
        items.append(build_replay_item(char_tokenizer, f"Task {n}: " + "x" * rng.randint(0, 20), sections,
                                       response, [rng.random() < 0.8 for _ in sections]))
    got = replay_distances(tiny_causal_lm, items, batch_size=4, chunk_size=8)
    assert_distances_close(got, reference_distances(tiny_causal_lm, items), atol=1e-5)


def test_empty_prompt_is_an_error(tiny_causal_lm):
    items = random_items(3, n=3)
    items[2].drop_prompt_ids[0] = []
    with pytest.raises(ValueError, match=r"replay item 2: drop_prompt_ids\[0\] is empty"):
        replay_distances(tiny_causal_lm, items)


def test_prompts_module_layout_is_what_replay_assumes():
    # P_all ends like the sampling prompt, so the response follows the same marker as when sampled
    task = "Do it."
    assert replay_prompt(task, [("a", "x")]).endswith(sampling_prompt(task)[len(task.rstrip()) + 1 :])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_batched_equals_unbatched_loop(tiny_causal_lm):
    model = copy.deepcopy(tiny_causal_lm).to("cuda", torch.bfloat16)
    items = random_items(4)
    got = replay_distances(model, items, batch_size=4, chunk_size=16)
    # bf16 kernels round differently for different batch shapes; divergences stay float32
    assert_distances_close(got, reference_distances(model, items), atol=2e-2)


def test_shared_prefix_cache_equals_full_forwards(tiny_causal_lm):
    torch.manual_seed(3)
    prefix = torch.randint(3, 128, (40,)).tolist()
    seqs = [(prefix + torch.randint(3, 128, (n,)).tolist(), torch.randint(3, 128, (t,)).tolist())
            for n, t in ((5, 7), (1, 12), (9, 3))]
    assert shared_prefix_length(seqs) >= 40  # the prefix, plus any chance agreement after it
    reused = response_logits(tiny_causal_lm, seqs)
    full = response_logits(tiny_causal_lm, seqs, min_shared_prefix=10**9)
    for b, (_, response) in enumerate(seqs):
        torch.testing.assert_close(reused[b, :len(response)], full[b, :len(response)], atol=1e-5, rtol=1e-5)
    assert shared_prefix_length([([1, 2, 3], [9]), ([1, 2, 3], [8])]) == 2  # one prompt token stays per row
    assert shared_prefix_length([([1, 2, 3], [9]), ([1, 5, 3], [8])]) == 1
