"""What the vLLM engine prints: nothing of its own unless the run is verbose (`--verbose`, which sets
TOKENCREDIT_VERBOSE=1 for the process and the workers it starts), so that a run's log is tokencredit's lines.

Quiet, the engine's INFO and WARNING lines are dropped (VLLM_LOGGING_LEVEL=ERROR unless the user set it, from before
its import), and so are the Python warnings its import and start raise and, in a command, the C++ warnings of its
CPU extension (TORCH_CPP_LOG_LEVEL=ERROR, `quiet_cpp_log`); its progress bars are replaced by tokencredit's own
`sampling:` progress (the transformers backend's line) or left off (loading its weights), and an error the engine
logs while it starts is held and printed after tokencredit's one-line message (EngineError's details). Verbose,
the engine logs as it likes (on stderr), and the warning it prints about chunked prefill, which tokencredit turns
off on CPU on purpose, is explained in a line of its own first (CHUNKED_PREFILL_NOTE).
"""
from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager


VERBOSE_ENV = "TOKENCREDIT_VERBOSE"
CHUNKED_PREFILL_NOTE = ("tokencredit: chunked prefill is off on purpose (with per-request seeds the CPU engine fails "
                        "once a call's prompt tokens pass its batch limit); vLLM's warning that it may crash or "
                        "produce incorrect outputs refers to that setting")


class EngineError(RuntimeError):
    """The engine did not start: the message is tokencredit's one line; `details` the engine's own error lines,
    printed after it."""

    def __init__(self, message: str, details: list[str]):
        super().__init__(message)
        self.details = details


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes")


def quiet_cpp_log() -> None:
    """In a quiet command, before torch loads (it reads the level once): torch's C++ log at ERROR, where the engine's
    CPU extension writes its warnings ("[W1207 ...] Warning: NUMA binding: ..."), unless the user set it."""
    if not verbose():
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


@contextmanager
def quiet_import():
    """Around `import vllm` (its logging is configured at import): its INFO and WARNING lines and the Python
    warnings it raises off unless verbose. Its log goes to stderr, with tokencredit's lines (vLLM's default is
    stdout, which holds a command's result)."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if verbose():  # asked for on the command line: over a level that a quiet process started it with
        os.environ["VLLM_LOGGING_LEVEL"] = "INFO"
        yield
        return
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM configures its loggers only once an engine starts: what its import logs ("Triton is installed, but ...")
    # would reach the root logger's handlers (Prefect's console) unless its level is set first
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def load_options() -> dict:
    """The engine's keyword arguments for its own output: no bar while it loads its weights unless verbose."""
    return {} if verbose() else {"use_tqdm_on_load": False}


class _Held(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def engine_start():
    """Around the engine's start: quiet, its error lines are held (yields the list), so that tokencredit's
    message comes first, and its Python warnings dropped; verbose, nothing is held."""
    logger = logging.getLogger("vllm")
    if verbose():
        yield []
        return
    held, handlers = _Held(), logger.handlers[:]
    logger.handlers = [held]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield held.lines
    finally:
        logger.handlers = handlers


