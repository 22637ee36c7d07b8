"""Decoded text of a growing response in time linear in its length.

Decoding is not additive over tokens (byte-level BPE splits characters over tokens; a window's first
token may lose its leading space), so tokencredit's definitions decode whole prefixes: a response stops
when its decoded text contains a stop string; a token's span (`token_spans`) ends where the
decoded prefix up to it ends. Decoding every prefix costs O(T^2). The effects that make decoding
non-additive are local (a few bytes), so a window that starts a few tokens back, with CONTEXT_CHARS
decoded characters of context, grows exactly as the whole decode does; these helpers read windows only.
"""
from __future__ import annotations

from collections.abc import Sequence

# Characters of decoded left context before the text a window is read for: a window that starts inside
# a multi-byte character, or whose first token loses a leading space, differs from the whole decode only
# in its first few characters.
CONTEXT_CHARS = 8
# Tokens a decoding window spans before it moves forward.
WINDOW_TOKENS = 32


def stop_reached(tokenizer, token_ids: Sequence[int], stop: Sequence[str]) -> bool:
    """Whether the decoded response contains one of the stop strings (decodes all of it)."""
    return bool(stop) and any(s in tokenizer.decode(token_ids, skip_special_tokens=True) for s in stop)


def decoded_tail(tokenizer, token_ids: Sequence[int], end: int, chars: int) -> tuple[int, str]:
    """(start, decode(token_ids[start:end])) with at least `chars` characters, or start == 0."""
    width = 4
    while True:
        start = max(0, end - width)
        text = tokenizer.decode(token_ids[start:end], skip_special_tokens=True)
        if start == 0 or len(text) >= chars:
            return start, text
        width *= 2


class StopChecker:
    """Fed a response token by token, says when its decoded text first contains a stop string, as
    `stop_reached` on the whole response would, in time linear in the response's length: a string that
    the newest token completes lies in the last len(string) + a few characters, so only a window of
    the latest tokens is decoded and searched (it moves forward every WINDOW_TOKENS tokens), and a hit
    is confirmed on the whole decode (once per response).
    """

    def __init__(self, tokenizer, stop: Sequence[str]):
        self.tokenizer, self.stop, self.token_ids, self.start = tokenizer, tuple(stop), [], 0
        self.tail_chars = max(map(len, self.stop), default=0) + CONTEXT_CHARS

    def fork(self, token_ids: Sequence[int] = ()) -> "StopChecker":
        """A checker for this response's continuation: it holds this one's tokens, then `token_ids` (a
        response prefix a continuation goes on from; a stop string it completes is not reported)."""
        other = StopChecker(self.tokenizer, self.stop)
        other.token_ids, other.start = [*self.token_ids, *token_ids], self.start  # the window moves on the next add
        return other

    def add(self, token_id: int) -> bool:
        """Append a token; True when the response now contains a stop string."""
        self.token_ids.append(token_id)
        if not self.stop:
            return False
        end = len(self.token_ids) - 1
        if end - self.start > WINDOW_TOKENS:
            self.start, _ = decoded_tail(self.tokenizer, self.token_ids, end, self.tail_chars)
        window = self.tokenizer.decode(self.token_ids[self.start:], skip_special_tokens=True)
        return any(s in window for s in self.stop) and stop_reached(self.tokenizer, self.token_ids, self.stop)


def truncate_at_stop(tokenizer, token_ids: list[int], stop: Sequence[str]) -> list[int]:
    """token_ids up to and including the token at which a stop string first completes (all if none)."""
    checker = StopChecker(tokenizer, stop)
    for t, token_id in enumerate(token_ids):
        if checker.add(token_id):
            return token_ids[:t + 1]
    return token_ids


def token_spans(tokenizer, token_ids: Sequence[int]) -> tuple[list[str], list[int], list[int]]:
    """Text and [char_start, char_end) of each token within the decoded response.

    A token ends where the decoded prefix up to it ends: decoding prefixes (not single tokens) keeps
    byte-level BPE merges and skipped special tokens consistent with how the response text itself was
    decoded. In linear time: each token's growth of the decoded text is read from a window that starts
    a few tokens back with CONTEXT_CHARS characters of context, and moves forward every WINDOW_TOKENS.
    A token's text is its span of that text (" age", not the vocabulary entry "Ġage"); a token with no
    span of its own (a special token such as the end of sequence) is decoded alone ("<|im_end|>").
    """
    ends, end, start, before = [], 0, 0, ""
    for t in range(len(token_ids)):
        if t - start > WINDOW_TOKENS:
            start, before = decoded_tail(tokenizer, token_ids, t, CONTEXT_CHARS)
        after = tokenizer.decode(token_ids[start:t + 1], skip_special_tokens=True)
        end += len(after) - len(before)
        ends.append(end)
        before = after
    starts = [0, *ends[:-1]]
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    texts = [text[s:e] if e > s else tokenizer.decode([t]) for t, s, e in zip(token_ids, starts, ends)]
    return texts, starts, ends
