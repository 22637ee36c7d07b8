"""The closed-loop experiment's instruction prompts: short writing requests under 2-4 constraints.

    python bench/closed_loop_prompts/build.py pilot      # every candidate kind, train split only
    python bench/closed_loop_prompts/build.py final      # seen kinds in train/held-out, unseen kinds held out
    python bench/closed_loop_prompts/build.py powered    # final's train prompts, 1,024 fresh held-out prompts
    python bench/closed_loop_prompts/build.py rounds     # the same train prompts, 256 held-out ones none above has

Deterministic (fixed seeds, no downloads). A prompt is a request ("Write a short note about the harbor.")
followed by each constraint's own sentence (`tokencredit.verifiers.checkers`, the sentence its feedback uses). The
pilot file samples every candidate kind so that SmolLM2's pass rate per kind can be measured on train
prompts; `final` uses the kinds chosen from that pilot (`SEEN`, `UNSEEN`, fixed below with the pilot's
figures in bench/RESULTS.md). Held-out prompts use their own topics, and a quarter of them ask only for
kinds that no train prompt asks for.
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from tokencredit.verifiers.checkers import CHECKERS  # noqa: E402

TRAIN_TOPICS = ["the harbor", "a rainy morning", "the old bakery", "a bicycle trip", "the school garden",
                "a winter night", "the city park", "a lost dog", "the night market", "a mountain lake",
                "the first day of school", "a birthday party", "the village well", "a summer storm",
                "the train station", "a quiet library", "the family farm", "a music lesson", "the river bank",
                "a snowy street", "the science fair", "an autumn walk", "the fishing boat", "a kitchen garden"]
HELD_OUT_TOPICS = ["the lighthouse", "a picnic in the hills", "the corner shop", "a long flight",
                   "the football match", "a foggy evening", "the museum", "a new neighbor", "the camping trip",
                   "a spring festival", "the bus ride home", "a desert road", "the bookshop", "a cold beach",
                   "the pottery class", "a forest cabin"]
GENRES = ["a short note", "a short description", "a short story", "a short letter to a friend",
          "a few sentences", "a short blog post"]
KEYWORDS = ["light", "blue", "small", "quiet", "morning", "friend", "water", "green", "warm", "old"]
STARTS = ["Today", "Dear friend", "Once upon a time", "Hello", "In the morning"]
ENDS = ["Thank you.", "See you soon.", "That is all.", "Goodbye."]


ARGS = {  # the pilot's candidate kinds -> the arguments of one constraint of that kind, drawn with rng for a topic
    "keyword_include": lambda rng, topic: {"keywords": [rng.choice(KEYWORDS)]},
    "keyword_exclude": lambda rng, topic: {"keywords": [topic.split()[-1]]},
    "word_count": lambda rng, topic: {"max": rng.choice([30, 40, 50])},
    "sentence_count": lambda rng, topic: {"max": rng.choice([2, 3])},
    "no_commas": lambda rng, topic: {},
    "starts_with": lambda rng, topic: {"phrase": rng.choice(STARTS)},
    "ends_with": lambda rng, topic: {"phrase": rng.choice(ENDS)},
    "lowercase": lambda rng, topic: {},
    "title": lambda rng, topic: {},
    "postscript": lambda rng, topic: {"marker": "P.S."},
    "placeholders": lambda rng, topic: {"n": 1},
    "bullet_count": lambda rng, topic: {"n": 3},
    "quotation": lambda rng, topic: {},
    "highlighted_sections": lambda rng, topic: {"n": 1},
    "paragraph_count": lambda rng, topic: {"n": 2},
    "capital_word_frequency": lambda rng, topic: {"min": 2},
}
CANDIDATES = tuple(ARGS)
# Chosen on the pilot (train prompts only; figures in bench/RESULTS.md, "Closed loop, SmolLM2").
SEEN = ("bullet_count", "keyword_include", "paragraph_count", "placeholders", "sentence_count", "word_count")
UNSEEN = ("capital_word_frequency", "postscript", "title")
# Kinds that cannot hold together: at most one of each group per prompt.
EXCLUSIVE = [{"word_count", "sentence_count"}, {"starts_with", "quotation", "title"},
             {"ends_with", "postscript", "quotation"}, {"bullet_count", "paragraph_count"}]


def draw_kinds(rng: random.Random, kinds: tuple[str, ...], n: int) -> list[str]:
    chosen: list[str] = []
    for kind in rng.sample(list(kinds), len(kinds)):
        clash = any(kind in group and group & set(chosen) for group in EXCLUSIVE)
        if not clash:
            chosen.append(kind)
        if len(chosen) == n:
            break
    return chosen


def record(rng: random.Random, rid: str, split: str, topic: str, kinds: list[str]) -> dict:
    constraints = [{"kind": k, "args": ARGS[k](rng, topic)} for k in kinds]
    sentences = " ".join(CHECKERS[c["kind"]].describe(**c["args"]) for c in constraints)
    prompt = f"Write {rng.choice(GENRES)} about {topic}. {sentences}"
    return {"id": rid, "task": "instructions", "split": split, "prompt": prompt, "constraints": constraints}


def build(kind: str, seen: tuple[str, ...] = SEEN, unseen: tuple[str, ...] = UNSEEN,
          n_train: int = 256, n_held_out: int = 256) -> list[dict]:
    """Records of the pilot (`kind="pilot"`: train split, every candidate) or the final set."""
    rng = random.Random(f"closed-loop-{kind}")
    if kind == "pilot":
        return [record(rng, f"pilot-{i:03d}", "train", rng.choice(TRAIN_TOPICS),
                       draw_kinds(rng, CANDIDATES, 3)) for i in range(n_train)]
    if not seen or not unseen:
        raise SystemExit("choose SEEN and UNSEEN from the pilot first")
    rows = [record(rng, f"train-{i:03d}", "train", rng.choice(TRAIN_TOPICS),
                   draw_kinds(rng, seen, rng.choice([2, 3, 4]))) for i in range(n_train)]
    n_unseen = n_held_out // 4
    rows += [record(rng, f"heldout-{i:03d}", "test", rng.choice(HELD_OUT_TOPICS),
                    draw_kinds(rng, seen, rng.choice([2, 3, 4]))) for i in range(n_held_out - n_unseen)]
    rows += [record(rng, f"unseen-{i:03d}", "test", rng.choice(HELD_OUT_TOPICS),
                    draw_kinds(rng, unseen, min(len(unseen), rng.choice([2, 3])))) for i in range(n_unseen)]
    return rows


def build_powered(n_held_out: int = 1024, generator: str = "closed-loop-powered",
                  scored: tuple[list[dict], ...] = ()) -> list[dict]:
    """The powered design's prompts (bench/compare_designs/powered.toml): the final set's train prompts, and
    `n_held_out` held-out prompts drawn afresh (their own `generator`; a quarter unseen kinds, as in `final`),
    none with the text of another prompt, of a train prompt, of the final set's 256 held-out prompts (which
    the older experiments scored) or of a prompt in `scored` (the sets later designs scored)."""
    final = build("final")
    taken = {r["prompt"] for rows in (final, *scored) for r in rows}
    rng = random.Random(generator)
    n_unseen = n_held_out // 4
    rows = [r for r in final if r["split"] == "train"]
    for i in range(n_held_out):
        unseen = i >= n_held_out - n_unseen
        rid = f"unseen-{i - (n_held_out - n_unseen):04d}" if unseen else f"heldout-{i:04d}"
        while True:
            kinds = (draw_kinds(rng, UNSEEN, min(len(UNSEEN), rng.choice([2, 3]))) if unseen
                     else draw_kinds(rng, SEEN, rng.choice([2, 3, 4])))
            row = record(rng, rid, "test", rng.choice(HELD_OUT_TOPICS), kinds)
            if row["prompt"] not in taken:
                break
        taken.add(row["prompt"])
        rows.append(row)
    return rows


def write(rows: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "final"
    out = HERE / f"{ {'pilot': 'pilot', 'powered': 'powered', 'rounds': 'rounds'}.get(which, 'prompts')}.jsonl"
    rows = {"powered": build_powered,
            "rounds": lambda: build_powered(256, generator="closed-loop-rounds", scored=(build_powered(),))}
    write(rows[which]() if which in rows else build(which), out)
    print(f"wrote {out}")
