"""`tokencredit compare`: the design file, pre-registration, the report's rows, --plan, and the command end to end
on the tiny policy (resumed after kill -9 and after SIGTERM with identical rows; a changed design refused with one
line)."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest
import torch

from tokencredit.flows.cli import main
from tokencredit.pipeline.compare.design import load_design
from tokencredit.pipeline.compare.plan import Costs, plan
from tokencredit.pipeline.compare.registry import git_commit, register, scored_before_commit
from tokencredit.pipeline.compare.report import rows_for, table
from tokencredit.pipeline.compare.run import design_inputs, policy_seconds, status

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl"

# 2 arms, 2 seeds, 8 train prompts x 4 responses, 6 held-out prompts, greedy + 1 sampled decode, 4 dev prompts:
# ~30 s on 2 cores
TINY = f"""
[policy]
device = "cpu"

[prompts]
file = "{PROMPTS}"
train_limit = 8
heldout_limit = 6
dev_limit = 4

[pools.flat]
n = 4
temperature = 1.0
max_new_tokens = 12
seed = 7
credit = ["gdpo", "mrtpo"]

[arms.gdpo]
pool = "flat"
advantage = "gdpo"

[arms.mrtpo]
pool = "flat"
advantage = "mrtpo"

[training]
seeds = [0, 1]
steps = 3
batch_size = 4
lr = 5e-2
lora = true

[scoring]
greedy = true
sampled = 1
temperature = 1.0
max_new_tokens = 12

[targets]
mde = 0.05
"""

EXTRA_ARM = """
[arms.rs]
pool = "flat"
objective = "rs"
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_bad_design_is_one_line_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"\[training\]: unknown key 'step'"):
        load_design(write(tmp_path / "d.toml", TINY.replace("steps = 3", "step = 3")))
    with pytest.raises(ValueError, match=r"\[arms.mrtpo\] pool: 'tree' is not one of the pools"):
        load_design(write(tmp_path / "d.toml", TINY.replace('pool = "flat"\nadvantage = "mrtpo"',
                                                            'pool = "tree"\nadvantage = "mrtpo"')))
    with pytest.raises(ValueError, match="at least two distinct seeds"):
        load_design(write(tmp_path / "d.toml", TINY.replace("seeds = [0, 1]", "seeds = [0]")))
    with pytest.raises(ValueError, match=r"\[training\] seeds: 'abc'; expected a list of integers"):
        load_design(write(tmp_path / "d.toml", TINY.replace("seeds = [0, 1]", 'seeds = "abc"')))
    with pytest.raises(ValueError, match=r"\[scoring\] sampled: -1; expected an integer >= 0"):
        load_design(write(tmp_path / "d.toml", TINY.replace("sampled = 1", "sampled = -1")))
    with pytest.raises(ValueError, match=r"\[policy\] backend: 'fast'; choose from auto, transformers, vllm"):
        load_design(write(tmp_path / "d.toml", TINY.replace('device = "cpu"', 'backend = "fast"')))
    with pytest.raises(ValueError, match=r"\[arms.mrtpo\] advantage: 'bogus': unknown advantage kind 'bogus'"):
        load_design(write(tmp_path / "d.toml", TINY.replace('advantage = "mrtpo"', 'advantage = "bogus"')))
    with pytest.raises(ValueError, match=r"\[pools.flat\]: credit kinds \('gdpo', 'mrtpo', 'bogus'\)"):
        load_design(write(tmp_path / "d.toml", TINY.replace('"gdpo", "mrtpo"]', '"gdpo", "mrtpo", "bogus"]')))
    with pytest.raises(ValueError, match=r"\[pools.flat\]: credit locate 'nowhere'"):
        load_design(write(tmp_path / "d.toml", TINY.replace("seed = 7", 'seed = 7\nlocate = "nowhere"')))
    with pytest.raises(ValueError, match=r"\[pools.flat\]: SamplingConfig: invalid top_p=2.0"):
        load_design(write(tmp_path / "d.toml", TINY.replace("seed = 7", "seed = 7\ntop_p = 2.0")))
    with pytest.raises(ValueError, match=r"\[pools.flat\] tree: 3; expected a list of integers"):
        load_design(write(tmp_path / "d.toml", TINY.replace("n = 4", "tree = 3")))
    design = load_design(write(tmp_path / "d.toml", TINY))
    assert design.policy["backend"] == "auto"  # annotate's default: vllm where installed and worth its start
    assert design.comparisons == (("mrtpo", "gdpo"),) and design.decodes == ["greedy", "sampled-1"]


def registered(design: Path, out: Path) -> dict:
    """`register` as compare calls it: the design loaded, its inputs hashed."""
    loaded = load_design(design)
    return register(loaded, out, design_inputs(loaded))


@pytest.mark.parametrize("lr", ["inf", "nan", "5.0"])
def test_a_learning_rate_that_cannot_train_is_refused_with_the_design(tmp_path, lr):
    with pytest.raises(ValueError, match=r"design \[training\] lr: "):  # `lr = inf` trained NaN policies, reported
        load_design(write(tmp_path / "d.toml", TINY.replace("lr = 5e-2", f"lr = {lr}")))


def test_a_policy_with_non_finite_weights_fails_and_is_never_scored(tmp_path):
    from tokencredit.pipeline.compare.run import heldout_records, score_policy
    from tokencredit.pipeline.models.loading import load_policy

    model, tokenizer = load_policy(None)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")  # what `lr = inf` left in every tensor
    model.save_pretrained(tmp_path / "nan", safe_serialization=True)
    tokenizer.save_pretrained(tmp_path / "nan")
    design = load_design(write(tmp_path / "d.toml", TINY.replace('device = "cpu"', 'device = "cpu"\nbackend = '
                                                                                     '"transformers"')))
    with pytest.raises(ValueError, match=r"policy gdpo-0 \(.*nan\): 1 of \d+ weight tensors hold NaN or inf \(first "
                                         r"model\.embed_tokens\.weight\); it failed and is not scored"):
        score_policy(design, "gdpo-0", tmp_path / "nan", heldout_records(design), tmp_path / "run", "gdpo", 0)
    assert not (tmp_path / "run" / "scores").exists()


def test_an_arm_whose_training_meets_a_non_finite_loss_fails_naming_it(tmp_path):
    from tests.test_train import huge_run, tiny_policy
    from tokencredit.pipeline.compare.run import train_arm

    policy = tiny_policy(tmp_path / "policy")
    design = load_design(write(tmp_path / "d.toml", TINY.replace('device = "cpu"', f'device = "cpu"\nmodel = '
                                                                                     f'"{policy}"')))
    pool = huge_run(tmp_path / "pool", 1e38)  # its first step's loss is -inf; trained on, every weight was NaN
    with pytest.raises(ValueError, match=r"^train mrtpo-0: step 1: the loss is not finite \(-inf\)"):
        train_arm(design, design.arms["mrtpo"], 0, Path(pool), tmp_path / "run")
    assert not (tmp_path / "run" / "train" / "mrtpo-0" / "final").exists()


def test_registration_refuses_a_changed_design_and_marks_added_arms_exploratory(tmp_path):
    out = tmp_path / "run"
    design = write(tmp_path / "d.toml", TINY)
    first = registered(design, out)
    assert first["design_commit"] is None  # not in a repository: not pre-registered
    assert registered(design, out)["amendments"] == []  # the same design again
    write(design, TINY + EXTRA_ARM)
    amended = registered(design, out)
    assert [a["arms"] for a in amended["amendments"]] == [["rs"]]
    write(design, TINY.replace("steps = 3", "steps = 4") + EXTRA_ARM)
    with pytest.raises(ValueError, match="changes more than adding arms: score it into a new --out"):
        registered(design, out)
    write(design, TINY.replace('[arms.mrtpo]\npool = "flat"\nadvantage = "mrtpo"\n', "") + EXTRA_ARM)
    with pytest.raises(ValueError, match="changes more than adding arms"):  # an arm dropped is a change too
        registered(design, out)


PLUGIN = "def always(record, response):\n    yield 'ok', 1.0, 'Say anything.'\n"


def edit_a_heldout_prompt(prompts: Path) -> None:
    text = prompts.read_text()
    first = next(json.loads(line) for line in text.splitlines() if json.loads(line).get("split") == "test")
    prompts.write_text(text.replace(first["prompt"], first["prompt"] + " Edited.", 1))


def test_registration_records_every_input_and_refuses_a_resume_on_a_changed_one(tmp_path):
    """The prompt file (its held-out texts), the policy's files and a plugin's source are registered by sha256;
    an edit to any of them since is refused, as a changed design is."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(PROMPTS.read_bytes())
    plugin = write(tmp_path / "always.py", PLUGIN)
    design = write(tmp_path / "d.toml", TINY.replace(str(PROMPTS), str(prompts)).replace(
        "heldout_limit = 6", f'heldout_limit = 6\nverifier = ["{plugin}:always"]'))
    out = tmp_path / "run"
    inputs = registered(design, out)["inputs"]
    assert inputs[str(prompts)]["sha256"] == hashlib.sha256(prompts.read_bytes()).hexdigest()
    assert f"plugin {plugin}:always" in inputs and any(Path(p).name == "model.safetensors" for p in inputs)
    original = prompts.read_text()
    edit_a_heldout_prompt(prompts)
    with pytest.raises(ValueError, match=f"registered with other inputs: {prompts} changed \\(sha256"):
        registered(design, out)
    prompts.write_text(original)
    assert registered(design, out)["inputs"] == inputs  # restored: the same inputs
    write(plugin, PLUGIN.replace("1.0", "0.5"))
    with pytest.raises(ValueError, match=f"registered with other inputs: plugin {plugin}:always changed"):
        registered(design, out)


def test_a_bad_design_value_is_refused_before_any_work(tmp_path, capsys):
    """`advantage = "bogus"` was refused only after its pool was annotated and two policies were scored."""
    bogus = write(tmp_path / "bogus.toml", TINY.replace('advantage = "mrtpo"', 'advantage = "bogus"'))
    assert main(["compare", str(bogus), "--out", str(tmp_path / "bogus"), "--runner", "none"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("tokencredit compare: error: design [arms.mrtpo] advantage: 'bogus': unknown advantage kind "
                   "'bogus' in 'bogus': choose from gdpo, mrtpo, p2t, mc or a mix like 'mrtpo:0.5,gdpo:0.5'")
    assert not (tmp_path / "bogus").exists()


def test_compare_refuses_a_resume_on_an_edited_prompt_file(tmp_path, capsys):
    """An edited held-out prompt file was scored under the ids it registered, with no warning."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(PROMPTS.read_bytes())
    design = write(tmp_path / "d.toml", TINY.replace(str(PROMPTS), str(prompts)))
    out = tmp_path / "run"
    assert main(["compare", str(design), "--out", str(out), "--report-only"]) == 0
    capsys.readouterr()
    edit_a_heldout_prompt(prompts)
    assert main(["compare", str(design), "--out", str(out), "--report-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"registered with other inputs: {prompts} changed" in err, err


def test_the_design_commit_is_the_files_last_commit_when_unmodified(tmp_path):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    design = write(tmp_path / "d.toml", TINY)
    assert git_commit(design) == (None, None)  # untracked
    subprocess.run(["git", "-C", str(tmp_path), "add", "d.toml"], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-qm", "design"], check=True, env=env)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    commit, when = git_commit(design)
    assert commit == head.strip()
    registration = registered(design, tmp_path / "run")
    assert registration["design_commit"] == commit
    assert scored_before_commit(registration, "2000-01-01T00:00:00+00:00")
    assert not scored_before_commit(registration, "2999-01-01T00:00:00+00:00")
    write(design, TINY + "\n")
    assert git_commit(design) == (None, None)  # modified since its commit


def synthetic_scores(effect: float, seeds=(0, 1, 2), prompts=40, rng_seed=0) -> dict:
    """Scores files' content for arms a and b, b's rewards lower by `effect` on average, plus noise."""
    rng = np.random.default_rng(rng_seed)
    base = rng.uniform(0.2, 0.8, prompts)
    scores = {}
    for arm, shift in (("a", effect), ("b", 0.0)):
        for s in seeds:
            cells = {d: {f"p{i}": {"reward": float(base[i] + shift + rng.normal(0, 0.1)),
                                   "scores": {"c0_word_count": float(rng.random() < 0.5)}} for i in range(prompts)}
                     for d in ("greedy", "sampled-1")}
            scores[f"{arm}-{s}"] = {"arm": arm, "seed": s, "scored_at": "2026-01-01T00:00:00+00:00",
                                    "decodes": cells}
    return scores


def test_report_rows_carry_the_keys_the_labels_and_the_estimate():
    registration = {"design_hash": "abc", "design_commit": "c0ffee", "design_commit_time": "2026-06-01T00:00:00+00:00",
                    "amendments": [{"arms": ["a"]}]}
    rows = rows_for(synthetic_scores(0.1), registration, [("a", "b")], primary=[("a", "b")], target_mde=0.05)
    (row,) = rows
    assert {"method", "baseline", "diff", "ci_low", "ci_high", "mde", "per_seed_diff", "seeds", "prompts",
            "decodes", "design_hash", "design_commit", "exploratory", "var_seed", "var_prompt", "var_cell"} <= set(row)
    assert row["diff"] == pytest.approx(0.1, abs=0.03) and row["ci_low"] > 0
    assert row["seeds"] == [0, 1, 2] and row["prompts"] == 40 and row["decodes"] == ["greedy", "sampled-1"]
    assert row["exploratory"] and row["primary"] and row["var_decode"] > 0
    # every policy was scored before the design's commit time: each is named
    assert row["scored_before_commit"] == ["a-0", "a-1", "a-2", "b-0", "b-1", "b-2"]
    assert "incomplete: 3 of 5 seeds" in table(rows, 5) and "incomplete" not in table(rows, 3)


def test_report_rows_give_each_arm_s_gain_over_the_start_and_the_difference_relative_to_the_baseline_s():
    scores = synthetic_scores(0.1)
    start = {d: {p: {"reward": cell["reward"] - 0.3, "scores": {}} for p, cell in cells.items()}
             for d, cells in scores["b-0"]["decodes"].items()}  # about 0.3 under b: b's gain is about 0.3
    scores["start"] = {"arm": None, "seed": None, "scored_at": "2026-01-01T00:00:00+00:00", "decodes": start}
    registration = {"design_hash": "abc", "design_commit": None, "design_commit_time": None, "amendments": []}
    (row,) = rows_for(scores, registration, [("a", "b")], target_mde=0.05)
    a = np.mean([c["reward"] for x in ("a-0", "a-1", "a-2") for cells in scores[x]["decodes"].values()
                 for c in cells.values()])
    b = np.mean([c["reward"] for x in ("b-0", "b-1", "b-2") for cells in scores[x]["decodes"].values()
                 for c in cells.values()])
    before = np.mean([c["reward"] for cells in start.values() for c in cells.values()])
    assert row["gain_over_start"] == pytest.approx({"a": a - before, "b": b - before})
    assert row["relative_diff"] == pytest.approx(row["diff"] / (b - before))
    assert row["relative_mde"] == pytest.approx(row["mde"] / (b - before))
    del scores["start"]  # not scored: no gain, no relative figure
    (row,) = rows_for(scores, registration, [("a", "b")])
    assert row["gain_over_start"] == {"a": None, "b": None} and row["relative_diff"] is None


def test_plan_finds_the_cheapest_design_that_reaches_the_target():
    pilot = [{"method": "a", "baseline": "b", "var_seed": 0.0002, "var_prompt": 0.005, "var_cell": 0.07,
              "var_decode": 0.05, "decodes": 1}]
    costs = Costs(tokens_per_response=70, tokens_per_s=1000, train_seconds=60, source="test")
    result = plan(pilot, 0.015, arms=5, costs=costs)
    best = result["cheapest"]
    assert best["worst_mde"] <= 0.015
    cheaper = [o for o in result["cheapest_per_seed_count"] if o["hours"] < best["hours"]]
    assert not cheaper
    assert best["tokens"] == round((5 * best["seeds"] + 1) * best["prompts"] * best["decodes"] * 70)
    unreachable = plan(pilot, 0.001, arms=5, costs=costs)
    assert unreachable["cheapest"] is None and unreachable["smallest_mde_in_grid"]["worst_mde"] > 0.001


def run_cli(*args: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "DO_NOT_TRACK": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", "compare", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def stable(out: Path) -> dict:
    """What a run computed, less when and how fast: every policy's rewards, and the report's rows."""
    scores = {p.stem: json.loads(p.read_text())["decodes"] for p in sorted((out / "scores").glob("*.json"))}
    rows = json.loads((out / "compare.json").read_text())["rows"]
    for row in rows:
        row.pop("scored_before_commit")
    return {"scores": scores, "rows": rows}


@pytest.mark.slow
def test_compare_end_to_end_resumes_after_kill_and_refuses_a_changed_design(tmp_path, capsys):
    design = write(tmp_path / "design.toml", TINY)
    whole = run_cli(str(design), "--out", str(tmp_path / "whole"), "--runner", "none")
    printed, err = whole.communicate(timeout=600)
    assert whole.returncode == 0, err[-2000:]
    progress = [line.split("compare: ", 1)[1] for line in printed.splitlines() if "compare: policy " in line]
    assert [p.split(" (")[0] for p in progress] == ["policy 1 of 4: gdpo-0", "policy 2 of 4: mrtpo-0",
                                                    "policy 3 of 4: gdpo-1", "policy 4 of 4: mrtpo-1"]
    assert all(p.endswith("h left at this run's pace)") for p in progress[1:]), progress

    killed = run_cli(str(design), "--out", str(tmp_path / "killed"), "--runner", "none")
    first_score, deadline = tmp_path / "killed" / "scores" / "gdpo-0.json", time.monotonic() + 600
    while not first_score.is_file() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert killed.poll() is None, "the run ended before the kill"
    os.kill(killed.pid, signal.SIGKILL)  # mid-run: the start policy and gdpo-0 scored, the rest not
    killed.communicate()
    assert not (tmp_path / "killed" / "compare.json").exists()
    for folder, expected in (("killed", "policies scored: 2 of 5; next: mrtpo-0"),
                             ("whole", "policies scored: 5 of 5; complete"), ("none", "not started")):
        assert main(["compare", str(design), "--out", str(tmp_path / folder), "--status"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert any(expected in line for line in lines), lines
        assert not any("reward" in line for line in lines)
    assert lines == [f"{tmp_path / 'none'}: not started (no registration.json)"] and not (tmp_path / "none").exists()
    # the hours left: the finished policy's recorded seconds per stage (one round: no later rounds' sampling)
    spent = policy_seconds(tmp_path / "killed", "gdpo-0")
    assert spent["scoring"] > 0 and spent["training"] > 0 and spent["dev scoring"] > 0
    assert status(load_design(design), tmp_path / "killed")[-1] == (
        f"about {3 * sum(spent.values()) / 3600:.1f} h left: 3 policies x ({spent['scoring']:.0f} s scoring + "
        f"{spent['training']:.0f} s training + {spent['dev scoring']:.0f} s dev scoring; the medians of the 1 "
        "finished here)")
    # resumed, then interrupted (SIGTERM) in seed 1: one line, exit 143, nothing half-written
    interrupted = run_cli(str(design), "--out", str(tmp_path / "killed"), "--runner", "none")
    seed_one = tmp_path / "killed" / "scores" / "gdpo-1.json"
    while not seed_one.is_file() and interrupted.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert interrupted.poll() is None, "the run ended before the interrupt"
    interrupted.send_signal(signal.SIGTERM)
    _, err = interrupted.communicate(timeout=120)
    assert interrupted.returncode == 143 and err.strip().splitlines()[-1] == (
        "tokencredit compare: interrupted; rerun the same command to resume"), err[-2000:]
    resumed = run_cli(str(design), "--out", str(tmp_path / "killed"), "--runner", "none")
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-2000:]
    assert "mrtpo - gdpo" in out and (tmp_path / "killed" / "compare.png").is_file()
    assert stable(tmp_path / "killed") == stable(tmp_path / "whole")

    # the finished run is a pilot: --plan reads its components and its measured speeds and training seconds
    planned = run_cli(str(design), "--out", str(tmp_path / "next"), "--plan", "--pilot", str(tmp_path / "whole"))
    out, err = planned.communicate(timeout=600)
    assert planned.returncode == 0, err[-2000:]
    assert "5 scored policies" in out and "4 trainings" in out and "at this design's 6 held-out prompts" in out

    write(design, TINY.replace("steps = 3", "steps = 4"))
    refused = run_cli(str(design), "--out", str(tmp_path / "whole"), "--runner", "none")
    _, err = refused.communicate(timeout=600)
    assert refused.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "changes more than adding arms" in lines[0], err


def test_plan_command_sizes_the_design_from_a_pilots_rows(tmp_path, capsys):
    pilot = tmp_path / "rows.json"
    pilot.write_text(json.dumps([{"method": "mrtpo", "baseline": "gdpo", "design_hash": "abc", "var_seed": 0.0,
                                  "var_prompt": 0.005, "var_cell": 0.07, "decodes": ["greedy"], "seeds": [0, 1, 2],
                                  "prompts": 256}]))
    design = write(tmp_path / "d.toml", TINY)
    args = ["compare", str(design), "--out", str(tmp_path / "x"), "--plan", "--pilot", str(pilot),
            "--tokens-per-s", "40", "--tokens-per-response", "74", "--train-seconds", "100"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "cheapest: " in out and "at this design's 6 held-out prompts x 2 decodes:" in out
    # a seed component estimated at 0 from 3 seeds is planned for at its upper bound too: more seeds
    lines = out.splitlines()
    cautious = next(i for i, line in enumerate(lines) if line.startswith("cautious, each seed component at its 80%"))
    seeds_of = [int(line.split(" seeds x ")[0].removeprefix("cheapest: ")) for line in (lines[1], lines[cautious + 1])]
    assert seeds_of[1] > seeds_of[0], out
    assert not (tmp_path / "x").exists()  # a plan registers and scores nothing
    assert main([*args, "--pilot-design", "other"]) == 2
    assert "has no row for mrtpo - gdpo" in capsys.readouterr().err



def test_the_shipped_plan_command_prints_what_compare_md_shows(tmp_path):
    """`--from-shipped` sizes a design from the rows the project ships, with one flag; compare.md shows the command
    and what it prints (rendered from the same rows), and the plan writes nothing."""
    page = (ROOT / "docs" / "experiments" / "compare.md").read_text()
    command, shown = re.search(r"<!-- tested-by: tests/test_compare\.py::"
                               r"test_the_shipped_plan_command_prints_what_compare_md_shows -->\n```bash\n(.*?)\n```"
                               r"\n\n```text\n(.*?)\n```", page, flags=re.S).groups()
    args = command.split()[2:]
    assert args[args.index("--out") + 1] == "runs/powered" and "--from-shipped" in args
    args[args.index("--out") + 1] = str(tmp_path / "powered")
    planned = run_cli(*args, cwd=ROOT)
    out, err = planned.communicate(timeout=600)
    assert planned.returncode == 0, err[-2000:]
    assert out.strip() == shown.strip()
    assert "349.9 tokens/s" in out and "components: mc - gdpo_tree from powered (4 seeds x 1024 prompts" in out
    assert not (tmp_path / "powered").exists()
    both = run_cli(*args, "--pilot", str(tmp_path), cwd=ROOT)
    _, err = both.communicate(timeout=600)
    assert both.returncode == 2 and err.strip().splitlines() == [
        "tokencredit compare: error: --plan: give --pilot or --from-shipped, not both"], err

EVERY_ARM = f"""
[prompts]
file = "{PROMPTS}"
train_limit = 6
heldout_limit = 4

[pools.flat]
n = 4
temperature = 1.0
max_new_tokens = 12
seed = 7
credit = ["gdpo", "mrtpo"]

[pools.tree]
tree = [2, 2]
temperature = 1.0
max_new_tokens = 12
seed = 7
credit = ["gdpo", "mc"]

[arms.gdpo]
pool = "flat"

[arms.gdpo_tree]
pool = "tree"
advantage = "gdpo"

[arms.mc]
pool = "tree"
advantage = "mc"

[arms.rs]
pool = "flat"
objective = "rs"

[arms.sft]
pool = "flat"
objective = "sft"
advantage = "mrtpo:0.5,gdpo:0.5"

[training]
seeds = [0, 1]
steps = 2
batch_size = 4
lr = 5e-2

[scoring]
sampled = 1
max_new_tokens = 12

[analysis]
comparisons = [["mc", "gdpo_tree"], ["mc", "gdpo"], ["rs", "gdpo"], ["sft", "gdpo"]]
"""


@pytest.mark.slow
def test_compare_trains_every_kind_of_arm_and_an_arm_with_nothing_to_train_on_is_the_base(tmp_path):
    design = write(tmp_path / "design.toml", EVERY_ARM)
    run = run_cli(str(design), "--out", str(tmp_path / "run"), "--runner", "none")
    out, err = run.communicate(timeout=900)
    assert run.returncode == 0, err[-2000:]
    rows = json.loads((tmp_path / "run" / "compare.json").read_text())["rows"]
    assert [(r["method"], r["baseline"]) for r in rows] == [("mc", "gdpo_tree"), ("mc", "gdpo"), ("rs", "gdpo"),
                                                             ("sft", "gdpo")]
    scores = {p.stem: json.loads(p.read_text())["decodes"] for p in (tmp_path / "run" / "scores").glob("*.json")}
    assert len(scores) == 1 + 5 * 2
    trained = {p.parent.name for p in (tmp_path / "run" / "train").glob("*/final")}
    assert {"gdpo_tree-0", "mc-0", "gdpo-0"} <= trained  # the tree pool's arms and the flat one trained
    markers = sorted((tmp_path / "run" / "train").glob("*/untrained.json"))
    assert markers  # the tiny policy passes every reward of no pool response: rejection sampling has no data
    for marker in markers:  # nothing to train on: the base policy
        assert "no response has tokens to train on" in json.loads(marker.read_text())["reason"]
        assert scores[marker.parent.name] == scores["start"]


def test_status_shows_where_each_pools_annotate_run_spent_its_time(tmp_path):
    """`compare --status` prints each pool's wall times and stage seconds from its manifest (the pool annotated here
    by the product's annotate stage, as `compare` does), without reading a reward."""
    from tokencredit.flows.compare import annotate_pool

    design = load_design(write(tmp_path / "design.toml", TINY.replace("train_limit = 8", "train_limit = 2")))
    register(design, tmp_path / "out", design_inputs(design))
    annotate_pool(design, "flat", tmp_path / "out", runner="none")
    manifest = json.loads((tmp_path / "out" / "pools" / "flat" / "manifest.json").read_text())
    lines = status(design, tmp_path / "out")
    [line] = [line for line in lines if line.startswith("pool flat: ")]
    assert re.fullmatch(r"pool flat: startup \d+\.\d s, (engine start \d+\.\d s, )?sampling \d+\.\d s, "
                        r"total \d+\.\d s; shards: sample \d+\.\d s, verify \d+\.\d s, credit_gdpo \d+\.\d s, "
                        r"credit_mrtpo \d+\.\d s, credit_rows \d+\.\d s, write \d+\.\d s", line), line
    assert f"credit_mrtpo {manifest['stats']['seconds']['credit_mrtpo']:.1f} s" in line
    assert not any("reward" in line for line in lines)


@pytest.mark.parametrize("value, expected", [("0", "0"), ('"2"', "'2'"), ("true", "True"), ("1.5", "1.5")])
def test_a_bad_number_of_rounds_is_refused_before_any_work(tmp_path, capsys, value, expected):
    design = write(tmp_path / "d.toml", TINY.replace("lora = true", f"lora = true\nrounds = {value}"))
    assert main(["compare", str(design), "--out", str(tmp_path / "out"), "--runner", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tokencredit compare: error: design [training] rounds: {expected}; expected an integer >= 1"]
    assert not (tmp_path / "out").exists()


def test_one_round_is_the_design_as_before_rounds_and_more_are_a_changed_design(tmp_path):
    """Without the key a design is one round and registers the content it did before rounds existed; a rerun that
    adds rounds changes more than arms and is refused."""
    before = load_design(write(tmp_path / "d.toml", TINY))
    assert before.rounds == 1 and "rounds" not in before.training
    registered(tmp_path / "d.toml", tmp_path / "out")
    assert load_design(write(tmp_path / "one.toml", TINY.replace("lora = true", "lora = true\nrounds = 1"))).rounds == 1
    write(tmp_path / "d.toml", TINY.replace("lora = true", "lora = true\nrounds = 3"))
    assert load_design(tmp_path / "d.toml").rounds == 3
    with pytest.raises(ValueError, match="changes more than adding arms"):
        registered(tmp_path / "d.toml", tmp_path / "out")


def test_plan_prices_each_round_s_training_sampling_and_dev_decodes():
    pilot = [{"method": "mrtpo", "baseline": "gdpo", "var_seed": 1e-4, "var_prompt": 0.01, "var_cell": 0.05,
              "decodes": 1}]
    costs = Costs(tokens_per_response=50, tokens_per_s=100, train_seconds=600, source="test")
    fixed = {"seeds": 4, "prompts": 512, "decodes": 2}
    one = plan(pilot, 1.0, arms=3, costs=costs, fixed=fixed)["cheapest"]
    three = plan(pilot, 1.0, arms=3, costs=costs, fixed=fixed, rounds=3, round_responses=256)["cheapest"]
    assert one["hours"] == pytest.approx(((3 * 4 + 1) * 512 * 2 * 50 / 100 + 3 * 4 * 600) / 3600)
    extra_tokens = 3 * 4 * 2 * 256 * 50  # 2 later rounds of 256 responses per (arm, seed)
    assert three["tokens"] == one["tokens"] + extra_tokens
    assert three["hours"] == pytest.approx(one["hours"] + (extra_tokens / 100 + 3 * 4 * 2 * 600) / 3600)
    assert three["mde"] == one["mde"]  # rounds change what the policies are, not how they are measured
    dev = plan(pilot, 1.0, arms=3, costs=costs, fixed=fixed, rounds=3, round_responses=256, dev_prompts=64)["cheapest"]
    dev_tokens = (3 * 4 * 3 + 1) * 64 * 50  # the start and each (arm, seed) after each of 3 rounds, greedily
    assert dev["tokens"] == three["tokens"] + dev_tokens
    assert dev["hours"] == pytest.approx(three["hours"] + dev_tokens / 100 / 3600)


ROUNDS = TINY.replace("train_limit = 8", "train_limit = 4").replace("heldout_limit = 6", "heldout_limit = 4").replace(
    "sampled = 1", "sampled = 0").replace("lora = true", "lora = true\nrounds = 2")


def test_a_later_round_computes_only_the_credit_its_arm_trains_on(tmp_path):
    """The flat pool computes GDPO and MRTPO; an arm's own later rounds compute GDPO and the arm's advantage alone
    (an MRTPO replay for the GDPO or RS arm would train nothing)."""
    from tokencredit.pipeline.compare.design import load_design
    from tokencredit.pipeline.compare.run import rounds_config

    design = load_design(write(tmp_path / "design.toml", ROUNDS + EXTRA_ARM))
    kinds = {name: rounds_config(design, arm, 0, tmp_path / "pool", tmp_path / "out")[0].annotate.credit.kinds
             for name, arm in design.arms.items()}
    assert kinds == {"gdpo": ("gdpo",), "mrtpo": ("gdpo", "mrtpo"), "rs": ("gdpo",)}


@pytest.mark.slow
def test_each_arm_trains_its_rounds_on_pools_of_its_own_policy_and_its_last_policy_is_scored(tmp_path):
    """With [training] rounds = 2, killed (kill -9) in gdpo-0's second round and resumed."""
    design = write(tmp_path / "design.toml", ROUNDS)
    killed = run_cli(str(design), "--out", str(tmp_path / "run"), "--runner", "none")
    shards, deadline = tmp_path / "run" / "train" / "gdpo-0" / "round-001" / "run" / "_shards", time.monotonic() + 600
    while not list(shards.glob("shard-*.json")) and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert killed.poll() is None, "the run ended before the kill"
    os.kill(killed.pid, signal.SIGKILL)  # in gdpo-0's second annotate run: one shard of its 2 written
    killed.communicate()
    assert not (tmp_path / "run" / "scores" / "gdpo-0.json").exists()
    run = run_cli(str(design), "--out", str(tmp_path / "run"), "--runner", "none")
    printed, err = run.communicate(timeout=900)
    assert run.returncode == 0, err[-2000:]
    assert "annotate pool flat" not in printed and "round 1 of 2" not in printed.split("rounds mrtpo seed 0")[0]
    pool = json.loads((tmp_path / "run" / "pools" / "flat" / "manifest.json").read_text())
    for label in ("gdpo-0", "mrtpo-0", "gdpo-1", "mrtpo-1"):
        folder = tmp_path / "run" / "train" / label
        assert not (folder / "round-000" / "run").exists()  # round 0 trains on the shared pool
        first = json.loads((folder / "round-000" / "checkpoint" / "final" / "train_config.json").read_text())
        assert first["data"] == str(tmp_path / "run" / "pools" / "flat") and first["model"] is None
        manifest = json.loads((folder / "round-001" / "run" / "manifest.json").read_text())
        assert manifest["complete"] and manifest["config"]["model"] == str(folder / "round-000" / "policy")
        ids = ds.dataset(folder / "round-001" / "run" / "responses").to_table(columns=["response_id"]).column(0)
        ids = ids.to_pylist()
        assert len(ids) == len(set(ids)) == 4 * 4  # no duplicate, no gap
        assert manifest["config"]["sampling"]["seed"] == pool["config"]["sampling"]["seed"] + 1
        own = ["gdpo"] if label.startswith("gdpo") else ["gdpo", "mrtpo"]  # the credit the arm trains on alone
        assert manifest["config"]["credit"] == {**pool["config"]["credit"], "kinds": own}
        second = json.loads((folder / "round-001" / "checkpoint" / "final" / "train_config.json").read_text())
        assert second["model"] == str(folder / "round-000" / "policy") and second["seed"] == first["seed"] + 1
        assert (folder / "round-001" / "policy" / "model.safetensors").is_file()
    scores = {p.stem: json.loads(p.read_text())["decodes"] for p in (tmp_path / "run" / "scores").glob("*.json")}
    assert sorted(scores) == ["gdpo-0", "gdpo-1", "mrtpo-0", "mrtpo-1", "start"]
    assert "mrtpo - gdpo" in printed
    assert "rounds gdpo seed 0" in printed and "round 2 of 2: annotate" in printed


OLDER_PROMPT_KEYS = {"file", "format", "train_split", "heldout_split", "train_limit", "heldout_limit", "verifier"}


@pytest.mark.parametrize("value, expected", [("0", "0"), ('"4"', "'4'"), ("true", "True"), ("2.5", "2.5")])
def test_a_bad_dev_limit_is_refused_in_one_line(tmp_path, value, expected):
    with pytest.raises(ValueError, match=rf"^design \[prompts\] dev_limit: {re.escape(expected)}; expected an "
                                         r"integer >= 1$"):
        load_design(write(tmp_path / "d.toml", TINY.replace("dev_limit = 4", f"dev_limit = {value}")))


def test_a_folder_registered_before_dev_prompts_existed_accepts_its_design_and_an_amendment(tmp_path):
    """A design not naming dev_limit registers the content the older code registered (its [prompts] keys), so a
    registration.json written then accepts the design, and an added arm is an amendment, not a changed design."""
    older = TINY.replace("dev_limit = 4\n", "")
    design = load_design(write(tmp_path / "d.toml", older))
    assert design.dev_limit == 64 and "dev_limit" not in design.prompts
    out = tmp_path / "out"
    out.mkdir()
    registration = {"design_path": "d.toml", "design_hash": "0" * 64, "design_commit": None,
                    "design_commit_time": None, "registered_at": "2026-12-07T19:22:27+00:00",
                    "arms": ["gdpo", "mrtpo"], "content": {}, "amendments": [], "inputs": design_inputs(design)}
    from tokencredit.pipeline.compare.design import without_arms
    from tokencredit.pipeline.compare.registry import canonical

    registration["content"] = json.loads(canonical(without_arms(design, set())))
    assert set(registration["content"]["prompts"]) == OLDER_PROMPT_KEYS  # what the older code recorded
    (out / "registration.json").write_text(json.dumps(registration))
    amended = registered(write(tmp_path / "d.toml", older + EXTRA_ARM), out)
    assert [a["arms"] for a in amended["amendments"]] == [["rs"]]
    write(tmp_path / "d.toml", older.replace("heldout_limit = 6", "heldout_limit = 6\ndev_limit = 8") + EXTRA_ARM)
    with pytest.raises(ValueError, match="changes more than adding arms"):  # naming it changes the design
        registered(tmp_path / "d.toml", out)


def test_the_dev_prompts_are_train_records_no_pool_samples_and_never_held_out(tmp_path):
    from tokencredit.pipeline.annotate import load_prompt_set
    from tokencredit.pipeline.compare.run import annotate_config, dev_records, heldout_records

    design = load_design(write(tmp_path / "d.toml", TINY.replace("dev_limit = 4\n", "")))
    dev = [r.id for r in dev_records(design)]
    pool = [r.id for r in load_prompt_set(annotate_config(design, design.pools["flat"], "train", 8))[0]]
    held_out = [r.id for r in heldout_records(design)]
    assert len(dev) == 64 == len(set(dev)) and dev[0] == "train-008"  # the default: the 64 after train_limit
    assert not set(dev) & set(pool) and not set(dev) & set(held_out) and len(pool) == 8
    fewer = load_design(write(tmp_path / "d.toml", TINY.replace("dev_limit = 4", "dev_limit = 1000")))
    assert [r.id for r in dev_records(fewer)] == [f"train-{i:03d}" for i in range(8, 256)]  # all that is left
    every = load_design(write(tmp_path / "d.toml", TINY.replace("train_limit = 8\n", "").replace("dev_limit = 4\n",
                                                                                                "")))
    assert dev_records(every) == []  # every train record is in the pool: no dev prompt
    with pytest.raises(ValueError, match=r"^design \[prompts\] dev_limit: 4; the train split 'train' of .* has no "
                                         r"record after the first train_limit = None per task"):
        dev_records(load_design(write(tmp_path / "d.toml", TINY.replace("train_limit = 8\n", ""))))


def dev_result(arm, seed, r, rewards: dict) -> dict:
    return {"arm": arm, "seed": seed, "round": r, "decodes": {"greedy": {p: {"reward": v, "scores": {}}
                                                                          for p, v in rewards.items()}}}


def test_learning_curve_rows_are_each_arm_s_mean_with_the_variance_components_interval():
    """With one seed (the rounds pilot's, formerly tested in test_closed_loop.py) a gain's interval is the paired t
    interval over prompts; with more, the variance-components interval of the held-out rows."""
    from scipy import stats

    from tokencredit.pipeline.compare import analysis
    from tokencredit.pipeline.compare.curves import curve_rows, curve_table

    rng = np.random.default_rng(0)
    start = {f"p{i}": float(v) for i, v in enumerate(rng.uniform(0, 1, 40))}
    cells = {s: {p: v + float(rng.normal(0.1, 0.2)) for p, v in start.items()} for s in (0, 1, 2)}
    results = [{"arm": None, "seed": None, **dev_result(None, None, 0, start)},
               *(dev_result("gdpo", s, 1, cells[s]) for s in (0, 1, 2)),
               dev_result("gdpo", 0, 2, {**cells[0], "unscored": 1.0})]  # a prompt the start did not score
    rows = curve_rows(results)
    assert [(r["arm"], r["round"], r["seeds"]) for r in rows] == [("start", 0, []), ("gdpo", 1, [0, 1, 2]),
                                                                   ("gdpo", 2, [0])]
    matrix = np.array([[cells[s][p] for p in sorted(start)] for s in (0, 1, 2)])
    expected = analysis.intervals(matrix)
    assert rows[1]["mean"] == pytest.approx(matrix.mean())
    assert [rows[1]["ci_low"], rows[1]["ci_high"]] == pytest.approx([expected["ci_low"], expected["ci_high"]])
    assert rows[1]["gain"] == pytest.approx(matrix.mean() - np.mean(list(start.values())))
    # one seed (the rounds pilot's): the gain's interval is the paired t interval over prompts that scipy gives
    diffs = [cells[0][p] - start[p] for p in start]
    low, high = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    assert rows[2]["prompts"] == 40 and rows[2]["gain"] == pytest.approx(np.mean(diffs))
    assert [rows[2]["gain_ci_low"], rows[2]["gain_ci_high"]] == pytest.approx([low, high])
    assert rows[2]["per_seed"] == {"0": pytest.approx(np.mean([cells[0][p] for p in start]))}
    assert len(curve_table(rows)) == 2 + 3


# imported by the compare process (PYTHONPATH): kill -9 once gdpo-0's second round is scored on the dev prompts, before
# the first round's merged policy is deleted (the one moment between two writes a poll cannot catch)
KILL_BEFORE_DELETING = """
import os, signal
from pathlib import Path

import tokencredit.pipeline.rounds as rounds

real = rounds.prune_policies


def prune_policies(out, r):
    if r == 1 and (Path(out) / "round-000" / "policy").is_dir():
        os.kill(os.getpid(), signal.SIGKILL)
    real(out, r)


rounds.prune_policies = prune_policies
"""


def dev_scores(out: Path) -> dict:
    """Every dev score's rewards, by LABEL (start, ARM-SEED/round-NNN)."""
    dev = out / "scores" / "dev"
    return {str(p.relative_to(dev).with_suffix("")): json.loads(p.read_text())["decodes"]
            for p in sorted(dev.rglob("*.json"))}


def as_older_code_left_it(out: Path) -> None:
    """`out` as compare wrote it before dev prompts existed: no dev score, every round's merged policy kept (round
    0's merged again from its checkpoint, as the rounds flow merged it)."""
    from tokencredit.pipeline.rounds import PRUNED
    from tokencredit.pipeline.scoring import load_merged, save_policy

    shutil.rmtree(out / "scores" / "dev")
    (out / "learning_curve.png").unlink()
    for marker in (out / "train").glob(f"*/round-000/{PRUNED}"):
        save_policy(load_merged(None, marker.parent / "checkpoint" / "final"), marker.parent / "policy")
        marker.unlink()


@pytest.mark.slow
def test_each_round_is_scored_on_dev_prompts_and_the_round_before_s_policy_is_deleted(tmp_path):
    """Two rounds: the start and every (arm, seed) after each round scored on the dev prompts, the first round's
    merged policy deleted (its checkpoint kept), the learning curves reported; a kill -9 between a dev score and
    that deletion resumes to the uninterrupted run's scores and rows, and so does a folder the older code left
    (its kept policies scored on the dev prompts when it resumes)."""
    design = write(tmp_path / "design.toml", ROUNDS.replace('device = "cpu"', 'device = "cpu"\nbackend = '
                                                                               '"transformers"'))
    whole = run_cli(str(design), "--out", str(tmp_path / "whole"), "--runner", "none")
    printed, err = whole.communicate(timeout=900)
    assert whole.returncode == 0, err[-2000:]
    labels = ["start"] + [f"{arm}-{seed}/round-00{r}" for arm in ("gdpo", "mrtpo") for seed in (0, 1) for r in (0, 1)]
    scores = dev_scores(tmp_path / "whole")
    assert sorted(scores) == sorted(labels)
    assert {p for s in scores.values() for p in s["greedy"]} == {f"train-{i:03d}" for i in range(4, 8)}
    for label in ("gdpo-0", "mrtpo-1"):
        folder = tmp_path / "whole" / "train" / label
        assert not (folder / "round-000" / "policy").exists()
        assert (folder / "round-000" / "checkpoint" / "final").is_dir()  # the adapter stays
        assert (folder / "round-001" / "policy" / "model.safetensors").is_file()  # the last: scored on held-out
    curve = json.loads((tmp_path / "whole" / "compare.json").read_text())["learning_curve"]
    assert [(r["arm"], r["round"], r["seeds"]) for r in curve] == [
        ("start", 0, []), ("gdpo", 1, [0, 1]), ("gdpo", 2, [0, 1]), ("mrtpo", 1, [0, 1]), ("mrtpo", 2, [0, 1])]
    assert (tmp_path / "whole" / "learning_curve.png").is_file() and "| gdpo | 2 | " in printed

    hook = tmp_path / "hook"
    write(hook.mkdir() or hook / "sitecustomize.py", KILL_BEFORE_DELETING)
    killed = run_cli(str(design), "--out", str(tmp_path / "killed"), "--runner", "none", env={"PYTHONPATH": str(hook)})
    killed.communicate(timeout=900)
    assert killed.returncode == -signal.SIGKILL
    first = tmp_path / "killed" / "train" / "gdpo-0"
    assert (tmp_path / "killed" / "scores" / "dev" / "gdpo-0" / "round-001.json").is_file()
    assert (first / "round-000" / "policy").is_dir()  # killed before its deletion
    resumed = run_cli(str(design), "--out", str(tmp_path / "killed"), "--runner", "none")
    _, err = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, err[-2000:]
    assert not (first / "round-000" / "policy").exists()
    assert dev_scores(tmp_path / "killed") == scores and stable(tmp_path / "killed") == stable(tmp_path / "whole")

    as_older_code_left_it(tmp_path / "whole")
    backfilled = run_cli(str(design), "--out", str(tmp_path / "whole"), "--runner", "none")
    printed, err = backfilled.communicate(timeout=900)
    assert backfilled.returncode == 0, err[-2000:]
    assert "round 1 of 2: train" not in printed and "compare: score gdpo-0\n" not in printed  # nothing retrained
    assert dev_scores(tmp_path / "whole") == scores
    assert not list((tmp_path / "whole" / "train").glob("*/round-000/policy"))


def test_dev_only_trains_the_arms_and_scores_dev_prompts_alone(tmp_path, capsys):
    """`--dev-only` (a pilot): one round, so one dev point per (arm, seed); no held-out record is scored, and no file
    the run writes nor its log names one; `--report-only` then reports the learning curves."""
    design = write(tmp_path / "d.toml", TINY.replace('device = "cpu"', 'device = "cpu"\nbackend = "transformers"'))
    run = run_cli(str(design), "--out", str(tmp_path / "run"), "--runner", "none", "--dev-only")
    printed, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-2000:]
    out = tmp_path / "run"
    assert not list((out / "scores").glob("*.json"))  # no held-out score, not even the start policy's
    assert sorted(dev_scores(out)) == ["gdpo-0/round-000", "gdpo-1/round-000", "mrtpo-0/round-000",
                                       "mrtpo-1/round-000", "start"]
    held_out = [json.loads(line)["id"] for line in PROMPTS.read_text().splitlines()
                if json.loads(line)["split"] == "test"]
    written = "".join(p.read_text() for p in out.rglob("*") if p.suffix in (".json", ".jsonl", ".md"))
    written += printed + err + "".join(ds.dataset(out / "pools" / "flat" / "responses").to_table(
        columns=["group_id"]).column(0).to_pylist())
    assert "train-008" in written and not [i for i in held_out if i in written]
    assert main(["compare", str(design), "--out", str(out), "--report-only"]) == 0
    shown = capsys.readouterr().out
    assert "learning curves (dev prompts, greedy):" in shown and "| mrtpo | 1 | " in shown
    assert (out / "learning_curve.png").is_file() and not (out / "compare.png").exists()  # no held-out row
    assert "dev points scored: 5 of 5 (the start, and each arm and seed after each round)" in status(
        load_design(design), out)
    no_dev = write(tmp_path / "none.toml", TINY.replace("train_limit = 8\n", "").replace("dev_limit = 4\n", ""))
    assert main(["compare", str(no_dev), "--out", str(tmp_path / "none"), "--dev-only"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "tokencredit compare: error: --dev-only: the design has no dev prompts (the train split's records after "
        "[prompts] train_limit = None per task)"]
    assert not (tmp_path / "none").exists()


def test_the_rounds_pilot_design_runs_the_regime_of_the_pilot_s_rows():
    """bench/compare_designs/pilot_rounds.toml (run with --dev-only) replaced bench/pilot_rounds.py: the regime of its
    GDPO arm is the one compare_pilot.json's first arm records."""
    design = load_design(ROOT / "bench" / "compare_designs" / "pilot_rounds.toml")
    regime = json.loads((ROOT / "bench" / "results" / "compare_pilot.json").read_text())["arms"][0]["regime"]
    pool = design.pools[design.arms["gdpo"].pool]
    assert (design.prompts["train_limit"], pool.n, pool.temperature, pool.max_new_tokens) == (
        regime["train_prompts"], regime["n"], regime["temperature"], regime["max_new_tokens"])
    training = design.training
    assert (training["steps"], training["batch_size"], training["lr"], training["lora"], design.rounds) == (
        regime["steps"], regime["batch_size"], regime["lr"], regime["lora"], regime["rounds_done"])
    assert design.arms["gdpo"].advantage == regime["advantage"] and pool.credit == (regime["credit"],)
    assert design.dev_limit == 64 and design.prompts["file"].endswith("closed_loop_prompts/prompts.jsonl")
