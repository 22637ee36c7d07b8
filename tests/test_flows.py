"""The annotate flow end to end with the shipped tiny models: runners, resume, bad input, determinism."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from tokencredit.flows.annotate import run_annotate_flow
from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
from tokencredit.flows.cli import main
from tokencredit.pipeline.credit.assign import CreditConfig
from tokencredit.pipeline.config import SamplingConfig

pytestmark = pytest.mark.slow

SMALL = AnnotateConfig(limit=2, shard_size=2, sampling=SamplingConfig(n=3, max_new_tokens=40, seed=7),
                       credit=CreditConfig(kinds=("gdpo", "mrtpo")))


def sorted_rows(out: Path, table: str) -> list[dict]:
    rows = ds.dataset(out / table, format="parquet").to_table().to_pylist()
    key = ("response_id", "reward", "position") if table == "credits" else ("response_id",)
    return sorted(rows, key=lambda r: tuple(r[k] for k in key))


def test_thread_and_dask_runners_write_identical_rows(prefect_harness, tmp_path):
    threads = run_annotate_flow(SMALL, str(tmp_path / "threads"), runner="threads", workers=2, progress=False)
    dask = run_annotate_flow(SMALL, str(tmp_path / "dask"), runner="dask", workers=2, progress=False)
    assert threads["totals"] == dask["totals"] and threads["totals"]["responses"] == 3 * 2 * 3
    for table in ("responses", "credits"):
        assert sorted_rows(tmp_path / "threads", table) == sorted_rows(tmp_path / "dask", table)


def test_same_config_and_seed_give_the_same_checksum(prefect_harness, tmp_path):
    first = run_annotate_flow(SMALL, str(tmp_path / "a"), progress=False)
    second = run_annotation(SMALL, str(tmp_path / "b"), progress=False)
    assert first["dataset_checksum"] == second["dataset_checksum"]
    other_seed = AnnotateConfig(**{**SMALL.__dict__, "sampling": SamplingConfig(n=3, max_new_tokens=40, seed=8)})
    assert run_annotation(other_seed, str(tmp_path / "c"), progress=False)["dataset_checksum"] != \
        first["dataset_checksum"]


def test_rerun_skips_completed_shards(prefect_harness, tmp_path):
    out = tmp_path / "run"
    first = run_annotate_flow(SMALL, str(out), run_id="r1", progress=False)
    stamps = {p: p.stat().st_mtime_ns for p in (out / "responses").glob("*.parquet")}
    second = run_annotate_flow(SMALL, str(out), run_id="r1", progress=False)
    assert second["dataset_checksum"] == first["dataset_checksum"]
    assert {p: p.stat().st_mtime_ns for p in (out / "responses").glob("*.parquet")} == stamps


def test_killed_run_resumes_without_duplicates_or_gaps(prefect_harness, tmp_path):
    out = tmp_path / "killed"
    # a wall-clock bound must not decide a score here: under load a verifier call could run past the default
    args = ["annotate", "--out", str(out), "--limit", "3", "--shard-size", "1", "--n", "3",
            "--max-new-tokens", "40", "--seed", "7", "--run-id", "kill-test", "--verifier-timeout", "120"]
    env = {**os.environ, "PREFECT_API_URL": os.environ.get("PREFECT_API_URL", "")}
    # its own process group: the kill takes the run and its temporary Prefect server down together, as a
    # crash of the job would (killing the CLI alone leaves that server running after the test)
    proc = subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", *args], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while len(list((out / "_shards").glob("*.json"))) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(list((out / "_shards").glob("*.json")))
    assert 2 <= written < 9, f"the kill should land mid-run ({written} of 9 shards written)"

    assert main([*args, "--runner", "threads"]) == 0
    full = tmp_path / "uninterrupted"
    assert main([*args[:2], str(full), *args[3:], "--runner", "none"]) == 0
    resumed_ids = [r["response_id"] for r in sorted_rows(out, "responses")]
    assert len(resumed_ids) == len(set(resumed_ids)) == 3 * 3 * 3
    for table in ("responses", "credits"):
        assert sorted_rows(out, table) == sorted_rows(full, table)


def test_bad_records_are_rejected_and_the_rest_annotated(prefect_harness, tmp_path, capsys):
    demo = [json.loads(line) for line in
            (Path(__file__).parent.parent / "verifiers/demo/tools.jsonl").read_text().splitlines()[:2]]
    lines = [
        json.dumps(demo[0]),
        "{not json",
        json.dumps({k: v for k, v in demo[1].items() if k != "prompt"}),
        json.dumps({**demo[1], "id": "wrong-type", "prompt": 42}),
        json.dumps({"id": "sql-missing-db", "task": "sql", "prompt": "Count rows.", "db": "nowhere.sqlite",
                    "reference_sql": "SELECT 1", "reference_response": "<sql>SELECT 1</sql>"}),
        json.dumps(demo[1]),
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "bad"
    args = ["annotate", "--out", str(out), "--prompts", str(prompts), "--n", "2", "--max-new-tokens", "24",
            "--limit", "0", "--runner", "none"]
    assert main(args) == 0
    assert main([*args, "--strict"]) == 1
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert [r["line_no"] for r in rejected] == [2, 3, 4, 5]
    assert "prompt" in rejected[1]["reason"] and "db" in rejected[3]["reason"]
    ids = {r["group_id"] for r in sorted_rows(out, "responses")}
    assert ids == {demo[0]["id"], demo[1]["id"]}


def test_pipeline_flow_annotates_then_trains_from_that_run(prefect_harness, tmp_path):
    from tokencredit.flows.train import pipeline_flow
    from tokencredit.pipeline.train.trainer import TrainConfig

    config = TrainConfig(data=str(tmp_path / "run"), out=str(tmp_path / "ckpt"), advantage="mrtpo", steps=2,
                         batch_size=4, save_every=2)
    result = pipeline_flow(SMALL, config)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert result["dataset_checksum"] == manifest["dataset_checksum"]
    assert Path(result["checkpoint"]) == tmp_path / "ckpt" / "final"
    assert (tmp_path / "ckpt" / "final" / "model.safetensors").is_file()
    assert len((tmp_path / "ckpt" / "metrics.csv").read_text().splitlines()) == 1 + 2  # header + 2 steps


def test_nightly_deployment_runs_the_scheduled_annotate_flow_on_its_cron_one_at_a_time(tmp_path):
    """The deployment `serve` hands its runner (tests/test_serve.py fires it on a real server)."""
    from tokencredit.flows.schedule import make_schedule
    from tokencredit.flows.scheduled_run import deployment as served

    schedule = make_schedule("0 3 * * *", None, "Europe/Paris")
    deployment = served(SMALL, str(tmp_path / "nightly"), schedule, folder="{date}")
    assert deployment.flow_name == "scheduled-annotate"
    assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
    assert deployment.parameters["out"] == str(tmp_path / "nightly")
    assert deployment.parameters["folder"] == "{date}"
    assert deployment.concurrency_limit == 1
    assert deployment.parameters["config"] == SMALL


def test_the_models_load_while_prefect_starts_and_the_manifest_times_the_run(tmp_path):
    """A default `annotate` (the Prefect flow on threads) starts loading its models once its inputs are checked,
    before the flow has started, and the manifest says when each thing happened (run_seconds)."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    done = subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", "annotate", "--out", str(out), "--limit", "1",
                           "--tasks", "sql", "--n", "2", "--max-new-tokens", "4", "--credit", "gdpo", "--backend",
                           "transformers"], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    run = json.loads((out / "manifest.json").read_text())["run_seconds"]
    marks = run["marks"]
    assert 0 < marks["inputs_checked"] <= marks["models_loading"] < marks["run_opened"] < marks["sample"]
    assert marks["models_loaded"] <= marks["sample"] == run["startup"] < run["total"]
    assert run["engine_start"] == pytest.approx(marks["models_loaded"] - marks["models_loading"], abs=0.002)
