"""Verifier plugins: any importable callable scores responses, in the spirit of TRL's reward functions.

    def brevity(record: dict, response: str):
        yield ("brevity", float(len(response) <= 200), "Answer in at most 200 characters.")

    tokencredit annotate --prompts poems.jsonl --verifier poem=my_rewards:brevity
    refs = verifiers.plugins.resolve(["poem=my_rewards:brevity"])    # from Python
    scores = verifiers.verify(record, response, refs)

A spec is `[TASK=]TARGET`; without `TASK=` the verifier scores every record (after the built-in
verifier's rewards, if the record has one). TARGET is `package.module:callable`, `path/to/file.py:
callable`, or the name of an installed entry point in the group `tokencredit.verifiers`
(`installed()` lists them). A dotted module is imported as it is, else from the current folder.

The callable gets the record as a dict (every field of its line; built-in records as their
fields) and the response text, and returns an iterable of `(name, score, feedback[, observed[, spans]])`
tuples or objects with those attributes: `score` a number in [0, 1], `feedback` what the verifier
expected (never the response's own tokens), `observed` what it found (may quote the response),
`spans` the [start, end) character spans of the response that violate the reward (sorted, disjoint,
inside the response; `tokencredit.verifiers.spans`), which `--locate verifier|both` turns into token credit.
It must return the same names, in the same order, for every response of one record.

In Python a verifier may also be the object itself: `of_object(obj, task)` is a ref that calls it in
this process (the TRL trainers take these); annotate records each verifier by its importable target,
so it takes only `resolve`'s refs.

A `PluginRef` carries the sha256 of the callable's source file: it is part of the annotate
config, so of the dataset's identity, and a worker (a Dask process imports the target by its
path) refuses a source that changed since the run started.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from tokencredit.schemas.records import PluginSpec, RewardScore, TaskRecord

from tokencredit.verifiers import spans
from tokencredit.verifiers.text import encodable

ENTRY_POINT_GROUP = "tokencredit.verifiers"


class PluginError(ValueError):
    """A plugin cannot be found or imported, or returned something that is not a list of rewards."""


@dataclass(frozen=True)
class PluginRef:
    target: str  # "package.module:callable" or "/absolute/file.py:callable"
    task: str | None = None  # None: every record
    source_sha256: str = ""  # of the callable's source file when the ref was resolved


@dataclass(frozen=True)
class ObjectRef(PluginRef):
    """A verifier given as a Python object, called in this process: nothing imports it by `target`
    (which only names it in messages), so a run's identity cannot record it."""
    obj: Callable[[dict, str], Any] | None = field(default=None, compare=False, repr=False)


def of_object(obj: Any, task: str | None = None) -> ObjectRef:
    """A ref to the verifier object `obj` (a callable record, response -> rewards) for records of `task` (None: every record)."""
    if not callable(obj):
        raise PluginError(f"verifier {obj!r}: not callable; a verifier is a callable (record, response) -> rewards")
    if "completions" in _parameters(obj):
        raise PluginError(f"verifier {_label(obj)}: a TRL reward function (it takes `completions`); "
                          "make it a verifier with trl_verifier(fn, feedback=...)")
    if task is not None and (not isinstance(task, str) or not task.strip()):
        raise PluginError(f"verifier {_label(obj)}: task {task!r} is not a non-empty string")
    return ObjectRef(_label(obj), task, obj=obj)


def _parameters(fn: Any) -> Sequence[str]:
    try:
        return list(inspect.signature(fn, follow_wrapped=False).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return ()


def _label(obj: Any) -> str:
    inner = inspect.unwrap(obj)
    owner = inner if inspect.isfunction(inner) or inspect.ismethod(inner) else type(inner)
    return f"{owner.__module__}:{owner.__qualname__}"


def resolve(specs: Iterable[str]) -> tuple[PluginRef, ...]:
    """`[TASK=]TARGET` specs -> refs: entry points looked up, file paths made absolute, each
    target imported once here and its source hashed. PluginError says what is wrong."""
    return tuple(_resolve(spec) for spec in specs)


def _resolve(spec: str) -> PluginRef:
    task, sep, target = spec.partition("=")
    if not sep:
        task, target = None, spec
    task, target = (task.strip() or None) if task else None, target.strip()
    if ":" not in target:
        target = _entry_point(target)
    path, _, attr = target.rpartition(":")
    if path.endswith(".py") or os.sep in path:
        target = f"{Path(path).resolve()}:{attr}"
    fn = _import(target)
    return PluginRef(target, task, source_hash(fn, target))


def installed() -> dict[str, str]:
    """Installed verifier plugins: entry-point name -> target."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _entry_point(name: str) -> str:
    found = installed()
    if name not in found:
        known = ", ".join(sorted(found)) or "none installed"
        raise PluginError(f"verifier {name!r}: not module:callable nor an entry point in {ENTRY_POINT_GROUP} ({known})")
    return found[name]


def load(ref: PluginRef) -> Callable[[dict, str], Any]:
    """The plugin's callable, imported once per process; refuses a source that changed since `resolve`."""
    if isinstance(ref, ObjectRef):
        return ref.obj
    fn = _import(ref.target)
    if ref.source_sha256 and source_hash(fn, ref.target) != ref.source_sha256:
        raise PluginError(f"verifier {ref.target}: its source changed since the run started "
                          "(the dataset identity holds the old hash); start a new run")
    return fn


@functools.cache
def _import(target: str) -> Callable[[dict, str], Any]:
    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise PluginError(f"verifier {target!r}: expected package.module:callable or file.py:callable")
    module = _import_file(module_name) if module_name.endswith(".py") else _import_module(module_name)
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise PluginError(f"verifier {target!r}: {module_name} has no {attr!r}")
    if not callable(fn):
        raise PluginError(f"verifier {target!r}: {attr} is not callable")
    return fn


def _import_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name.split(".")[0] or os.getcwd() in sys.path:
            raise PluginError(f"verifier module {name!r}: {e}") from None
    sys.path.insert(0, os.getcwd())  # as `python -m` would: a module beside the prompt files
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise PluginError(f"verifier module {name!r}: {e}") from None


def _import_file(path: str):
    if not Path(path).is_file():
        raise PluginError(f"verifier file {path!r} not found")
    name = "tokencredit_plugin_" + hashlib.sha256(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
    return module


def source_hash(fn: Any, target: str) -> str:
    """sha256 of the file that defines `fn` (a function, class or callable object; of a wrapper, the
    file of what it wraps: `__wrapped__`, as an adapted TRL reward function has)."""
    fn = inspect.unwrap(fn)
    owner = fn if inspect.isfunction(fn) or inspect.isclass(fn) or inspect.ismethod(fn) else type(fn)
    try:
        path = inspect.getsourcefile(owner) or inspect.getfile(sys.modules[owner.__module__])
    except (TypeError, KeyError, AttributeError):
        raise PluginError(f"verifier {target!r}: no Python source file to hash") from None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as error:  # moved or deleted since it was imported
        raise PluginError(f"verifier {target!r}: cannot read its source file {path} ({error.strerror})") from None


# ---------------------------------------------------------------- running

def applies(ref: PluginRef, record: TaskRecord) -> bool:
    return ref.task is None or ref.task == record.task


def record_dict(record: TaskRecord) -> dict[str, Any]:
    """What a plugin gets: a plugin record's own fields, or a built-in record's fields."""
    if isinstance(record.spec, PluginSpec):
        return dict(record.spec.fields)
    fields = {"id": record.id, "task": record.task, "prompt": record.prompt, "split": record.split}
    if record.reference_response is not None:
        fields["reference_response"] = record.reference_response
    return {**fields, **asdict(record.spec)}


def score(ref: PluginRef, record: TaskRecord, response: str) -> list[RewardScore]:
    """Run one plugin on one response; PluginError when it returns something unusable."""
    try:
        result = load(ref)(record_dict(record), response)
        if result is None or isinstance(result, (str, bytes, dict)) or not isinstance(result, Iterable):
            raise PluginError(f"verifier {ref.target} returned {type(result).__name__}; "
                              "expected an iterable of (name, score, feedback) ")
        items = list(result)  # a generator runs here
    except Exception as error:
        if not isinstance(error, PluginError):  # the plugin's own error: the note says whose
            error.add_note(f"raised by verifier {ref.target}")
        raise
    rewards = [_reward(ref, item) for item in items]
    for r in rewards:
        try:
            spans.check(r.spans, response, f"record {record.id!r}: verifier {ref.target}: reward {r.name!r}")
        except ValueError as error:
            raise PluginError(str(error)) from None
    return rewards


def _reward(ref: PluginRef, item: Any) -> RewardScore:
    if isinstance(item, (tuple, list)) and len(item) in (3, 4, 5):
        name, value, feedback, *rest = item
        observed = rest[0] if rest else ""
        where = rest[1] if len(rest) > 1 else ()
    elif all(hasattr(item, a) for a in ("name", "score", "feedback")):
        name, value, feedback = item.name, item.score, item.feedback
        observed, where = getattr(item, "observed", ""), getattr(item, "spans", ())
    else:
        raise PluginError(f"verifier {ref.target} returned {_short(item)}; "
                          "expected (name, score, feedback[, observed[, spans]])")
    if not isinstance(name, str) or not name.strip():
        raise PluginError(f"verifier {ref.target}: reward name {_short(name)} is not a non-empty string")
    # numbers.Real: Python's int and float and numpy's number scalars (numpy.float32, numpy.int64); not a bool
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not 0 <= value <= 1:
        raise PluginError(f"verifier {ref.target}: reward {name!r} has score {_short(value)}, expected a number in [0, 1]")
    score = _as_float(ref, name, value)
    for what, text in (("name", name), ("feedback", feedback), ("observed", observed)):
        if not isinstance(text, str):
            raise PluginError(f"verifier {ref.target}: reward {name!r} has {what} {_short(text)}, expected a string")
        if not encodable(text):  # Parquet stores UTF-8: a lone surrogate would fail the whole shard's write
            raise PluginError(f"verifier {ref.target}: reward {_short(name)} has {what} {_short(text)}, which is not "
                              "valid Unicode text (a lone surrogate?)")
    # checked against the response in `score`; a list of lists becomes a tuple of pairs there
    where = tuple(tuple(s) if isinstance(s, list) else s for s in where) if isinstance(where, (list, tuple)) else where
    return RewardScore(name, score, feedback, observed, where)


def _as_float(ref: PluginRef, name: str, value: numbers.Real) -> float:
    """The stored score: float(value), checked again, since a float subclass's own `__float__` may say other
    than the value the range checks compared (NaN from a score that compares as 0.5)."""
    try:
        score = float(value)
    except Exception as error:  # the subclass's own code: whatever it raises is this reward's failure
        raise PluginError(f"verifier {ref.target}: reward {name!r}: float() of its score {_short(value)} raised "
                          f"{type(error).__name__}: {error}") from None
    if not 0 <= score <= 1:  # also NaN
        raise PluginError(f"verifier {ref.target}: reward {name!r} has score {_short(value)} (a "
                          f"{type(value).__name__}), which converts to {score!r}; expected a number in [0, 1]")
    return score


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def tasks_of(refs: Sequence[PluginRef]) -> tuple[str, ...]:
    """The task names the refs verify; "*" when one verifies every record."""
    return tuple(sorted({ref.task or "*" for ref in refs}))
