"""Time bounds on chat templates (code the pipeline runs but did not write) and on built-in verifier calls.

The annotate stage renders every prompt before any model loads (`tokencredit.pipeline.annotate.prompt_fits`:
a record whose prompt plus `max_new_tokens` does not fit the model's context is rejected there);
this module bounds the template's time while it does. Each built-in verifier call runs in the
annotate process through a `BoundedCaller`, so one that hangs costs its response, not the run;
plugin verifiers run in worker processes (`tokencredit.verifiers.isolation`), bounded in time and memory.

    ids = render_bounded(tokenizer, record)   # the sampler's prompt ids, or ValueError / TemplateError
    call = BoundedCaller(5.0); call(fn, *args)  # fn's value, or CallTimeout / CallAborted
"""
from __future__ import annotations

import queue
import sys
import threading
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


class CallTimeout(Exception):
    """A bounded call ran past its time bound (it may still be running, abandoned)."""


class CallAborted(Exception):
    """The called code raised SystemExit, KeyboardInterrupt or another BaseException: that is its
    own failure, and must not end this process."""


class BoundedCaller:
    """Runs calls one at a time on a daemon thread and waits at most `seconds` for each.

    Python cannot kill a thread: a call past the bound is abandoned where it is (as a daemon thread
    it does not hold the process open at exit) and the next call gets a fresh thread. Code that
    hangs inside C while holding the GIL would still stall the process: only the built-in verifiers
    (this package's code; the model's SQL runs in a sandbox process of its own) are called this way.
    One thread serves every call until then, so a bounded call costs a queue round trip.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._jobs: queue.SimpleQueue | None = None

    def __call__(self, fn, *args):
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=_serve_calls, args=(self._jobs,), daemon=True, name="bounded-call").start()
        done, box = threading.Event(), []
        self._jobs.put((fn, args, box, done))
        if not done.wait(self.seconds):
            self.close()  # the stuck thread ends when (if) its call returns
            raise CallTimeout(f"ran past {self.seconds:g} s")
        ok, value = box[0]
        if ok:
            return value
        raise value

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None


def _serve_calls(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        fn, args, box, done = job
        try:
            box.append((True, fn(*args)))
        except Exception as error:  # noqa: BLE001 - handed back to the caller as it is
            box.append((False, error))
        except BaseException as error:  # noqa: BLE001 - SystemExit in called code is not ours to obey
            box.append((False, CallAborted(f"{type(error).__name__}({', '.join(map(repr, error.args))})")))
        done.set()
