"""Verifiers: one score in [0, 1] and one feedback text per reward.

    records, rejected = load_tasks(path)          # validated TaskRecords + bad lines (any format)
    scores = verify(record, response_text)        # list[RewardScore], fixed reward order; a failed
                                                  # reward's `spans` say where the response breaks it
    names = reward_names(record, refs)            # the same order, without a response
    spans = response_parts(record, response_text) # [(char_start, char_end, part)] for analysis
    kind, index = stored_reward(task, name)       # ("keyword_include", 2) for "c2_keyword_include"

    refs = plugins.resolve(["poem=my_rewards:score"])   # plugin verifiers (`tokencredit.verifiers.plugins`)
    scores = verify(record, response_text, refs)        # built-in rewards, then each plugin's
    # verify's parts, which the annotate stage runs apart (built-ins in its process, plugins in a worker):
    applying = applying_plugins(record, refs)           # or RecordError: no verifier scores the record
    scores = checked(record, response_text, builtin_scores(record, response_text)
                     + plugin_scores(record, response_text, applying))

`verify` never raises on any response string from a built-in verifier; a malformed task record
raises `tokencredit.schemas.records.RecordError` naming the record id and the field, a misbehaving plugin
`plugins.PluginError`.
"""
from __future__ import annotations

from collections.abc import Sequence

from tokencredit.schemas.records import RecordError, RewardScore, TaskRecord

from tokencredit.verifiers import instructions, plugins, spans, sql, tools
from tokencredit.verifiers.plugins import PluginRef
from tokencredit.verifiers.tasks import Rejected, load_tasks, parse_record

_BY_TASK = {"sql": sql, "instructions": instructions, "tools": tools}


def verify(record: TaskRecord, response: str, plugin_refs: Sequence[PluginRef] = ()) -> list[RewardScore]:
    """The record's built-in rewards (if its task has a verifier), then those of each plugin that applies."""
    applying = applying_plugins(record, plugin_refs)
    return checked(record, response, builtin_scores(record, response) + plugin_scores(record, response, applying))


def builtin_scores(record: TaskRecord, response: str) -> list[RewardScore]:
    """The built-in verifier's rewards ([] for a plugin task), before `checked`."""
    return _BY_TASK[record.task].verify(record, response) if record.task in _BY_TASK else []


def plugin_scores(record: TaskRecord, response: str, plugin_refs: Sequence[PluginRef]) -> list[RewardScore]:
    """The rewards of each plugin that applies to the record, in order, before `checked`."""
    scores = []
    for ref in plugin_refs:
        if plugins.applies(ref, record):
            scores += plugins.score(ref, record, response)
    return scores


def checked(record: TaskRecord, response: str, scores: list[RewardScore]) -> list[RewardScore]:
    """`scores` (built-in, then plugins') if they make a response's rewards: PluginError when there
    is none, a score is not a number in [0, 1] (NaN neither), a spans list is invalid, or a name is given twice."""
    if not scores:
        raise plugins.PluginError(f"record {record.id!r}: the verifiers returned no reward")
    for s in scores:  # a NaN score would reach GDPO's group statistics and every advantage of the run
        if isinstance(s.score, bool) or not isinstance(s.score, (int, float)) or not 0 <= s.score <= 1:
            raise plugins.PluginError(f"record {record.id!r}: reward {s.name!r} has score {s.score!r}; "
                                      "expected a number in [0, 1]")
    for s in scores:  # a built-in check's spans are validated as a plugin's are
        try:
            spans.check(s.spans, response, f"record {record.id!r}: reward {s.name!r}")
        except ValueError as error:
            raise plugins.PluginError(str(error)) from None
    names = [s.name for s in scores]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise plugins.PluginError(f"record {record.id!r}: reward name(s) {', '.join(repeated)} given twice")
    return scores


def reward_names(record: TaskRecord, plugin_refs: Sequence[PluginRef] = ()) -> list[str]:
    """The names `verify` gives the record's rewards. A plugin must give the same names to every response
    of a record, so its names are those it gives the record's reference response (or an empty one)."""
    applying = applying_plugins(record, plugin_refs)
    names = _BY_TASK[record.task].reward_names(record) if record.task in _BY_TASK else []
    probe = record.reference_response or ""
    for ref in applying:
        names += [s.name for s in plugins.score(ref, record, probe)]
    return names


def applying_plugins(record: TaskRecord, plugin_refs: Sequence[PluginRef]) -> list[PluginRef]:
    """The plugins that score the record; RecordError when neither they nor a built-in verifier do."""
    applying = [ref for ref in plugin_refs if plugins.applies(ref, record)]
    if record.task not in _BY_TASK and not applying:
        raise RecordError(record.id, "task", f"no verifier for task {record.task!r} (a plugin task needs its "
                          f"verifier: verifiers=[({record.task!r}, verifier)] or ['{record.task}=module:function'] "
                          f"from Python, --verifier {record.task}=module:function on the command line)")
    return applying


def response_parts(record: TaskRecord, response: str) -> list[tuple[int, int, str]]:
    """The built-in verifier's parts; a plugin task's response is one `text` part."""
    if record.task not in _BY_TASK:
        return [(0, len(response), "text")] if response else []
    return _BY_TASK[record.task].response_parts(record, response)


def stored_reward(task: str, name: str) -> tuple[str, int | None]:
    """(reward, constraint_index) as the dataset stores a reward name: an instruction constraint's
    `c{i}_{kind}` becomes (kind, i); other names (other tasks, plugins) stay, with no index."""
    return instructions.split_reward_name(name) if task == "instructions" else (name, None)


__all__ = ["PluginRef", "Rejected", "load_tasks", "parse_record", "plugins", "verify", "builtin_scores",
           "plugin_scores", "checked", "applying_plugins", "reward_names",
           "response_parts", "stored_reward"]
