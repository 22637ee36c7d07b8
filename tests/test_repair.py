"""Prefix repair on the shipped tiny policy, end to end: pairs written, each repair re-verified, a killed run
resumed to the same pairs, the Prefect flow, and the pairs training one step of TRL's DPOTrainer."""
from __future__ import annotations

import json
import math
import os
import re

import pyarrow.parquet as pq
import pytest

from tokencredit import verifiers
from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
from tokencredit.flows.cli import main
from tokencredit.pipeline.dataset.export import run_records
from tokencredit.pipeline.credit.penalty import penalty_cut
from tokencredit.pipeline.repair import PAIRS, RepairConfig, is_repair, run_repair
from tokencredit.pipeline.config import SamplingConfig

CONFIG = RepairConfig(n=3, shard_size=4, seed=1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("repair") / "run"
    run_annotation(AnnotateConfig(limit=3, tasks=("instructions", "tools"),
                                  sampling=SamplingConfig(n=4, max_new_tokens=40)), str(out), progress=False)
    return out


@pytest.fixture(scope="module")
def repaired(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("repaired") / "pairs"
    # the transformers sampler, which CONFIG's runs below use (auto would take the engine where installed)
    code = main(["repair", str(run), "--out", str(out), "--n", "3", "--shard-size", "4", "--seed", "1",
                 "--runner", "none", "--backend", "transformers"])
    assert code == 0
    return out


def pairs(out) -> list[dict]:
    return sorted(pq.read_table(out / "pairs", schema=PAIRS).to_pylist(), key=lambda r: r["pair_id"])


def test_the_cut_is_the_largest_penalty_and_uniform_credit_cuts_at_the_start():
    assert penalty_cut([0.1, -0.4, -0.9, -0.9, 0.3]) == 2
    assert penalty_cut([-0.2] * 5) == 0
    assert is_repair([0.0, 1.0, 0.5], [1.0, 1.0, 0.5], 0) and not is_repair([0.0, 1.0], [1.0, 0.0], 0)


def test_repair_writes_pairs_whose_chosen_fixes_the_reward(run, repaired):
    rows = pairs(repaired)
    assert rows, "the tiny policy repairs some failed pairs"
    records, _, _ = run_records(run)
    for row in rows:
        k = row["constraint_index"] if row["constraint_index"] is not None else row["reward_names"].index(row["reward"])
        scores = [s.score for s in verifiers.verify(records[row["group_id"]], row["chosen"])]
        assert scores == pytest.approx(row["chosen_rewards"]) and is_repair(row["rejected_rewards"], scores, k)
        assert row["rejected_rewards"][k] < 1 and row["chosen"] != row["rejected"]
        cut = row["cut_position"]
        assert row["chosen_token_ids"][:cut] == row["rejected_token_ids"][:cut]  # a minimal edit: same prefix
        assert row["chosen"].startswith(row["rejected"][:row["cut_char"]])
    summary = json.loads((repaired / "repair.json").read_text())
    assert summary["pairs_written"] == len(rows)
    for reward, c in summary["by_reward"].items():
        assert c["resamples"] == CONFIG.n * c["failures"] and 0 <= c["repair_rate"] <= 1
        assert c["share_repaired"] == pytest.approx(c["failures_repaired"] / c["failures"])
        assert c["repair_rate"] == pytest.approx(c["repairs"] / c["resamples"])
        assert sum(r["reward"] == reward for r in rows) <= c["repairs"]


def test_the_cli_says_failures_for_what_it_repaired_and_pairs_for_what_it_wrote(run, repaired, capsys):
    """Run again on its own output (every shard done: no model loads), the command prints the summary."""
    assert main(["repair", str(run), "--out", str(repaired), "--n", "3", "--shard-size", "4", "--seed", "1",
                 "--runner", "none", "--backend", "transformers"]) == 0
    summary = json.loads((repaired / "repair.json").read_text())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"wrote {summary['pairs_written']} preference pairs to {repaired}/pairs (TRL DPOTrainer "
                        "columns prompt, chosen, rejected)")
    expected = sorted(f"  {reward}: {c['failures_repaired']}/{c['failures']} failures repaired, repair rate "
                      f"{c['repair_rate']:.3f}" for reward, c in summary["by_reward"].items())
    assert sorted(line.partition(" (")[0] for line in lines[1:]) == expected, lines
    assert not any(re.search(r"\bpairs?\b", line) for line in lines[1:]), lines


def test_a_killed_repair_resumes_to_the_same_pairs(run, repaired, tmp_path):
    out = tmp_path / "pairs"
    first = run_repair(str(run), str(out), CONFIG, progress=False)
    assert first["shards"] >= 2
    # a kill between a shard's part and its marker, another mid-write: the last marker and the summary are
    # gone, a half-written temporary file is left, and one part no longer matches its marker
    last = first["shards"] - 1
    os.remove(out / f"_shards/shard-{last:05d}.json")
    os.remove(out / "repair.json")
    (out / "pairs/.part-00000.parquet.dead.tmp").write_bytes(b"half")
    parts = sorted((out / "pairs").glob("part-*.parquet"))
    assert len(parts) >= 2
    parts[1].write_bytes(b"garbage")
    kept = os.stat(parts[0]).st_mtime_ns
    resumed = run_repair(str(run), str(out), CONFIG, progress=False)
    assert os.stat(parts[0]).st_mtime_ns == kept  # a done shard is not redone
    assert not list((out / "pairs").glob(".*.tmp"))
    assert resumed["by_reward"] == first["by_reward"]
    assert [(r["pair_id"], r["chosen"]) for r in pairs(out)] == [(r["pair_id"], r["chosen"]) for r in pairs(repaired)]
    with pytest.raises(ValueError, match="another run or config"):
        run_repair(str(run), str(out), RepairConfig(n=2), progress=False)


def test_a_folder_is_resumed_by_the_sampler_that_filled_it(run, repaired, capsys):
    """The engine batches a window of shards where transformers batches its own rows: a resume on another sampler
    would mix two runs' bytes, so OUT records its sampler and refuses another in one line."""
    assert json.loads((repaired / "config.json").read_text())["sampler"] == {"backend": "transformers",
                                                                            "device": "cpu"}
    before = sorted(p.name for p in repaired.rglob("*"))
    args = ["repair", str(run), "--out", str(repaired), "--n", "3", "--shard-size", "4", "--seed", "1",
            "--runner", "none", "--backend", "vllm"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"tokencredit repair: error: {repaired} holds shards sampled by transformers on cpu, this run "
                       "would sample with vllm on cpu; give --backend transformers --device cpu to resume it, or "
                       "another --out")
    assert sorted(p.name for p in repaired.rglob("*")) == before


def test_the_prefect_flow_writes_the_same_pairs(run, repaired, tmp_path, prefect_harness):
    from tokencredit.flows.derived import run_derived_flow
    from tokencredit.pipeline.repair import REPAIR

    summary = run_derived_flow(REPAIR, str(run), str(tmp_path / "flow"), CONFIG, progress=False)
    assert summary["pairs_written"] == len(pairs(repaired))
    assert [r["chosen"] for r in pairs(tmp_path / "flow")] == [r["chosen"] for r in pairs(repaired)]


def test_the_pairs_train_one_step_of_trl_dpo(repaired, tmp_path):
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    import torch

    from tokencredit.pipeline.models.loading import load_policy

    data = datasets.load_dataset("parquet", data_files=sorted(map(str, (repaired / "pairs").glob("part-*.parquet"))),
                                 split="train")
    assert {"prompt", "chosen", "rejected"} <= set(data.column_names)
    model, tokenizer = load_policy()
    before = [p.detach().clone() for p in model.parameters()]
    args = trl.DPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, learning_rate=1e-3,
                         report_to="none", use_cpu=True, save_strategy="no", logging_steps=1, max_length=256,
                         seed=0, bf16=False)
    trainer = trl.DPOTrainer(model=model, args=args, processing_class=tokenizer,
                             train_dataset=data.select_columns(["prompt", "chosen", "rejected"]))
    trainer.train()
    loss = trainer.state.log_history[0]["loss"]
    assert math.isfinite(loss) and loss == pytest.approx(math.log(2), abs=0.05)  # step 1: policy = reference
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
