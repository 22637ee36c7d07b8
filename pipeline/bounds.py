"""Per-record bounds, checked on the prompt set before any model is loaded or tensor allocated.

A prompt file is hostile input: one record can be long enough to exhaust memory (a 1 MB prompt is
about 200k tokens, and its prefill asks for tens of GB), and a model's chat template is code that
can loop for hours. Here every prompt is rendered as the sampler will render it, with the template
under a time bound, and a record whose prompt plus `max_new_tokens` does not fit the model's
context is rejected by id; the other records go on.

    kept, rejected = fit_to_context(records, tokenizer, context, max_new_tokens)
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from schemas.records import TaskRecord
from verifiers import Rejected

TEMPLATE_SECONDS = 5.0  # a real chat template renders in milliseconds
_TEMPLATE_CODE = "<template>"  # the file name of the code Jinja compiles a template into


class TemplateTimeout(Exception):
    """The chat template ran past its time bound."""


@contextmanager
def template_time_limit(seconds: float) -> Iterator[None]:
    """Raise TemplateTimeout inside any Jinja template that runs longer than `seconds` in this block.

    A trace function checks the clock on each line of template code (only there: other code,
    such as the tokenizer, runs untraced), so an endless template loop is stopped in this
    thread, with no subprocess and no signal (which only the main thread could receive).
    """
    deadline = time.monotonic() + seconds

    def on_line(frame, event, arg):
        if time.monotonic() > deadline:
            raise TemplateTimeout(f"the chat template ran past {seconds:g} s")
        return on_line

    def on_call(frame, event, arg):
        return on_line if frame.f_code.co_filename == _TEMPLATE_CODE else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)


def context_length(model_path: str | Path) -> int | None:
    """The model's context in tokens, from its config.json (None when it does not say)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def render_bounded(tokenizer, record: TaskRecord, seconds: float = TEMPLATE_SECONDS) -> list[int]:
    """The prompt token ids the sampler will feed for `record`, rendered under the time bound.

    Raises ValueError (one line) when the template is refused by Jinja's sandbox or runs too long:
    that is the model's template, not the record, so the run stops; a template that raises on
    this record's content (`raise_exception`) raises jinja2.TemplateError.
    """
    from jinja2.exceptions import SecurityError

    from .sampling import render_prompt

    try:
        with template_time_limit(seconds):
            return render_prompt(tokenizer, record.prompt)[1]
    except SecurityError as error:
        raise ValueError(f"the model's chat template was refused by Jinja's sandbox ({error}); "
                         f"use a model whose template does not reach Python internals") from None
    except TemplateTimeout as error:
        raise ValueError(f"record {record.id!r}: {error} (a template with unbounded loops?); "
                         f"fix the model's chat_template in tokenizer_config.json") from None


def fit_to_context(records: Sequence[TaskRecord], tokenizer, context: int | None, max_new_tokens: int,
                   source: str = "") -> tuple[list[TaskRecord], list[Rejected]]:
    """Split records into those whose rendered prompt plus `max_new_tokens` fits `context`
    tokens (all of them when `context` is None) and Rejected entries naming the others."""
    from jinja2.exceptions import TemplateError

    kept, rejected = [], []
    for record in records:
        try:
            length = len(render_bounded(tokenizer, record))
        except TemplateError as error:
            rejected.append(Rejected(None, record.id, f"record {record.id!r}: field 'prompt': the chat template "
                                                      f"refused it ({error})", "", source))
            continue
        if context is not None and length + max_new_tokens > context:
            rejected.append(Rejected(None, record.id, (
                f"record {record.id!r}: field 'prompt': {length} tokens with the chat template, plus "
                f"max_new_tokens {max_new_tokens}, exceeds the model's context of {context} tokens"), "", source))
            continue
        kept.append(record)
    return kept, rejected
