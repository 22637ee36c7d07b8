"""Agreement of tokencredit's verifiers with the reference checkers, on fresh cases.

    python -m bench fidelity        # unpacks the references first (bench/references.py)

IFEval: (response, instruction) pairs drawn for every one of IFEval's 25 instruction ids, scored by
lm-eval's IFEval checkers (strict and loose) and by tokencredit's `ifeval` / `ifeval-loose`
semantics (and, for comparison, its own `tokencredit` semantics, on the kinds it has).
BFCL: model outputs made from BFCL's own simple, multiple, parallel and parallel-multiple records
(right answers, accepted alternatives, optional arguments left out, string variants, int for
float, wrong values, missing and extra arguments, wrong and extra calls), judged by bfcl-eval's
AST checker and by tokencredit's tool verifier (`bfcl` semantics; a case agrees when BFCL's
valid equals correctness == 1). BFCL edge cases: fresh cases on the rules where BFCL's checker reads
values its own way (`bfcl_edge_cases.py`: normalization depth, `any`, "" as a value, True == 1 inside
dicts, greedy matching of parallel calls), loaded through the `bfcl` format. Also: how many BFCL
records of those categories load, and how many hostile `db` paths escape the databases folder (target 0).
Figures go to bench/results/fidelity.json and the Fidelity section of bench/RESULTS.md.
"""
from __future__ import annotations

import copy
import json
import random
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

SEED = 11
BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")

# ---------------------------------------------------------------- IFEval cases

ENGLISH = [
    "Mr. and Mrs. Jones came home late.", "The river runs past the old mill, near the stone bridge.",
    'She said "Stop." Then she left.', "Dr. Lee met us at 5 p.m. on Friday.", "The U.S. team won again!",
    "Is this the end? No, it is not.", "We planted ten trees in the park.", "Prices rose by 3.5 percent in May.",
    "Bring water, bread and cheese.", "I love the sea and the warm sand.", "Quick brown foxes jump over lazy dogs.",
    "The museum opens at nine e.g. on weekdays.", "Our NASA visit was short but fun.", "Rain fell all night.",
    "He finished the race... and then he slept.", "The report (see page 4) is ready.",
]
GERMAN = ["Das Wetter ist heute sehr schön und wir gehen im Park spazieren.",
          "Morgen fahren wir mit dem Zug nach Berlin zu unseren Freunden."]
SPANISH = ["El tiempo es muy bueno hoy y vamos a caminar por el parque.",
           "Mañana viajamos en tren a Madrid para ver a nuestros amigos."]
WORDS = ["river", "stone", "garden", "light", "music", "winter", "coffee", "bridge"]


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.sample(ENGLISH, n))


def edge(rng: random.Random) -> str:
    return rng.choice(["", "   \n  ", "\n"])


def with_word(rng: random.Random, word: str, times: int) -> str:
    parts = [text(rng, 2)]
    for _ in range(times):
        parts.append(rng.choice([f"The {word} was there.", f"A {word.upper()} appeared!", f"({word}) again."]))
    return " ".join(parts)


def paragraphs(rng: random.Random, n: int, sep: str) -> str:
    return sep.join(text(rng, rng.randint(1, 2)) for _ in range(n))


def ifeval_cases(rng: random.Random) -> list[tuple[str, dict, str, str]]:
    """(instruction id, kwargs, prompt, response): 7 to 8 per id, passing, failing and edge cases."""
    cases = []

    def add(iid, kwargs, response, prompt="Write something."):
        cases.append((iid, kwargs, prompt, response))

    for _ in range(3):
        kw = rng.sample(WORDS, 2)
        add("keywords:existence", {"keywords": kw}, with_word(rng, kw[0], 1) + " " + with_word(rng, kw[1], 1))
        add("keywords:existence", {"keywords": kw}, with_word(rng, kw[0], 1) + f" {kw[1]}s everywhere.")
    add("keywords:existence", {"keywords": ["sea"]}, edge(rng))
    add("keywords:existence", {"keywords": ["Sea"]}, "The SEASON is long.")
    for n, rel in ((2, "at least"), (3, "less than"), (1, "at least"), (2, "less than")):
        w = rng.choice(WORDS)
        add("keywords:frequency", {"keyword": w, "frequency": n, "relation": rel}, with_word(rng, w, rng.randint(0, 3)))
    add("keywords:frequency", {"keyword": "sun", "frequency": 2, "relation": "less than"}, edge(rng))
    add("keywords:frequency", {"keyword": "sun", "frequency": 2, "relation": "at least"}, "Sunny sun, sunset.")
    add("keywords:frequency", {"keyword": "art", "frequency": 2, "relation": "at least"}, "Start the art party.")
    for _ in range(3):
        banned = rng.sample(WORDS, 2)
        add("keywords:forbidden_words", {"forbidden_words": banned}, with_word(rng, rng.choice(WORDS), 1))
    add("keywords:forbidden_words", {"forbidden_words": ["stone"]}, "Stones and milestones.")
    add("keywords:forbidden_words", {"forbidden_words": ["stone"]}, "A STONE fell.")
    add("keywords:forbidden_words", {"forbidden_words": ["stone"]}, edge(rng))
    add("keywords:forbidden_words", {"forbidden_words": ["mill"]}, text(rng, 4))
    for letter, n, rel in (("e", 10, "at least"), ("z", 2, "less than"), ("a", 5, "at least"), ("q", 1, "less than"),
                           ("E", 3, "at least"), ("o", 30, "less than")):
        add("keywords:letter_frequency", {"letter": letter, "let_frequency": n, "let_relation": rel}, text(rng, rng.randint(1, 4)))
    add("keywords:letter_frequency", {"letter": "z", "let_frequency": 3, "let_relation": "less than"}, edge(rng))
    for lang, sentences in (("de", GERMAN), ("es", SPANISH), ("en", ENGLISH)):
        add("language:response_language", {"language": lang}, " ".join(sentences[:2]))
        add("language:response_language", {"language": "de" if lang != "de" else "es"}, " ".join(sentences[:2]))
    add("language:response_language", {"language": "en"}, "12345 !!!")
    add("language:response_language", {"language": "en"}, edge(rng))
    for n, rel in ((2, "less than"), (3, "at least"), (4, "less than"), (1, "at least"), (5, "at least")):
        add("length_constraints:number_sentences", {"num_sentences": n, "relation": rel}, text(rng, rng.randint(1, 4)))
    add("length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"}, ENGLISH[0])
    add("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, edge(rng))
    for n in (2, 3, 3):
        add("length_constraints:number_paragraphs", {"num_paragraphs": n}, paragraphs(rng, rng.choice([2, 3]), "\n***\n"))
    add("length_constraints:number_paragraphs", {"num_paragraphs": 2}, paragraphs(rng, 2, "\n\n"))
    add("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "***\n" + paragraphs(rng, 2, " *** "))
    add("length_constraints:number_paragraphs", {"num_paragraphs": 3}, paragraphs(rng, 2, "\n***\n***\n"))
    add("length_constraints:number_paragraphs", {"num_paragraphs": 1}, edge(rng))
    for n, rel in ((20, "at least"), (15, "less than"), (40, "less than"), (8, "at least")):
        add("length_constraints:number_words", {"num_words": n, "relation": rel}, text(rng, rng.randint(1, 5)))
    add("length_constraints:number_words", {"num_words": 5, "relation": "less than"}, "It's a well-known fact.")
    add("length_constraints:number_words", {"num_words": 50, "relation": "less than"}, edge(rng))
    add("length_constraints:number_words", {"num_words": 3, "relation": "at least"}, "one two")
    for n, nth, word, resp in (
            (2, 2, "then", "We ate.\n\nThen we slept."), (2, 2, "then", "We ate.\n\n\"Then,\" he said."),
            (3, 1, "we", "We ate.\n\nThen.\n\nNow."), (2, 1, "we", "We ate.\nThen we slept."),
            (2, 2, "then", "We ate.\n\nLater we slept."), (3, 3, "now", "A.\n\n\n\nB.\n\nNow!"),
            (2, 2, "then", edge(rng))):
        add("length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": n, "nth_paragraph": nth, "first_word": word}, resp)
    for n in (1, 2, 3):
        add("detectable_content:number_placeholders", {"num_placeholders": n}, "Meet [name] at [place] on [day].")
    add("detectable_content:number_placeholders", {"num_placeholders": 2}, "Meet [name].")
    add("detectable_content:number_placeholders", {"num_placeholders": 1}, "Meet [] now.")
    add("detectable_content:number_placeholders", {"num_placeholders": 1}, "[a\nb] split")
    add("detectable_content:number_placeholders", {"num_placeholders": 1}, edge(rng))
    for marker, resp in (("P.S.", "Hi.\n\nP.S. See you."), ("P.S.", "Hi. p.s. see you."), ("P.P.S", "Hi.\nP.P.S later"),
                         ("P.S.", "Hi.\nPS see you."), ("P.P.S", "Hi.\nP.S. later"), ("P.S.", edge(rng)),
                         ("P.S.", "Hi.\n\nP. S. See you.")):
        add("detectable_content:postscript", {"postscript_marker": marker}, resp)
    for n, resp in ((3, "* a\n* b\n* c"), (2, "- a\n- b"), (2, "* a\n- b\n* c"), (3, "* a\n** b\n* c\n* d"),
                    (1, "Intro\n  * only one"), (2, edge(rng)), (2, "*a\n*b")):
        add("detectable_format:number_bullet_lists", {"num_bullets": n}, resp)
    for resp in ("My answer is yes.", "My answer is no, because it rains.", "my answer is maybe.",
                 "Well. My answer is maybe.", "Yes.", edge(rng), "My answer is yes. My answer is no."):
        add("detectable_format:constrained_response", {}, resp)
    for n, resp in ((2, "Some *first* and *second* parts."), (2, "Some **bold** text."), (1, "An * * empty one."),
                    (3, "*a* *b*"), (1, "**x**"), (2, edge(rng)), (1, "*multi\nline*")):
        add("detectable_format:number_highlighted_sections", {"num_highlights": n}, resp)
    for spl, n, resp in (("SECTION", 2, "SECTION 1\na\nSECTION 2\nb"), ("Section", 2, "Section 1\na"),
                         ("SECTION", 2, "SECTION 2\nb\nSECTION 1\na"), ("PARAGRAPH", 1, "PARAGRAPH 1 text"),
                         ("Section", 3, "Section 1 a Section 2 b Section 3 c"), ("SECTION", 1, "section 1 lower"),
                         ("SECTION", 1, edge(rng))):
        add("detectable_format:multiple_sections", {"section_spliter": spl, "num_sections": n}, resp)
    for resp in ('{"a": 1}', '```json\n{"a": [1, 2]}\n```', '```\n[1, 2]\n```', "a: 1", '{"a": 1} trailing',
                 '```JSON\n{"b": true}\n```', edge(rng), "```json\n{'a': 1}\n```"):
        add("detectable_format:json_format", {}, resp)
    for resp in ("<<Title>>\nBody.", "<Title>\nBody.", "<<  >>\nBody.", "Body <<A title>> here.", "<<multi\nline>>",
                 edge(rng), "<<<Nested>>>"):
        add("detectable_format:title", {}, resp)
    for resp in ("Yes, gladly.\n******\nNo, sorry.", "Same.\n******\nSame.", "One.\n******\n******\nTwo.",
                 "******\nOne.\n******\nTwo.", "Only one answer.", "A ****** B ****** C", edge(rng)):
        add("combination:two_responses", {}, resp)
    for prompt, resp in (("Write a poem about rain.", "Write a poem about rain. Drops fall."),
                         ("Write a poem about rain.", "write a poem about RAIN. Drops."),
                         ("Write a poem about rain.", "Here: Write a poem about rain."),
                         ("List two fruits.", "  List two fruits.\nApple, pear."), ("List two fruits.", edge(rng)),
                         ("List two fruits.", "List 2 fruits. Apple.")):
        add("combination:repeat_prompt", {"prompt_to_repeat": prompt}, resp, prompt)
    for phrase, resp in (("That is all.", "Bye. That is all."), ("That is all.", "Bye. that is all."),
                         ("That is all.", '"Bye. That is all."'), ("Any other questions?", "Done. Any other questions? "),
                         ("That is all.", "That is all. Bye."), ("That is all.", edge(rng)),
                         ("Is there anything else I can help with?", "Ok. Is there anything else I can help with")):
        add("startend:end_checker", {"end_phrase": phrase}, resp)
    for n, rel, resp in ((2, "at least", "The USA and NASA and EU."), (3, "less than", "WE ARE LOUD TODAY."),
                         (1, "at least", "no capitals here."), (2, "less than", "I am here."),
                         (1, "at least", "U.S.A. is big."), (3, "less than", edge(rng)), (2, "at least", "DON'T STOP.")):
        add("change_case:capital_word_frequency", {"capital_frequency": n, "capital_relation": rel}, resp)
    for resp in ("THE STORM HIT THE COAST AT NIGHT AND THE BOATS STAYED HOME.", "THE STORM hit.", "123 !!!",
                 "DAS WETTER IST HEUTE SEHR SCHÖN UND WIR GEHEN IM PARK SPAZIEREN.", edge(rng), "OK"):
        add("change_case:english_capital", {}, resp)
    for resp in ("the storm hit the coast at night and the boats stayed home.", "the storm Hit.", "123 !!!",
                 "das wetter ist heute sehr schön und wir gehen im park spazieren.", edge(rng), "ok"):
        add("change_case:english_lowercase", {}, resp)
    for resp in ("No commas here.", "One, two.", "Full\uff0cwidth.", edge(rng), text(rng, 3), "1,000 people."):
        add("punctuation:no_comma", {}, resp)
    for resp in ('"quoted"', ' "quoted" ', '"', 'no quotes', '"half', edge(rng), '\u201csmart\u201d'):
        add("startend:quotation", {}, resp)
    return cases


def ifeval_agreement(cases, reference) -> dict:
    """Per mode: cases where tokencredit and the reference agree; disagreements listed."""
    out = {"strict": [0, []], "loose": [0, []], "tokencredit": [0, []]}
    own_cases = 0
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
        own_cases += 1
    return {k: {"agree": v[0], "cases": len(cases), "disagreements": v[1]} for k, v in out.items()}


# ---------------------------------------------------------------- BFCL cases

def bfcl_load_counts(data: Path) -> dict:
    counts = {}
    for category in BFCL_CATEGORIES:
        records, rejected = load_tasks(data / f"BFCL_v4_{category}.json", "bfcl")
        counts[category] = {"loaded": len(records), "total": len(records) + len(rejected),
                            "rejected": [(r.record_id, r.reason) for r in rejected]}
    return counts


def _first(values: list):
    return next(v for v in values if v != "")


def _concrete(value):
    """A concrete value a BFCL answer value accepts (dicts of alternatives: first choices)."""
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        return {k: _concrete(_first(v)) for k, v in value.items() if any(x != "" for x in v)}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_concrete(v) for v in value]
    return value


def _string_variant(s: str) -> str:
    return s.upper() if s.lower() != s.upper() else s + " "


def bfcl_mutations(rng: random.Random, answer: list[dict], functions: list[dict]) -> list[tuple[str, list[dict]]]:
    """(what was done, model output as [{name: {param: value}}]) for one record."""
    by_name = {f["name"]: f for f in functions}

    def base(choose=_first):
        return [{name: {p: _concrete(choose(vals)) for p, vals in params.items() if any(v != "" for v in vals)}}
                for call in answer for name, params in call.items()]

    outs = [("the first accepted values", base())]
    alt = base(lambda vals: rng.choice([v for v in vals if v != ""]))
    outs.append(("random accepted values", alt))
    optional = [(i, p) for i, call in enumerate(answer) for name, params in call.items()
                for p, vals in params.items() if "" in vals and any(v != "" for v in vals)]
    if optional:
        i, p = rng.choice(optional)
        out = base()
        next(iter(out[i].values())).pop(p, None)
        outs.append((f"optional {p} left out", out))
    strings = [(i, p) for i, call in enumerate(base()) for name, params in call.items()
               for p, v in params.items() if isinstance(v, str)]
    if strings:
        i, p = rng.choice(strings)
        out = base()
        args = next(iter(out[i].values()))
        args[p] = rng.choice([_string_variant(args[p]), args[p].replace(" ", ""), args[p] + "x"])
        outs.append((f"string {p} varied", out))
    numbers = [(i, p) for i, call in enumerate(base()) for name, params in call.items()
               for p, v in params.items() if type(v) in (int, float)]
    if numbers:
        i, p = rng.choice(numbers)
        out = base()
        args = next(iter(out[i].values()))
        args[p] = rng.choice([float(args[p]), args[p] + 1, str(args[p]), int(args[p]) if args[p] == int(args[p]) else args[p]])
        outs.append((f"number {p} changed", out))
    out = base()
    name, args = next(iter(out[0].items()))
    required = by_name.get(name, {}).get("parameters", {}).get("required", [])
    kind = rng.choice(["missing", "extra", "name", "extra call", "swap"])
    if kind == "missing" and required:
        args.pop(required[0], None)
    elif kind == "extra":
        args["unexpected_flag"] = True
    elif kind == "name":
        out[0] = {name + "_v2": args}
    elif kind == "extra call":
        out.append(copy.deepcopy(out[0]))
    elif len(out) > 1:
        out.reverse()
    outs.append((kind, out))
    return outs


def bfcl_agreement(data: Path, checker, rng: random.Random, per_category: int) -> dict:
    from bfcl_eval.constants.enums import Language

    agree, cases, disagreements = 0, 0, []
    for category in BFCL_CATEGORIES:
        questions = {json.loads(l)["id"]: json.loads(l) for l in (data / f"BFCL_v4_{category}.json").open()}
        answers = {json.loads(l)["id"]: json.loads(l) for l in (data / "possible_answer" / f"BFCL_v4_{category}.json").open()}
        records = {r.id: r for r in load_tasks(data / f"BFCL_v4_{category}.json", "bfcl")[0]}
        for record_id in rng.sample(sorted(records), per_category):
            functions, answer = questions[record_id]["function"], answers[record_id]["ground_truth"]
            for what, output in bfcl_mutations(rng, answer, functions):
                want = checker.ast_checker(copy.deepcopy(functions), copy.deepcopy(output), copy.deepcopy(answer),
                                           Language.PYTHON, category, "tokencredit")["valid"]
                calls = [ToolCall(name, args) for call in output for name, args in call.items()]
                _, correct = tools.verify(records[record_id], tools.render_calls(calls))
                cases += 1
                if (correct.score >= 1.0) == want:
                    agree += 1
                else:
                    disagreements.append({"id": record_id, "case": what, "output": output, "bfcl_valid": want,
                                          "correctness": correct.score, "observed": correct.observed})
    return {"agree": agree, "cases": cases, "disagreements": disagreements}


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
        got = _edge_score(records.get(f"edge_{i}"), case)
        if got is not None and (got >= 1.0) == want:
            agree += 1
        else:
            disagreements.append({"id": f"edge_{i}", "kind": case.kind, "answer": case.answer, "output": case.output,
                                  "bfcl_valid": want, "correctness": got})
    return {"agree": agree, "cases": len(EDGE_CASES), "hand_agree": hand, "disagreements": disagreements,
            "rejected": [(r.record_id, r.reason) for r in rejected]}


def _edge_score(record, case) -> float | None:
    """tokencredit's correctness of the case's output (None when the record did not load)."""
    if record is None:
        return None
    calls = [ToolCall(name, args) for call in case.output for name, args in call.items()]
    return tools.verify(record, tools.render_calls(calls))[1].score


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
           "`bench/references.py`): mutations of BFCL's own answers, BFCL edge cases (`bench/bfcl_edge_cases.py`), "
           "hostile database paths.", results=("fidelity.json",),
           targets=(Target("ifeval_agree", ">=", 0.98), Target("bfcl_agree", ">=", 0.98), Target("path_escapes", "==", 0),
                    Target("bfcl_edge_all_agree", "==", True), Target("bfcl_all_loaded", "==", True)))
def run(h: Harness) -> dict:
    if h.quick and not references.available():
        raise Unavailable("the reference checkers are not unpacked: `python bench/references.py` fetches them")
    rng = random.Random(SEED)
    reference = references.ifeval()
    checker = references.bfcl()
    data = references.bfcl_data()
    cases = ifeval_cases(rng)
    kinds = {c[0] for c in cases}
    assert kinds == set(ifeval.IFEVAL_IDS), sorted(set(ifeval.IFEVAL_IDS) - kinds)
    iv = ifeval_agreement(cases, reference)
    loads = bfcl_load_counts(data)
    bf = bfcl_agreement(data, checker, rng, per_category=1 if h.quick else 6)
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
