"""IFEval semantics: the id -> kind mapping, the reference's rules where they differ from the project's,
and a cross-check against the reference checkers (lm-eval's IFEval, bfcl-eval's AST checker), which
`bench/references.py` unpacks from their wheels into bench/.reference (skipped when no registry answers)."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

from tokencredit import verifiers
from tokencredit.schemas.records import Constraint, InstructionSpec, TaskRecord
from tokencredit.verifiers import ifeval
from tokencredit.verifiers.checkers import CHECKERS

BENCH = Path(__file__).resolve().parents[1] / "bench"


def passes(kind: str, args: dict, response: str, semantics: str = "ifeval") -> bool:
    spec = InstructionSpec((Constraint(kind, args),), semantics=semantics)
    return verifiers.verify(TaskRecord("t", "instructions", "Write.", None, spec), response)[0].score == 1.0


def test_every_ifeval_id_maps_to_a_kind_the_checkers_know():
    assert len(ifeval.IFEVAL_IDS) == 25
    assert {kind for kind, _ in ifeval.IFEVAL_IDS.values()} <= set(CHECKERS)
    assert set(ifeval.CHECKS) == set(CHECKERS)  # every kind has an IFEval-mode check


@pytest.mark.parametrize("iid,kwargs,constraint", [
    ("length_constraints:number_words", {"num_words": 300, "relation": "less than", "num_highlights": None},
     Constraint("word_count", {"max": 299})),
    ("keywords:frequency", {"keyword": " sun ", "frequency": 2, "relation": "at least"},
     Constraint("keyword_frequency", {"keyword": "sun", "n": 2})),
    ("keywords:letter_frequency", {"letter": "Z", "let_frequency": 3, "let_relation": "less than"},
     Constraint("letter_frequency", {"letter": "z", "max": 2})),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 4},
     Constraint("sections", {"n": 4, "splitter": "Section"})),
    ("startend:quotation", {}, Constraint("quotation", {})),
])
def test_from_ifeval_converts_relations_to_bounds_and_drops_nulls(iid, kwargs, constraint):
    assert ifeval.from_ifeval(iid, kwargs) == constraint


@pytest.mark.parametrize("iid,kwargs,reason", [
    ("keywords:rhymes", {}, "unknown constraint kind 'keywords:rhymes'"),
    ("length_constraints:number_words", {"num_words": 3}, "relation"),
    ("length_constraints:number_words", {"num_words": 3, "relation": "about"}, "relation must be"),
    ("keywords:existence", {"keywords": ["a"], "extra": 1}, "extra"),
])
def test_from_ifeval_names_what_is_wrong(iid, kwargs, reason):
    with pytest.raises(ValueError, match=reason):
        ifeval.from_ifeval(iid, kwargs)


def test_the_reference_rules_where_they_differ_from_the_project():
    assert passes("paragraph_count", {"n": 2}, "One.\n***\nTwo.") and not passes("paragraph_count", {"n": 2}, "One.\n\nTwo.")
    assert passes("paragraph_count", {"n": 2}, "One.\n\nTwo.", "tokencredit")
    assert passes("sections", {"n": 2}, "SECTION 1 a SECTION 2 b SECTION 3 c")  # at least n
    assert not passes("sections", {"n": 2}, "SECTION 1\na\nSECTION 2\nb\nSECTION 3\nc", "tokencredit")
    assert passes("ends_with", {"phrase": "That is all."}, '"Bye. THAT IS ALL."')
    assert not passes("ends_with", {"phrase": "That is all."}, '"Bye. THAT IS ALL."', "tokencredit")
    assert not passes("lowercase", {}, "das wetter ist heute sehr schön und wir gehen im park spazieren.")
    assert passes("response_language", {"language": "de"}, "12345 !!!")  # no language to tell: followed, as there
    assert passes("keyword_include", {"keywords": ["sea"]}, "The SEASON starts.")  # a substring
    assert passes("json_format", {}, "```json\n{\"a\": 1}\n```")
    assert passes("sentence_count", {"max": 1}, "Mr. and Mrs. Jones came home.")


def test_loose_mode_tries_the_references_eight_variants():
    variants = ifeval.loose_variants("Sure!\n*THE ANSWER IS HERE*\nbye")
    assert len(variants) == 8 and "THE ANSWER IS HERE" in variants
    assert not passes("uppercase", {}, "Sure!\nTHE STORM HIT THE COAST AT NIGHT AND THE BOATS STAYED HOME.\nbye")
    assert passes("uppercase", {}, "Sure!\nTHE STORM HIT THE COAST AT NIGHT AND THE BOATS STAYED HOME.\nbye",
                  "ifeval-loose")
    assert not passes("uppercase", {}, "   ", "ifeval-loose")


@pytest.fixture(scope="module")
def reference():
    sys.path.insert(0, str(BENCH))
    import references

    try:
        references.unpack()  # pip download --no-deps of the reference wheels, once, into bench/.reference
    except Exception as error:  # noqa: BLE001 - no registry reachable: nothing to compare with
        pytest.skip(f"reference checkers not available ({type(error).__name__}); run `python bench/references.py`")
    return references


def test_ifeval_mode_agrees_with_lm_evals_checkers_on_fresh_cases(reference, bench_module):
    bench_fidelity = bench_module("bench_fidelity")
    cases = bench_fidelity.ifeval_cases()  # bench/ifeval_cases.jsonl, the benchmark's cases
    assert len({c[0] for c in cases}) >= 25  # every IFEval instruction id the project checks
    result = bench_fidelity.ifeval_agreement(cases, reference.ifeval())
    assert result["strict"]["disagreements"] == [] and result["loose"]["disagreements"] == []


def test_bfcl_semantics_agree_with_bfcls_ast_checker(reference, bench_module):
    bench_fidelity = bench_module("bench_fidelity")
    cases = bench_fidelity.bfcl_cases()  # bench/bfcl_cases.jsonl, the benchmark's cases
    result = bench_fidelity.bfcl_agreement(reference.bfcl_data(), reference.bfcl(), cases)
    assert result["cases"] == len(cases) >= 40 and result["disagreements"] == []
