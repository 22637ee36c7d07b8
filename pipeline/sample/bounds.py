"""Time bounds on code the pipeline runs but did not write: chat templates.

The annotate stage renders every prompt before any model loads (`tokencredit.pipeline.annotate.prompt_fits`:
a record whose prompt plus `max_new_tokens` does not fit the model's context is rejected there);
this module bounds the template's time while it does. Verifiers run in worker processes of
their own (`tokencredit.verifiers.isolation`), bounded in time and memory.

    ids = render_bounded(tokenizer, record)   # the sampler's prompt ids, or ValueError / TemplateError
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tokencredit.schemas.records import TaskRecord

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


def render_bounded(tokenizer, record: TaskRecord, seconds: float = TEMPLATE_SECONDS) -> list[int]:
    """The prompt token ids the sampler will feed for `record`, rendered under the time bound.

    Raises ValueError (one line) when the template is refused by Jinja's sandbox or runs too long:
    that is the model's template, not the record, so the run stops; a template that raises on
    this record's content (`raise_exception`) raises jinja2.TemplateError.
    """
    from jinja2.exceptions import SecurityError

    from tokencredit.pipeline.sample.rows import render_prompt

    try:
        with template_time_limit(seconds):
            return render_prompt(tokenizer, record.prompt)[1]
    except SecurityError as error:
        raise ValueError(f"the model's chat template was refused by Jinja's sandbox ({error}); "
                         f"use a model whose template does not reach Python internals") from None
    except TemplateTimeout as error:
        raise ValueError(f"record {record.id!r}: {error} (a template with unbounded loops?); "
                         f"fix the model's chat_template in tokenizer_config.json") from None
