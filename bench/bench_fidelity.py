"""Agreement of tokencredit's verifiers with the reference checkers, on fresh cases.

    python -m bench fidelity        # unpacks the references first (bench/references.py)

IFEval: (response, instruction) pairs for every one of IFEval's 25 instruction ids (`ifeval_cases.jsonl`), scored by
lm-eval's IFEval checkers (strict and loose) and by tokencredit's `ifeval` / `ifeval-loose`
semantics (and, for comparison, its own `tokencredit` semantics, on the kinds it has).
BFCL: model outputs made from BFCL's own simple, multiple, parallel and parallel-multiple records
(`bfcl_cases.jsonl`, {category, id, case, output}: right answers, accepted alternatives, optional arguments left
out, string variants, int for float, wrong values, missing and extra arguments, wrong and extra calls, drawn once
from 6 records per category with seed 11 by the generator this file held up to commit 6bbde98), judged by
bfcl-eval's AST checker and by tokencredit's tool verifier (`bfcl` semantics; a case agrees when BFCL's
valid equals correctness == 1); --quick: every 8th case. BFCL edge cases: fresh cases on the rules where BFCL's
checker reads values its own way (`bfcl_edge_cases.jsonl`: normalization depth, `any`, "" as a value, True == 1 inside
dicts, greedy matching of parallel calls), loaded through the `bfcl` format. Also: how many BFCL
records of those categories load, and how many hostile `db` paths escape the databases folder (target 0).
Figures go to bench/results/fidelity.json and the Fidelity section of bench/RESULTS.md.
"""
from __future__ import annotations

import copy
import json
import sqlite3
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import references  # noqa: E402
from bfcl_edge_cases import CASES as EDGE_CASES, write_files  # noqa: E402
from common import Harness  # noqa: E402
from registry import Target, Unavailable, benchmark  # noqa: E402

from tokencredit import verifiers  # noqa: E402
from tokencredit.schemas.records import InstructionSpec, RecordError, TaskRecord, ToolCall  # noqa: E402
from tokencredit.verifiers import ifeval, tools  # noqa: E402
from tokencredit.verifiers.formats import resolve_db  # noqa: E402
from tokencredit.verifiers.tasks import load_tasks  # noqa: E402

BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
IFEVAL_CASES, BFCL_CASES = Path(__file__).with_name("ifeval_cases.jsonl"), Path(__file__).with_name("bfcl_cases.jsonl")


def ifeval_cases() -> list[tuple[str, dict, str, str]]:
    """(instruction id, kwargs, prompt, response) of ifeval_cases.jsonl: 6 to 8 per IFEval instruction id, passing,
    failing and edge cases (empty and blank responses among them), written once from fixed sentences and seed 11."""
    rows = [json.loads(line) for line in IFEVAL_CASES.read_text(encoding="utf-8").splitlines()]
    return [(r["id"], r["kwargs"], r["prompt"], r["response"]) for r in rows]


def ifeval_agreement(cases, reference) -> dict:
    """Per mode: cases where tokencredit and the reference agree; disagreements listed."""
    out = {"strict": [0, []], "loose": [0, []], "tokencredit": [0, []]}
    for iid, kwargs, prompt, response in cases:
        example = reference.InputExample(key=0, instruction_id_list=[iid], prompt=prompt, kwargs=[kwargs])
        want_strict = reference.test_instruction_following_strict(example, response).follow_instruction_list[0]
        want_loose = reference.test_instruction_following_loose(example, response).follow_instruction_list[0]
        c = ifeval.from_ifeval(iid, kwargs)
        got = {}
        for mode in ("ifeval", "ifeval-loose", "tokencredit"):
            spec = InstructionSpec((c,), semantics=mode)
            got[mode] = verifiers.verify(TaskRecord("c", "instructions", prompt, None, spec), response)[0].score >= 1.0
        for key, mode, want in (("strict", "ifeval", want_strict), ("loose", "ifeval-loose", want_loose),
                                ("tokencredit", "tokencredit", want_strict)):
            if got[mode] == want:
                out[key][0] += 1
            else:
                out[key][1].append({"id": iid, "kwargs": kwargs, "response": response, "reference": want})
    return {k: {"agree": v[0], "cases": len(cases), "disagreements": v[1]} for k, v in out.items()}


# ---------------------------------------------------------------- BFCL cases

def bfcl_load_counts(data: Path) -> dict:
    counts = {}
    for category in BFCL_CATEGORIES:
        records, rejected = load_tasks(data / f"BFCL_v4_{category}.json", "bfcl")
        counts[category] = {"loaded": len(records), "total": len(records) + len(rejected),
                            "rejected": [(r.record_id, r.reason) for r in rejected]}
    return counts


def bfcl_cases() -> list[dict]:
    """The rows of bfcl_cases.jsonl: {category, id (a BFCL record's), case (what was done), output (the model's calls
    as [{name: {param: value}}])}."""
    return [json.loads(line) for line in BFCL_CASES.read_text(encoding="utf-8").splitlines()]


def correctness(record, output: list[dict]):
    """tokencredit's correctness score of BFCL-form calls `output` against `record`."""
    calls = [ToolCall(name, args) for call in output for name, args in call.items()]
    return tools.verify(record, tools.render_calls(calls))[1]


def bfcl_agreement(data: Path, checker, cases: list[dict]) -> dict:
    """`cases` (bfcl_cases) judged by BFCL's checker on its own records in `data` and by tokencredit."""
    from bfcl_eval.constants.enums import Language

    def rows(path: Path) -> dict:
        return {row["id"]: row for row in map(json.loads, path.open())}

    agree, disagreements, files = 0, [], {}
    for case in cases:
        category, record_id, output = case["category"], case["id"], case["output"]
        if category not in files:
            name = f"BFCL_v4_{category}.json"
            files[category] = (rows(data / name), rows(data / "possible_answer" / name),
                               {r.id: r for r in load_tasks(data / name, "bfcl")[0]})
        questions, answers, records = files[category]
        functions, answer = questions[record_id]["function"], answers[record_id]["ground_truth"]
        want = checker.ast_checker(copy.deepcopy(functions), copy.deepcopy(output), copy.deepcopy(answer),
                                   Language.PYTHON, category, "tokencredit")["valid"]
        correct = correctness(records[record_id], output)
        if (correct.score >= 1.0) == want:
            agree += 1
        else:
            disagreements.append({"id": record_id, "case": case["case"], "output": output, "bfcl_valid": want,
                                  "correctness": correct.score, "observed": correct.observed})
    return {"agree": agree, "cases": len(cases), "disagreements": disagreements}


def bfcl_edge_agreement(checker) -> dict:
    """The edge cases scored by bfcl-eval's checker and by tokencredit (`bfcl` format, so `bfcl`
    semantics); `hand_agree`: the checker's verdicts that equal the ones worked out by hand."""
    from bfcl_eval.constants.enums import Language

    with tempfile.TemporaryDirectory() as tmp:
        records, rejected = load_tasks(write_files(Path(tmp)), "bfcl")
    records = {r.id: r for r in records}
    agree, hand, disagreements = 0, 0, []
    for i, case in enumerate(EDGE_CASES):
        want = checker.ast_checker(copy.deepcopy(case.functions), copy.deepcopy(case.output),
                                   copy.deepcopy(case.answer), Language.PYTHON, case.category, "tokencredit")["valid"]
        hand += want == case.valid
        record = records.get(f"edge_{i}")  # None: it did not load
        got = None if record is None else correctness(record, case.output).score
        if got is not None and (got >= 1.0) == want:
            agree += 1
        else:
            disagreements.append({"id": f"edge_{i}", "kind": case.kind, "answer": case.answer, "output": case.output,
                                  "bfcl_valid": want, "correctness": got})
    return {"agree": agree, "cases": len(EDGE_CASES), "hand_agree": hand, "disagreements": disagreements,
            "rejected": [(r.record_id, r.reason) for r in rejected]}


# ---------------------------------------------------------------- path escapes

def path_escapes() -> tuple[int, int]:
    """(hostile `db` paths that resolved outside the databases folder, hostile paths tried)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "databases"
        (root / "sub").mkdir(parents=True)
        outside = Path(tmp) / "secret.sqlite"
        sqlite3.connect(outside).close()
        sqlite3.connect(root / "ok.sqlite").close()
        (root / "link.sqlite").symlink_to(outside)
        (root / "sub" / "dirlink").symlink_to(Path(tmp), target_is_directory=True)
        hostile = [str(outside), "../secret.sqlite", "sub/../../secret.sqlite", "link.sqlite", "sub/dirlink/secret.sqlite",
                   "./../secret.sqlite", "sub/./../../secret.sqlite", "..//secret.sqlite", "/etc/passwd",
                   "../" * 20 + "etc/passwd", "~/secret.sqlite", "%2e%2e/secret.sqlite", "sub/../ok.sqlite/../../secret.sqlite"]
        escaped = 0
        for db in hostile:
            try:
                path = resolve_db(db, root, "x")
            except RecordError:
                continue
            escaped += not path.resolve().is_relative_to(root.resolve())
        return escaped, len(hostile)


@benchmark("fidelity", measures="Fresh cases scored by tokencredit and by the reference checkers themselves "
           "(lm-eval 0.4.13's IFEval checkers, bfcl-eval 2026.3.23's AST checker, unpacked from their wheels by "
           "`bench/references.py`): mutations of BFCL's own answers (`bench/bfcl_cases.jsonl`), BFCL edge cases "
           "(`bench/bfcl_edge_cases.jsonl`), "
           "hostile database paths.", results=("fidelity.json",),
           targets=(Target("ifeval_agree", ">=", 0.98), Target("bfcl_agree", ">=", 0.98), Target("path_escapes", "==", 0),
                    Target("bfcl_edge_all_agree", "==", True), Target("bfcl_all_loaded", "==", True)))
def run(h: Harness) -> dict:
    if h.quick and not references.available():
        raise Unavailable("the reference checkers are not unpacked: `python bench/references.py` fetches them")
    reference = references.ifeval()
    checker = references.bfcl()
    data = references.bfcl_data()
    cases = ifeval_cases()
    kinds = {c[0] for c in cases}
    assert kinds == set(ifeval.IFEVAL_IDS), sorted(set(ifeval.IFEVAL_IDS) - kinds)
    iv = ifeval_agreement(cases, reference)
    loads = bfcl_load_counts(data)
    bf = bfcl_agreement(data, checker, bfcl_cases()[::8] if h.quick else bfcl_cases())
    edge = bfcl_edge_agreement(checker)
    escaped, tried = path_escapes()
    simple = loads["simple_python"]
    figures = {
        "ifeval_agree": iv["strict"]["agree"] / len(cases), "ifeval_cases": len(cases),
        "ifeval_loose_agree": iv["loose"]["agree"] / len(cases),
        "ifeval_tokencredit_semantics_agree": iv["tokencredit"]["agree"] / len(cases),
        "ifeval_kinds": len(kinds),
        "bfcl_agree": bf["agree"] / bf["cases"], "bfcl_cases": bf["cases"],
        "bfcl_edge_agree": edge["agree"] / edge["cases"], "bfcl_edge_cases": edge["cases"],
        "bfcl_simple_loaded": simple["loaded"] / simple["total"],
        "bfcl_loaded": {k: f"{v['loaded']}/{v['total']}" for k, v in loads.items()},
        "path_escapes": escaped, "hostile_paths": tried,
        "disagreements": {"ifeval_strict": iv["strict"]["disagreements"], "ifeval_loose": iv["loose"]["disagreements"],
                          "bfcl": bf["disagreements"], "bfcl_edge": edge["disagreements"],
                          "bfcl_edge_rejected": edge["rejected"],
                          "bfcl_rejected": {k: v["rejected"] for k, v in loads.items()}},
    }
    h.results("fidelity.json").write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")
    return {k: v for k, v in figures.items() if k != "disagreements"} | {
        "bfcl_edge_all_agree": edge["agree"] == edge["cases"] and edge["hand_agree"] == edge["cases"],
        "bfcl_all_loaded": all(v["loaded"] == v["total"] for v in loads.values())}
