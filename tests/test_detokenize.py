"""Windowed decoding against the quadratic definitions it replaces (decode every prefix), on real
tokenizers: the shipped byte-level BPE, a one-token-per-byte tokenizer (every multi-byte character is
split over tokens) and SmolLM2's when it is pulled."""
from __future__ import annotations

import random

import pytest

from tokencredit.pipeline.sample.detokenize import StopChecker, stop_reached, truncate_at_stop
from tokencredit.pipeline.models.loading import load_tokenizer
from tokencredit.pipeline.models.registry import is_pulled
from tokencredit.pipeline.sample.detokenize import token_spans
from tests.test_models import tiny_tokenizer

SMOLLM2 = "smollm2-135m-instruct"
TEXTS = ["<sql>SELECT name FROM singer WHERE age > 30;</sql>", "Héllo wörld — naïve café, 中文字符 and 😀🎉!",
         '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n\nDone.',
         "line one\n\nline two  with  spaces , and ' quotes ' ; n't 's"]


def tokenizers():
    found = [("shipped", load_tokenizer()), ("bytes", tiny_tokenizer())]
    if is_pulled(SMOLLM2):
        found.append(("smollm2", load_tokenizer(SMOLLM2)))
    return found


@pytest.fixture(scope="module", params=[name for name, _ in tokenizers()])
def tokenizer(request):
    return dict(tokenizers())[request.param]


def sequences(tokenizer, count: int = 6, length: int = 120) -> list[list[int]]:
    """Encoded texts, the same with special tokens inside, and uniformly random ids (which split
    characters, and put special tokens, anywhere)."""
    rng = random.Random(0)
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    specials = tokenizer.all_special_ids
    with_specials = [[t for i in ids for t in ([i, rng.choice(specials)] if rng.random() < 0.2 else [i])]
                     for ids in encoded]
    vocab = len(tokenizer)  # slow on a large vocabulary: read it once
    random_ids = [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]
    return encoded + with_specials + random_ids + [specials * 20 + encoded[1]]


def prefix_texts(tokenizer, token_ids) -> list[str]:
    """The definitions decode every prefix: element t is the text of token_ids[:t + 1]."""
    return [tokenizer.decode(token_ids[:t + 1], skip_special_tokens=True) for t in range(len(token_ids))]


def test_token_spans_equal_the_prefix_decodes(tokenizer):
    for ids in sequences(tokenizer):
        ends = [len(text) for text in prefix_texts(tokenizer, ids)]
        texts, starts, spans_ends = token_spans(tokenizer, ids)
        assert (starts, spans_ends) == ([0, *ends[:-1]], ends)
        spanned = "".join(text for text, s, e in zip(texts, starts, ends) if e > s)
        assert spanned == tokenizer.decode(ids, skip_special_tokens=True)


def test_stop_checks_end_where_the_whole_decode_first_contains_a_stop_string(tokenizer):
    rng = random.Random(1)
    for ids in sequences(tokenizer):
        prefixes = prefix_texts(tokenizer, ids)
        text = prefixes[-1]
        # strings that occur (at random places, some spanning a split character) and ones that do not
        found = [text[i:i + rng.randint(1, 6)] for i in rng.sample(range(len(text)), min(3, len(text)))]
        for stop in [*([s] for s in found), found + ["never there"], ["\n\n", "</sql>"]]:
            first = next((t + 1 for t, prefix in enumerate(prefixes) if any(s in prefix for s in stop)), None)
            expected = ids[:first] if first else ids
            assert truncate_at_stop(tokenizer, ids, stop) == expected
            assert stop_reached(tokenizer, ids, stop) == (first is not None)
            checker = StopChecker(tokenizer, stop)
            assert [checker.add(i) for i in expected] == [False] * (len(expected) - 1) + [first is not None]


class CountingTokenizer:
    """A real tokenizer that also counts the tokens it is asked to decode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, 0

    def decode(self, ids, **kwargs):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, **kwargs)

    def convert_ids_to_tokens(self, ids):
        return self.tokenizer.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("length", [256, 2048])
def test_decoding_work_grows_linearly_with_the_response(length):
    """Tokens decoded per response token stay bounded (the prefix definitions decode T / 2 per token)."""
    tokenizer = CountingTokenizer(load_tokenizer())
    ids = (tokenizer.tokenizer(TEXTS[2] + TEXTS[1], add_special_tokens=False)["input_ids"] * 200)[:length]
    token_spans(tokenizer, ids)
    assert tokenizer.decoded / length < 60
    tokenizer.decoded = 0
    truncate_at_stop(tokenizer, ids, ["not in the text"])
    assert tokenizer.decoded / length < 60
