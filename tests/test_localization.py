"""MRTPO's replay with the shipped tiny policy puts each reward's credit on the tokens its verifier checked.

The cases are the MRTPO paper's (Figures 1, 3 and 7), built on held-out (test-split) demo records
by `pipeline.probe.crafted_cases`: `>=` written for `>`, a misspelled table, a tool argument off by
one. Each named case is the first of its kind; the rate tests cover every case of the split.
"""
import pytest

import verifiers
from pipeline.models import load_policy
from pipeline.probe import crafted_cases, replay_one

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def policy():
    return load_policy()


@pytest.fixture(scope="module")
def cases():
    records = [r for r in verifiers.load_tasks("demo")[0] if r.split == "test"]
    out: dict[str, list] = {}
    for case in crafted_cases(records):
        out.setdefault(case.kind, []).append(case)
    return out


def tag_positions(probe, response: str, tags: tuple[str, ...]) -> list[int]:
    return sorted({t for tag in tags for start in _find_all(response, tag) for t in probe.covering(start, start + len(tag))})


def _find_all(text: str, part: str) -> list[int]:
    starts, i = [], text.find(part)
    while i >= 0:
        starts.append(i)
        i = text.find(part, i + 1)
    return starts


def test_operator_case_blames_the_operator_and_credits_format_on_the_tags(policy, cases):
    case = cases["operator"][0]
    probe = replay_one(*policy, case.record, case.response)
    assert probe.scores == [1.0, 1.0, 0.0]  # well formed, executable, wrong result
    operator = probe.covering(*case.edit)
    assert [probe.tokens[t] for t in operator] in (["Ġ>", "="], ["Ġ<", "="])
    assert probe.top_tokens("execution", 1)[0] in operator
    assert probe.mass("format", tag_positions(probe, case.response, ("<sql>", "</sql>"))) > 0.5


@pytest.mark.parametrize("kind", ["table", "tool_value"])
def test_wrong_name_and_wrong_value_are_blamed_on_the_edit(policy, cases, kind):
    case = cases[kind][0]
    probe = replay_one(*policy, case.record, case.response)
    assert probe.scores[probe.reward_names.index(case.reward)] < 1.0
    assert probe.top_tokens(case.reward, 1)[0] in probe.covering(*case.edit)


@pytest.mark.parametrize("kind", ["operator", "table", "tool_value"])
def test_most_cases_of_each_kind_are_blamed_on_the_edit(policy, cases, kind):
    """Top-1 on the edited token(s) in most cases; a random token would be there in under 15%."""
    hits, chance = [], []
    for case in cases[kind]:
        probe = replay_one(*policy, case.record, case.response)
        edited = probe.covering(*case.edit)
        hits.append(probe.top_tokens(case.reward, 1)[0] in edited)
        chance.append(len(edited) / len(probe.tokens))
    assert len(hits) >= 4
    assert sum(chance) / len(chance) < 0.15
    assert sum(hits) / len(hits) >= 0.6
