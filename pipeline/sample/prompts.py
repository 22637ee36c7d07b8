"""Prompts for sampling and for MRTPO's leave-one-out replay, in the policy's own frame (method.md section 2).

The replay shows the policy the context it sampled in, with the verifier feedback spliced in:

    chat model (has a chat template)           no chat template (the shipped tiny policy)
    <|im_start|>user                           <task prompt>
    <task prompt>                              ### Feedback
                                               [format] The query must ...
    ### Feedback                               [execution] The reference query is: SELECT ...
    [format] The query must ...                ### Response
    [execution] The reference query is: ...    <response tokens, teacher-forced>
    <|im_end|>
    <|im_start|>assistant
    <response tokens, teacher-forced>

Each section states what its verifier expected (`feedback_sections`), not the response's own tokens:
quoting a wrong token makes it more likely under `P_all`, which blurs "mentioned" with "wrong".

`PromptFrame` holds the exact token ids the sampler fed the model and the token index right after the
task prompt. `P_all` is those ids with the tokenized feedback block inserted at that index, so removing the
block gives the sampling ids exactly; `P_\\k` removes section k (`drop`) or replaces its text by neutral
filler of the same token length (`null`). Each piece of the block is tokenized on its own, so `P_all` and
`P_\\k` agree token for token up to section k.

The raw layout is the one the tiny policy was trained on (`replay_prompt`, `sampling_prompt`).
"""
from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from tokencredit.schemas.records import RewardScore

from tokencredit.pipeline.config import ABLATIONS, FEEDBACK_STYLES

TEMPLATE_VERSION = "replay-v2"
FEEDBACK_HEADER = "### Feedback\n"
RESPONSE_MARKER = "### Response\n"
NULL_FILLER = " This check gives no details."  # cycled to the length of the section it replaces


def sampling_prompt(task_prompt: str) -> str:
    """The raw layout: the text a policy without a chat template continues when it samples."""
    return f"{task_prompt.rstrip()}\n{RESPONSE_MARKER}"


def feedback_section(reward_name: str, feedback: str) -> str:
    return f"[{reward_name}] {' '.join(feedback.split())}\n"


def replay_prompt(task_prompt: str, sections: Sequence[tuple[str, str]], drop: int | None = None) -> str:
    """The raw layout's `P_all` (drop=None) or `P_\\k` (drop=k) as text (the tiny policy's training data).

    sections: (reward_name, feedback) in the verifier's fixed reward order.
    """
    kept = [feedback_section(name, text) for k, (name, text) in enumerate(sections) if k != drop]
    block = FEEDBACK_HEADER + "".join(kept) if kept else ""
    return f"{task_prompt.rstrip()}\n{block}{RESPONSE_MARKER}"


def feedback_text(reward: RewardScore, with_observed: bool = False) -> str:
    """A reward's section text: what its verifier expected, and what it found when `with_observed`."""
    return f"{reward.feedback} {reward.observed}" if with_observed and reward.observed else reward.feedback


def restates_prompt(reward: RewardScore, task_prompt: str) -> bool:
    """The reward's expected statement is already in the task prompt (an instruction's constraint)."""
    expected = " ".join(reward.feedback.split())
    return bool(expected) and expected in " ".join(task_prompt.split())


def feedback_sections(rewards: Sequence[RewardScore], task_prompt: str,
                      style: str = "auto") -> tuple[list[tuple[str, str]], list[bool]]:
    """(reward name, section text) per reward, and whether each section points at the response.

    expected            what each verifier expected; never quotes the response
    expected+observed   that, and what it found (may quote the response)
    auto                what it expected; where the task prompt already says that (an instruction
                        constraint), the section would add nothing, so it adds what was found

A section points at the response when its expected part restates the prompt and it quotes what was
found: its only news is the quote, which makes the quoted tokens more likely, right or wrong.
    """
    if style not in FEEDBACK_STYLES:
        raise ValueError(f"feedback style {style!r}: choose from {', '.join(FEEDBACK_STYLES)}")
    sections, points = [], []
    for reward in rewards:
        restated = restates_prompt(reward, task_prompt) and bool(reward.observed)
        observed = style == "expected+observed" or (style == "auto" and restated)
        sections.append((reward.name, feedback_text(reward, with_observed=observed)))
        points.append(observed and restated)
    return sections, points


@dataclass(frozen=True)
class PromptFrame:
    text: str  # the sampling prompt as text
    ids: list[int]  # its token ids, exactly as fed to the model when sampling
    insert_at: int  # token index right after the task prompt: where the feedback block goes
    chat: bool  # rendered with the tokenizer's chat template


def prompt_frame(tokenizer, task_prompt: str) -> PromptFrame:
    """The sampling prompt of `task_prompt`: the chat template when the tokenizer has one, else the raw layout."""
    chat = bool(getattr(tokenizer, "chat_template", None))
    if chat:
        text = chat_prompt(tokenizer, task_prompt)
        content = task_prompt.strip()
        found = text.rfind(content)
        if not content or found < 0:
            raise ValueError("the chat template does not show the task prompt verbatim; the replay cannot "
                             "place the feedback after it")
        end = found + len(content)
    else:
        text = sampling_prompt(task_prompt)
        end = len(task_prompt.rstrip()) + 1  # after the newline that ends the task prompt
    ids, offsets = encode_prompt(tokenizer, text, task_prompt, chat, offsets=True)
    # the first token that does not end before the task prompt's end (special tokens map to (0, 0))
    insert_at = next((i for i, (s, e) in enumerate(offsets) if e > end or (s >= end and e > s)), len(ids))
    return PromptFrame(text, ids, insert_at, chat)


def chat_prompt(tokenizer, task_prompt: str) -> str:
    """The sampling prompt of a tokenizer with a chat template: one user turn, then the assistant's turn begun."""
    return tokenizer.apply_chat_template([{"role": "user", "content": task_prompt}], tokenize=False,
                                         add_generation_prompt=True)


def encode_prompt(tokenizer, text: str, task_prompt: str, chat: bool,
                  offsets: bool = False) -> tuple[list[int], list[tuple[int, int]] | None]:
    """(token ids, with `offsets` each token's (start, end) characters in `text`, else None) of a sampling prompt
    `text` rendered from `task_prompt` (`chat`: by the chat template). A special token's text typed in the task
    prompt ("<eos>", "<|im_end|>") is encoded as text, never as that special token: to the model it would end the
    prompt or the turn. The chat template's own special tokens stay special (the raw layout has none of its own)."""
    if not chat:
        spans = [(0, len(text), True, True)]  # (begin, end, special token texts as text, add BOS/EOS as configured)
    else:
        content = task_prompt.strip()
        start = text.rfind(content) if content else -1
        if not any(token in content for token in _special_texts(tokenizer)):
            spans = [(0, len(text), False, False)]  # one call: the ids every other prompt always had
        elif start < 0:
            raise ValueError("the task prompt holds a special token's text and the chat template does not show "
                             "the prompt verbatim: it cannot be encoded as text")
        else:
            end = start + len(content)
            spans = [(0, start, False, False), (start, end, True, False), (end, len(text), False, False)]
    ids, spans_out = [], []
    for begin, end, as_text, added in spans:
        encoder = _text_encoder(tokenizer) if as_text else tokenizer
        encoded = encoder(text[begin:end], add_special_tokens=added, return_offsets_mapping=offsets)
        ids += encoded["input_ids"]
        if offsets:  # a special token's (0, 0) stays as it is
            spans_out += [(s + begin, e + begin) if e > s else (s, e) for s, e in encoded["offset_mapping"]]
    return ids, spans_out if offsets else None


_TEXT_ENCODERS: dict[int, tuple] = {}  # id(tokenizer) -> (tokenizer, its copy that encodes special texts as text)
_TEXT_ENCODERS_LOCK = threading.Lock()


def _text_encoder(tokenizer):
    """A copy of `tokenizer` that encodes a special token's text as text. Passing `split_special_tokens` per call
    would flip the fast tokenizer's own state under other threads' encodes (shards on threads share a tokenizer:
    "RuntimeError: Already borrowed", and a concurrent encode in the wrong mode); the copy keeps it set."""
    with _TEXT_ENCODERS_LOCK:
        held = _TEXT_ENCODERS.get(id(tokenizer))
        if held is None or held[0] is not tokenizer:
            encoder = copy.deepcopy(tokenizer)
            encoder.split_special_tokens = True
            if hasattr(encoder, "_tokenizer"):  # a fast tokenizer: the flag lives in its Rust tokenizer
                encoder._tokenizer.encode_special_tokens = True
            held = _TEXT_ENCODERS[id(tokenizer)] = (tokenizer, encoder)
        return held[1]


def _special_texts(tokenizer) -> list[str]:
    """The text of every special token of `tokenizer` (its named ones and the added tokens marked special)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}).values()
    return list({*tokenizer.all_special_tokens, *(str(token) for token in added if token.special)})


def _pieces(chat: bool, sections: Sequence[tuple[str, str]]) -> tuple[str, list[str]]:
    """(header, one text per section) of the feedback block in a frame."""
    if chat:  # a paragraph of the user turn, after the task prompt
        return "\n\n" + FEEDBACK_HEADER.rstrip("\n"), ["\n" + feedback_section(n, t).rstrip("\n") for n, t in sections]
    return FEEDBACK_HEADER, [feedback_section(n, t) for n, t in sections]


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def null_ids(tokenizer, section_ids: Sequence[int], name: str, chat: bool) -> list[int]:
    """Neutral filler for a section: its label, then `NULL_FILLER` cycled to the section's token length."""
    label = _encode(tokenizer, ("\n" if chat else "") + f"[{name}]")
    end = [] if chat else _encode(tokenizer, "\n")
    filler = _encode(tokenizer, NULL_FILLER)
    body = [filler[i % len(filler)] for i in range(max(len(section_ids) - len(label) - len(end), 1))]
    return label + body + end


def replay_prompt_ids(tokenizer, frame: PromptFrame, sections: Sequence[tuple[str, str]],
                      replay_mask: Sequence[bool], ablation: str = "drop") -> tuple[list[int], list[list[int] | None]]:
    """(`P_all`, [`P_\\k` or None per reward]) token ids; P_\\k only where replay_mask[k]."""
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation {ablation!r}: choose from {', '.join(ABLATIONS)}")
    header, texts = _pieces(frame.chat, sections)
    head, tail = frame.ids[: frame.insert_at], frame.ids[frame.insert_at:]
    header_ids, section_ids = _encode(tokenizer, header), [_encode(tokenizer, t) for t in texts]

    def prompt(replaced: int | None = None, by: list[int] | None = None) -> list[int]:
        kept = [by if k == replaced else s for k, s in enumerate(section_ids)]
        kept = [s for s in kept if s is not None]
        return head + (header_ids + sum(kept, []) if kept else []) + tail

    drops = [None if not replay else
             prompt(k, None if ablation == "drop" else null_ids(tokenizer, section_ids[k], sections[k][0], frame.chat))
             for k, replay in enumerate(replay_mask)]
    return prompt(), drops
