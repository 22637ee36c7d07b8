"""Build the instruction-following demo set: short templated notes under 2 to 6 constraints.

    python -m tokencredit.verifiers.demo.build_instructions     # rewrites demo/instructions.jsonl

Deterministic (fixed seed, no downloads): the JSONL comes out byte-identical on every run.
Each record draws a topic, a layout (plain, paragraphs, bullets, sections or JSON) and
constraints that fit the layout and each other; the reference response is generated from
templates, and the counting constraints (words, sentences, characters, keywords) take their
bounds from it, so every reference meets every constraint -- `build` asserts it with the
verifier itself. Every 5th record is `"split": "test"`.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from tokencredit.schemas.records import Constraint, InstructionSpec, TaskRecord
from tokencredit.verifiers import checkers, instructions
from tokencredit.verifiers.demo import write_jsonl

SEED = 2024
HERE = Path(__file__).parent
OUT_JSONL = HERE / "instructions.jsonl"
N_RECORDS = 200
TEST_EVERY = 5
MAX_PROMPT_CHARS = 450
MAX_RESPONSE_CHARS = 300

# topic -> (its key word, sentences without commas or ! ; ? so that those bans always hold)
TOPICS = {
    "the river": ("river", ["The river is calm today.", "The river water is cold and clear.",
                            "Fish swim under the old bridge.", "Kids play by the river.", "The river runs to the sea."]),
    "the garden": ("garden", ["The garden is green.", "Red roses grow in the garden.",
                              "Bees visit every flower.", "We water the garden at dawn.", "The garden needs rain."]),
    "the market": ("market", ["The market opens early.", "The market sells fresh bread.",
                              "People buy fruit and fish.", "The market is busy on Sunday.", "Prices are low today."]),
    "the forest": ("forest", ["The forest is quiet.", "Tall trees cover the forest.",
                              "Birds sing in the morning.", "A path leads into the forest.", "The forest smells of pine."]),
    "the beach": ("beach", ["The beach is warm.", "Waves roll onto the beach.",
                            "Children build sand castles.", "The beach is empty at night.", "We walk along the beach."]),
    "the library": ("library", ["The library is open.", "The library has many books.",
                                "People read in silence.", "The library closes at six.", "We borrow two books."]),
    "the train": ("train", ["The train leaves at noon.", "The train is fast and clean.",
                            "We find our seats.", "The train stops in the city.", "The train ride is short."]),
    "the rain": ("rain", ["The rain starts at night.", "The rain is soft and cool.",
                          "We stay inside and read.", "The streets shine after the rain.", "The rain stops by noon."]),
    "the mountain": ("mountain", ["The mountain is high.", "Snow covers the mountain top.",
                                  "We climb the mountain slowly.", "The view is wide and clear.", "The air is thin."]),
    "the kitchen": ("kitchen", ["The kitchen is warm.", "Soup cooks in the kitchen.",
                                "We bake bread together.", "The kitchen smells sweet.", "We clean the kitchen after dinner."]),
}
OPENERS = ["Hello there.", "Dear friend.", "Good news.", "Quick note."]
CLOSERS = ["That is all.", "See you soon.", "Thank you.", "Have a nice day."]
PLACEHOLDER_LINES = {1: "Ask [name] to join.", 2: "Meet [name] at [place]."}
STOPWORDS = {"the", "and", "are", "into", "onto", "after", "under", "every", "along", "many", "have",
             "topic", "note", "name", "place", "section"}  # the last ones are layout, not content
BANNABLE = "!;?"

LAYOUTS = ("plain", "plain", "paragraphs", "bullets", "sections", "json")
LAYOUT_KIND = {"paragraphs": "paragraph_count", "bullets": "bullet_count", "sections": "sections", "json": "json_format"}
ALL = {"plain", "paragraphs", "bullets", "sections", "json"}
FITS = {  # extra constraint kind -> layouts it fits
    "keyword_include": ALL, "keyword_exclude": ALL, "keyword_frequency": ALL, "word_count": ALL,
    "char_count": ALL, "placeholders": ALL, "punctuation_ban": ALL,
    "sentence_count": ALL - {"json"}, "no_commas": ALL - {"json"},
    "lowercase": ALL - {"sections"}, "uppercase": ALL - {"json"}, "title": ALL - {"json"},
    "starts_with": {"plain", "paragraphs"}, "ends_with": {"plain", "paragraphs"}, "quotation": {"plain", "paragraphs"},
}
DEMO_KINDS = set(LAYOUT_KIND.values()) | set(FITS)  # the demo keeps the kinds the shipped models learned
CLASHES = [{"lowercase", "uppercase"}, {"quotation", "starts_with"}, {"quotation", "ends_with"}, {"title", "starts_with"}]


def draw_kinds(rng: random.Random, layout: str) -> list[str]:
    """2 to 6 compatible constraint kinds: the layout's own (if any) first, then extras."""
    kinds = [LAYOUT_KIND[layout]] if layout in LAYOUT_KIND else []
    total = rng.randint(2, 6)
    extras = sorted(k for k, fits in FITS.items() if layout in fits)
    rng.shuffle(extras)
    for kind in extras:
        if len(kinds) < total and not any({kind, k} in CLASHES for k in kinds):
            kinds.append(kind)
    return kinds


def compose(rng: random.Random, topic: str, layout: str, kinds: list[str]) -> tuple[str, dict]:
    """The reference response for `kinds` and the arguments fixed while writing it (json keys)."""
    n_units = {"plain": rng.randint(1, 2), "json": 1}.get(layout, rng.randint(2, 3))
    units = rng.sample(TOPICS[topic][1], n_units)
    if "placeholders" in kinds:
        units[-1] += " " + PLACEHOLDER_LINES[rng.randint(1, 2)]
    if "starts_with" in kinds:
        units[0] = rng.choice(OPENERS) + " " + units[0]
    if "ends_with" in kinds:
        units[-1] += " " + rng.choice(CLOSERS)
    fixed = {}
    if layout == "json":
        fixed["keys"] = rng.choice([["topic", "note"], ["note"], []])
        text = json.dumps({"topic": topic.split()[-1], "note": units[0]})
    else:
        text = {
            "plain": " ".join, "paragraphs": "\n\n".join,
            "bullets": lambda us: "\n".join(f"* {u}" for u in us),
            "sections": lambda us: "\n\n".join(f"SECTION {k}\n{u}" for k, u in enumerate(us, 1)),
        }[layout](units)
    if "title" in kinds:
        text = f"<<{topic.title()}>>\n{text}"
    if "lowercase" in kinds:
        text = text.lower()
    if "uppercase" in kinds:
        text = text.upper()
    if "quotation" in kinds:
        text = f'"{text}"'
    return text, fixed


def measured_args(rng: random.Random, kind: str, text: str, topic: str, fixed: dict) -> dict:
    """Arguments for `kind` that `text` meets, read off `text` itself."""
    if kind in ("word_count", "sentence_count", "char_count"):
        n = {"word_count": len(checkers.words(text)), "sentence_count": len(checkers.sentences(text)),
             "char_count": len(text.strip())}[kind]
        slack = {"word_count": 5, "sentence_count": 1, "char_count": 40}[kind]
        lo, hi = max(0, n - rng.randint(0, slack)), n + rng.randint(0, slack)
        return rng.choice([{"min": lo}, {"max": hi}, {"min": lo, "max": hi}])
    if kind == "keyword_include":
        pool = _content_words(text)
        return {"keywords": rng.sample(pool, min(len(pool), rng.randint(1, 2)))}
    if kind == "keyword_exclude":
        pool = sorted({TOPICS[t][0] for t in TOPICS} - {w.lower() for w in checkers.words(text)})
        return {"keywords": rng.sample(pool, rng.randint(1, 2))}
    if kind == "keyword_frequency":  # the topic's key word, else the most frequent content word
        counts = {w: checkers.keyword_count(text, w) for w in _content_words(text)}
        word = TOPICS[topic][0] if counts.get(TOPICS[topic][0]) else max(sorted(counts), key=counts.get)
        return {"keyword": word, "n": counts[word]}
    if kind == "punctuation_ban":
        return {"chars": "".join(rng.sample(BANNABLE, rng.randint(1, 2)))}
    if kind == "placeholders":
        return {"n": len(checkers.placeholders(text))}
    if kind in ("paragraph_count", "bullet_count", "sections"):
        count = {"paragraph_count": checkers.paragraphs, "bullet_count": checkers.bullets,
                 "sections": checkers.section_numbers}[kind]
        return {"n": len(count(text))}
    if kind in ("starts_with", "ends_with"):
        sents = checkers.sentences(text.strip())
        return {"phrase": sents[0] if kind == "starts_with" else sents[-1]}
    if kind == "json_format":
        return {"keys": fixed["keys"]} if fixed["keys"] else {}
    return {}


def _content_words(text: str) -> list[str]:
    return sorted({w.lower() for w in checkers.words(text) if len(w) >= 4 and w.lower() not in STOPWORDS})


def draw_record(rng: random.Random, index: int) -> dict:
    """One record that fits the prompt and response length limits (redrawn until it does)."""
    while True:
        topic = rng.choice(sorted(TOPICS))
        layout = rng.choice(LAYOUTS)
        kinds = draw_kinds(rng, layout)
        text, fixed = compose(rng, topic, layout, kinds)
        constraints = [{"kind": k, "args": measured_args(rng, k, text, topic, fixed)} for k in kinds]
        prompt = " ".join([f"Write a short note about {topic}."]
                          + [instructions.describe(c["kind"], c["args"]) for c in constraints])
        if len(prompt) <= MAX_PROMPT_CHARS and len(text) <= MAX_RESPONSE_CHARS:
            split = "test" if index % TEST_EVERY == TEST_EVERY - 1 else "train"
            return {"id": f"inst-{index:04d}", "task": "instructions", "prompt": prompt,
                    "reference_response": text, "constraints": constraints, "split": split}


def as_task_record(obj: dict) -> TaskRecord:
    spec = InstructionSpec(tuple(Constraint(c["kind"], c["args"]) for c in obj["constraints"]))
    return TaskRecord(obj["id"], obj["task"], obj["prompt"], obj["reference_response"], spec, obj["split"])


def build() -> list[dict]:
    rng = random.Random(SEED)
    records = [draw_record(rng, i) for i in range(N_RECORDS)]
    for obj in records:
        scores = instructions.verify(as_task_record(obj), obj["reference_response"])
        assert all(s.score == 1.0 for s in scores), (obj["id"], [s for s in scores if s.score < 1.0])
    for split in ("train", "test"):
        seen = {c["kind"] for r in records if r["split"] == split for c in r["constraints"]}
        assert seen == DEMO_KINDS, (split, sorted(DEMO_KINDS - seen))
    return records


def main() -> None:
    records = build()
    write_jsonl(records, OUT_JSONL)
    n_test = sum(r["split"] == "test" for r in records)
    print(f"wrote {len(records)} records ({n_test} test) to {OUT_JSONL}")


if __name__ == "__main__":
    main()
