"""The closed-loop experiments: their prompt sets, their compare rows re-derived from the stored per-prompt rewards by
compare's own code (bench/compare_results.py for a finished run), their designs, and the pilot's recipe
(docs/experiments/closed-loop.md)."""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DESIGNS = ROOT / "bench" / "compare_designs"
sys.path.insert(0, str(ROOT / "bench"))

import compare_results  # noqa: E402

from tokencredit import verifiers  # noqa: E402
from tokencredit.pipeline.compare.design import file_sha256, load_design  # noqa: E402
from tokencredit.pipeline.compare.report import KEYS, rows_for  # noqa: E402

_spec = importlib.util.spec_from_file_location("closed_loop_prompts",
                                               ROOT / "bench" / "closed_loop_prompts" / "build.py")
prompt_set = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prompt_set)


def test_the_prompt_set_is_the_builders_and_keeps_unseen_kinds_out_of_training():
    built = prompt_set.build("final")
    stored = [json.loads(line) for line in (ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl").open()]
    assert built == stored  # deterministic, and the committed file is what the builder writes
    records, rejected = verifiers.load_tasks(ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl")
    assert not rejected and len(records) == 512
    train = [r for r in records if r.split == "train"]
    held_out = [r for r in records if r.split == "test"]
    assert len(train) == 256 and len(held_out) == 256
    train_kinds = {c.kind for r in train for c in r.spec.constraints}
    unseen = [r for r in held_out if r.id.startswith("unseen-")]
    assert len(unseen) == 64 and train_kinds == set(prompt_set.SEEN)
    assert all({c.kind for c in r.spec.constraints} <= set(prompt_set.UNSEEN) for r in unseen)
    assert all(2 <= len(r.spec.constraints) <= 4 for r in train + held_out if not r.id.startswith("unseen-"))
    assert not {r.prompt for r in train} & {r.prompt for r in held_out}


# The older designs' per-prompt rewards, as the closed-loop script stored them (labels offline-ARM-SEED-STEPS, decodes
# greedy and sampled), and the arms each added after its held-out results
OLDER = {"mc_tree": ("closed_loop_per_prompt.json", []),
         "mrtpo_offline": ("closed_loop_mrtpo_offline_per_prompt.json", ["mrtpo_both"])}


def older_scores(per_prompt: str, steps: int) -> dict[str, dict]:
    """compare's scores (ARM-SEED -> arm, seed, scored_at, decodes) of the offline arms' final policies; decode
    'sampled' is compare's 'sampled-1'; no scoring times (they came from git history)."""
    scores = {}
    for label, result in json.loads((RESULTS / per_prompt).read_text()).items():
        parts = label.split("-")
        if parts[0] != "offline" or int(parts[3]) != steps:
            continue
        decodes = {("greedy" if d == "greedy" else "sampled-1"): {p: {"reward": r, "scores": {}}
                                                                  for p, r in cells.items()}
                   for d, cells in result.items()}
        scores[f"{parts[1]}-{parts[2]}"] = {"arm": parts[1], "seed": int(parts[2]), "scored_at": None,
                                            "decodes": decodes}
    return scores


def test_compare_rows_of_every_design_are_reproduced_from_their_stored_rewards():
    stored = json.loads((RESULTS / "compare.json").read_text())
    by_hash: dict[str, list] = {}
    for row in stored:
        by_hash.setdefault(row["design_hash"], []).append(row)
    powered = by_hash.pop(file_sha256(DESIGNS / "powered.toml"))
    assert len(by_hash) == 2
    for rows in by_hash.values():
        first = rows[0]
        name = "mc_tree" if first["design_commit"] else "mrtpo_offline"  # the MRTPO experiment was not pre-registered
        per_prompt, exploratory = OLDER[name]
        design = load_design(DESIGNS / f"{name}.toml")
        registration = {"design_hash": first["design_hash"], "design_commit": first["design_commit"],
                        "design_commit_time": None, "amendments": [{"arms": exploratory}]}
        again = rows_for(older_scores(per_prompt, design.training["steps"]), registration, design.comparisons,
                         design.primary, design.targets.get("mde"))
        assert json.loads(json.dumps([{k: r[k] for k in KEYS} for r in again])) == rows
    # the powered design's, from its committed per-prompt rewards: registered before any policy was scored
    packed = json.loads((RESULTS / "compare_powered_per_prompt.json").read_text())
    registration, scores = compare_results.unpack(packed)
    design = load_design(DESIGNS / "powered.toml")
    assert registration["design_hash"] == design.sha256
    assert len(scores) == len(design.arms) * len(design.seeds) + 1  # and the start policy
    again = [{k: r[k] for k in KEYS} for r in compare_results.design_rows(design, packed)]
    assert json.loads(json.dumps(again)) == powered
    assert all(r["design_commit"] and not r["exploratory"] for r in powered)
    assert min(p["scored_at"] for p in scores.values()) > registration["registered_at"]


def unpacked_folder(packed: dict, out: Path) -> Path:
    """A compare folder holding what a packed run stored: its registration and one scores file per policy."""
    registration, scores = compare_results.unpack(packed)
    (out / "scores").mkdir(parents=True)
    (out / "registration.json").write_text(json.dumps(registration))
    for label, score in scores.items():
        (out / "scores" / f"{label}.json").write_text(json.dumps({"label": label, **score}))
    return out


def test_a_finished_run_is_published_into_the_results_as_its_stored_rows(tmp_path):
    packed = json.loads((RESULTS / "compare_powered_per_prompt.json").read_text())
    run = unpacked_folder(packed, tmp_path / "run")
    assert compare_results.pack(run) == packed
    results, figures = tmp_path / "results", tmp_path / "figures"
    results.mkdir(), figures.mkdir()
    for name in ("compare.json", "compare_details.json"):
        (results / name).write_text((RESULTS / name).read_text())
    rows = compare_results.publish(DESIGNS / "powered.toml", run, results, figures)
    assert (results / "compare.json").read_text() == (RESULTS / "compare.json").read_text()
    assert json.loads((results / "compare_powered_per_prompt.json").read_text()) == packed
    details, before = (json.loads((d / "compare_details.json").read_text()) for d in (results, RESULTS))
    assert [r for r in details if r["design"] != "powered"] == [r for r in before if r["design"] != "powered"]
    powered = [[r for r in rows if r["design"] == "powered"] for rows in (details, before)]
    for new, old in zip(*powered, strict=True):
        assert {k: new[k] for k in old} == old  # and the keys added since (gain_over_start, relative_diff, ...)
    assert len(rows) == 5 and (figures / "compare_powered.png").stat().st_size > 0


def test_a_run_missing_seeds_is_not_published(tmp_path):
    packed = json.loads((RESULTS / "compare_powered_per_prompt.json").read_text())
    design = load_design(DESIGNS / "powered.toml")
    kept = {k: v for k, v in packed["policies"].items() if v["seed"] in (None, *design.seeds[:2])}  # and the start
    short = {**packed, "policies": kept}
    run = unpacked_folder(short, tmp_path / "run")
    results = tmp_path / "results"
    results.mkdir()
    with pytest.raises(ValueError, match=r"not every seed of its 4 is scored: mc - gdpo_tree \(2 seeds\)"):
        compare_results.publish(DESIGNS / "powered.toml", run, results, tmp_path)
    assert not any(results.iterdir())


def test_the_closed_loop_modes_designs_load_as_compare_designs():
    """The old script's iterated arm and dev screen as compare designs (docs/experiments/closed-loop.md)."""
    from tokencredit.pipeline.dataset.training import parse_advantage

    iterated = load_design(DESIGNS / "iterated.toml")
    assert (iterated.rounds, iterated.training["steps"], iterated.prompts["train_limit"]) == (4, 4, 8)
    assert iterated.pools["flat"].n * iterated.prompts["train_limit"] == 4 * 8  # a round's 8 prompts x 4
    hypotheses = load_design(DESIGNS / "hypotheses.toml")
    assert set(hypotheses.arms) == {"gdpo", "mrtpo", "mrtpobeta1", "mrtpo_both"}
    assert parse_advantage(hypotheses.arms["mrtpobeta1"].advantage) == {"mrtpo": 2.0, "gdpo": -1.0}
    assert hypotheses.pools[hypotheses.arms["mrtpo_both"].pool].locate == "both"


PILOT_SIZES = {"--limit 96": "--limit 3", "--n 4": "--n 2", "--max-new-tokens 96": "--max-new-tokens 12",
               " --model smollm2-135m-instruct": "", "tokencredit annotate": "tokencredit annotate --runner none",
               "bench/closed_loop_prompts/": f"{ROOT}/bench/closed_loop_prompts/"}


@pytest.mark.slow
def test_the_pilot_recipe_gives_each_kinds_pass_rate_at_each_temperature(tmp_path):
    """The page's pilot recipe, on the shipped tiny policy at a smaller size: per temperature, a kind's pass rate is
    the share of its constraints that the verifier scores 1 in that run's responses."""
    from tokencredit.pipeline.dataset.query import connect

    page = (ROOT / "docs" / "experiments" / "closed-loop.md").read_text()
    marker = ("<!-- tested-by: tests/test_closed_loop.py::"
              "test_the_pilot_recipe_gives_each_kinds_pass_rate_at_each_temperature -->")
    (block,) = re.findall(re.escape(marker) + r"\n```bash\n(.*?)```", page, flags=re.S)
    for big, small in PILOT_SIZES.items():
        assert big in block, big
        block = block.replace(big, small)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1",
           "OMP_WAIT_POLICY": "PASSIVE", "DO_NOT_TRACK": "1"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    row = r"│ (\w+)\s+│\s+([\d.]+) │\s+(\d+) │"
    tables = [{k: (float(r), int(n)) for k, r, n in re.findall(row, table)} for table in done.stdout.split("kind")[1:]]
    records = {r.id: r for r in verifiers.load_tasks(ROOT / "bench" / "closed_loop_prompts" / "pilot.jsonl")[0]}
    runs = sorted(tmp_path.glob("runs/pilot-*"))
    assert [p.name for p in runs] == ["pilot-0.5", "pilot-0.7", "pilot-1.0"] and len(tables) == 3
    for run, table in zip(runs, tables):
        passed: dict[str, list[float]] = {}
        for group, response in connect(str(run)).sql("SELECT group_id, response FROM responses").fetchall():
            record = records[group]
            for score, constraint in zip(verifiers.verify(record, response), record.spec.constraints):
                passed.setdefault(constraint.kind, []).append(float(score.score >= 1.0))
        assert {k: n for k, (_, n) in table.items()} == {k: len(v) for k, v in passed.items()}, run.name
        for kind, (rate, _) in table.items():  # DuckDB's round(, 3)
            assert rate == pytest.approx(np.mean(passed[kind]), abs=5e-4), (run.name, kind)
        assert len(passed) >= 3  # three prompts of 2-4 constraints each


def test_the_powered_prompt_set_is_the_builders_and_fresh():
    built = prompt_set.build_powered()
    stored = [json.loads(line) for line in (ROOT / "bench" / "closed_loop_prompts" / "powered.jsonl").open()]
    assert built == stored
    final = prompt_set.build("final")
    held_out = [r for r in built if r["split"] == "test"]
    assert [r for r in built if r["split"] == "train"] == [r for r in final if r["split"] == "train"]
    assert len(held_out) == 1024 and sum(r["id"].startswith("unseen-") for r in held_out) == 256
    assert len({r["prompt"] for r in held_out}) == 1024
    assert not {r["prompt"] for r in held_out} & {r["prompt"] for r in final}  # none the older runs scored
