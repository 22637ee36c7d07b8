"""`tokencredit rounds`: rounds of annotate -> train from the policy the round before trained, end to end on the
tiny policy (every round's folders, each policy's dev reward), resumed after kill -9 to the rows of an uninterrupted
run; settings that cannot run or that differ from the folder's are refused with one line before any work."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from tokencredit.flows.cli import main
from tokencredit.pipeline.config import AnnotateConfig
from tokencredit.pipeline.rounds import RoundsConfig, check_settings

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl"
# 2 rounds of 8 train prompts x 4 responses in 4 shards, 3 LoRA steps each, 6 dev prompts: ~15 s on 2 cores
TINY = ["--prompts", str(PROMPTS), "--limit", "8", "--n", "4", "--max-new-tokens", "12", "--credit", "gdpo",
        "--shard-size", "2", "--rounds", "2", "--advantage", "gdpo", "--steps", "3", "--batch-size", "4",
        "--lr", "5e-2", "--lora", "--dev-limit", "6", "--runner", "none"]
DEADLINE_S = 600


def run_cli(out: Path, *extra: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "DO_NOT_TRACK": "1"}
    return subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", "rounds", "--out", str(out), *TINY,
                             *extra], env=env, text=True, **popen)


def rows(out: Path, r: int, table: str) -> list[dict]:
    """Round r's rows of `table`, the policy a response was sampled with named relative to OUT."""
    found = ds.dataset(out / f"round-{r:03d}" / "run" / table).to_table().to_pylist()
    for row in found:
        if row.get("model"):
            row["model"] = row["model"].replace(str(out), "OUT")
    return sorted(found, key=lambda row: json.dumps(row, default=str))


def dev(out: Path) -> dict:
    """Each scored policy's per-prompt dev rewards."""
    return {p.parent.name: json.loads(p.read_text())["rewards"] for p in sorted(out.glob("*/dev.json"))}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("rounds") / "whole"
    whole = run_cli(out, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    printed, err = whole.communicate(timeout=DEADLINE_S)
    assert whole.returncode == 0, err[-2000:]
    return out, printed


@pytest.mark.slow
def test_two_rounds_each_sample_from_the_policy_the_round_before_trained(uninterrupted):
    out, printed = uninterrupted
    for r in (0, 1):
        folder = out / f"round-{r:03d}"
        manifest = json.loads((folder / "run" / "manifest.json").read_text())
        assert manifest["complete"] and manifest["totals"]["responses"] == 8 * 4
        start = str(out / "round-000" / "policy") if r else None  # round 0: the shipped policy
        assert manifest["config"]["model"] == start and manifest["config"]["sampling"]["seed"] == r
        assert (folder / "checkpoint" / "final" / "adapter_config.json").is_file()
        trained = json.loads((folder / "checkpoint" / "final" / "train_config.json").read_text())
        assert trained["model"] == start and trained["seed"] == r and trained["data"] == str(folder / "run")
        assert (folder / "policy" / "model.safetensors").is_file()
    scored = [json.loads((out / name / "dev.json").read_text()) for name in ("start", "round-000", "round-001")]
    assert [s["policy"] for s in scored] == [None, str(out / "round-000" / "policy"), str(out / "round-001" / "policy")]
    assert all(s["prompts"] == 6 and len(s["rewards"]) == 6 for s in scored)
    assert all(abs(s["reward"] - sum(s["rewards"].values()) / 6) < 1e-12 for s in scored)
    assert scored[1]["rewards"] != scored[0]["rewards"] or scored[2]["rewards"] != scored[0]["rewards"]
    progress = [line.split("rounds: ", 1)[1] for line in printed.splitlines() if "] rounds: " in line]
    assert [line.split(":")[0] for line in progress] == ["start policy", "round 1 of 2", "round 1 of 2",
                                                        "round 1 of 2", "round 2 of 2", "round 2 of 2",
                                                        "round 2 of 2"]
    assert progress[3].startswith("round 1 of 2: dev reward ") and progress[3].endswith("over the start policy)")
    assert f"policy after 2 rounds: {out / 'round-001' / 'policy'}" in printed


@pytest.mark.slow
def test_rounds_killed_in_round_two_resume_to_the_uninterrupted_rows(uninterrupted, tmp_path):
    whole, _ = uninterrupted
    out = tmp_path / "killed"
    killed = run_cli(out, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shards = out / "round-001" / "run" / "_shards"
    deadline = time.monotonic() + DEADLINE_S
    while not list(shards.glob("shard-*.json")) and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert killed.poll() is None, "the run ended before the kill"
    os.kill(killed.pid, signal.SIGKILL)  # in round 2's annotate run: one shard of its 4 written
    assert killed.wait(timeout=60) == -signal.SIGKILL
    assert (out / "round-000" / "dev.json").is_file() and not (out / "round-001" / "dev.json").exists()
    resumed = run_cli(out, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    printed, err = resumed.communicate(timeout=DEADLINE_S)
    assert resumed.returncode == 0, err[-2000:]
    assert "round 1 of 2: annotate" not in printed and "round 2 of 2: annotate" in printed  # round 1 finished: kept
    for r in (0, 1):
        responses = rows(out, r, "responses")
        assert len({row["response_id"] for row in responses}) == len(responses) == 8 * 4  # no duplicate, no gap
        assert responses == rows(whole, r, "responses") and rows(out, r, "credits") == rows(whole, r, "credits")
    assert dev(out) == dev(whole)


def test_rounds_whose_dev_prompts_are_trained_on_are_refused_in_one_line(tmp_path, capsys):
    assert main(["rounds", "--out", str(tmp_path / "out"), "--split", "test", "--dev-split", "test"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tokencredit rounds: error: --split test --dev-split test: the dev prompts would be trained on; "
                   "give the rounds and the dev prompts different splits"]
    assert not (tmp_path / "out").exists()


def test_a_folder_of_rounds_refuses_other_settings_but_takes_more_rounds(tmp_path):
    from tokencredit.pipeline.train.trainer import TrainConfig

    def config(rounds=2, steps=3, seed=0):
        return RoundsConfig(annotate=AnnotateConfig(prompts=str(PROMPTS), split="train"), rounds=rounds,
                            train=TrainConfig(data="", out="", advantage="gdpo", steps=steps, lora=True, seed=seed))

    check_settings(config(), tmp_path)
    check_settings(config(rounds=5), tmp_path)  # more rounds continue the same ones
    with pytest.raises(ValueError, match=r"holds rounds run with other settings \(train steps: 3, now 4\)"):
        check_settings(config(steps=4), tmp_path)
    with pytest.raises(ValueError, match=r"\(train seed: 0, now 1\)"):
        check_settings(config(seed=1), tmp_path)
    with pytest.raises(ValueError, match=r"rounds: 0; expected an integer >= 1"):
        config(rounds=0)
