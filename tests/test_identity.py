"""A run's identity includes its inputs' contents (prompt file, databases, models), its manifest names them by
absolute path, and export and repair refuse records that changed since the run."""
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tokencredit.flows.cli import main
from tokencredit.pipeline.dataset.export import export_verl
from tests.test_progress import without_phases

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--runner", "none", "--n", "2", "--max-new-tokens", "8", "--credit", "gdpo"]


@pytest.fixture(autouse=True)
def own_hash_cache(tmp_path, monkeypatch):
    """The checksum cache lives in $TOKENCREDIT_HOME: a test's own, not the user's."""
    monkeypatch.setenv("TOKENCREDIT_HOME", str(tmp_path / "home"))


def title_record(record_id: str, prompt: str) -> dict:
    return {"id": record_id, "task": "instructions", "prompt": prompt, "constraints": [{"kind": "title", "args": {}}]}


def write_prompts(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_an_edited_prompt_file_is_refused_naming_it_and_restart_starts_a_fresh_run(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "facts.jsonl", [title_record("a", "Write a title."),
                                                       title_record("b", "Name a poem.")])
    out = tmp_path / "run"
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), *FAST]) == 0
    first = manifest(out)
    assert first["inputs"][str(prompts)] == {"size": prompts.stat().st_size,
                                             "sha256": hashlib.sha256(prompts.read_bytes()).hexdigest()}
    assert any(path.endswith(".safetensors") for path in first["inputs"])  # the policy's weights
    capsys.readouterr()

    write_prompts(prompts, [title_record("a", "Write a title."), title_record("b", "Name a song.")])
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), *FAST]) == 2
    error = "\n".join(without_phases(capsys.readouterr().err))
    assert len(error.splitlines()) == 1 and str(prompts) in error and "changed" in error and "--restart" in error
    assert manifest(out) == first  # refused before anything was written

    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), "--restart", *FAST]) == 0
    fresh = manifest(out)
    assert fresh["inputs"][str(prompts)]["sha256"] != first["inputs"][str(prompts)]["sha256"]
    prompts_written = {row["group_id"]: row["prompt"] for row in
                       pq.read_table(out / "responses" / "part-00000.parquet").to_pylist()}
    assert "Name a song." in prompts_written["b"] and "poem" not in prompts_written["b"]
    assert fresh["dataset_checksum"] != first["dataset_checksum"]
    # and the fresh run resumes as any run does
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), *FAST]) == 0
    assert manifest(out)["dataset_checksum"] == fresh["dataset_checksum"]


def test_restart_replaces_a_run_of_another_config_and_leaves_no_old_shard(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", [title_record(f"r{i}", f"Title {i}.") for i in range(3)])
    out = tmp_path / "run"
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), "--shard-size", "1", *FAST]) == 0
    assert len(list((out / "_shards").iterdir())) == 3
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), "--shard-size", "3", *FAST]) == 2
    (out / "notes.txt").write_text("mine")
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), "--shard-size", "3", "--restart", *FAST]) == 0
    assert (out / "notes.txt").read_text() == "mine"  # only the run's own files go
    assert sorted(p.name for p in (out / "_shards").iterdir()) == ["shard-00000.json"]
    assert sorted(p.name for p in (out / "responses").iterdir()) == ["part-00000.parquet"]
    assert manifest(out)["config"]["shard_size"] == 3 and manifest(out)["totals"]["responses"] == 6


def sql_prompts(folder: Path) -> Path:
    (folder / "databases").mkdir(parents=True)
    db = sqlite3.connect(folder / "databases" / "shop.sqlite")
    db.execute("CREATE TABLE items (name TEXT, price INT)")
    db.executemany("INSERT INTO items VALUES (?, ?)", [("pen", 2), ("ink", 5)])
    db.commit()
    db.close()
    return write_prompts(folder / "sql.jsonl", [{"id": "q1", "task": "sql", "prompt": "How many items?",
                                                 "db": "shop.sqlite", "reference_sql": "SELECT count(*) FROM items"}])


def test_a_changed_database_is_refused_naming_it(tmp_path, capsys):
    prompts = sql_prompts(tmp_path / "data")
    out = tmp_path / "run"
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), *FAST]) == 0
    db = tmp_path / "data" / "databases" / "shop.sqlite"
    assert str(db) in manifest(out)["inputs"]
    capsys.readouterr()
    with sqlite3.connect(db) as connection:
        connection.execute("INSERT INTO items VALUES ('cap', 1)")
    connection.close()
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), *FAST]) == 2
    error = "\n".join(without_phases(capsys.readouterr().err))
    assert len(error.splitlines()) == 1 and str(db) in error and "--restart" in error


def test_export_refuses_a_record_edited_since_the_run_naming_it(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", [title_record("a", "Write a title."),
                                                   title_record("b", "Name a poem.")])
    out = tmp_path / "run"
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), *FAST]) == 0
    edited = write_prompts(tmp_path / "edited.jsonl", [title_record("a", "Write a title."),
                                                       title_record("b", "Name a song.")])
    with pytest.raises(ValueError, match=r"task record 'b' in .*edited\.jsonl differs from the record the run"):
        export_verl(out, tmp_path / "verl.parquet", advantage="gdpo", prompts=str(edited))
    assert not (tmp_path / "verl.parquet").exists()
    moved = shutil.copy(prompts, tmp_path / "moved.jsonl")  # the same records elsewhere are fine
    assert pq.read_table(export_verl(out, tmp_path / "verl.parquet", advantage="gdpo", prompts=str(moved))).num_rows == 2


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENCREDIT_HOME": str(cwd / "home")}
    return subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_export_and_repair_work_from_another_directory(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_prompts(a / "facts.jsonl", [title_record("a", "Write a title."), title_record("b", "Name a poem.")])
    done = cli("annotate", "--out", "run", "--prompts", "facts.jsonl", *FAST[:-2], "--credit", "gdpo,mrtpo", cwd=a)
    assert done.returncode == 0, done.stderr
    assert manifest(a / "run")["config"]["prompts"] == str(a / "facts.jsonl")

    done = cli("export", "../a/run", "--format", "verl", "--advantage", "gdpo", "--dest", "verl.parquet", cwd=b)
    assert done.returncode == 0, done.stderr
    assert pq.read_table(b / "verl.parquet").column("extra_info").to_pylist()[0]["group_id"] == "a"
    done = cli("repair", "../a/run", "--out", "pairs", "--runner", "none", "--n", "1", "--limit", "2", cwd=b)
    assert done.returncode == 0, done.stderr
    assert json.loads((b / "pairs" / "repair.json").read_text())["shards"] == 1
    done = cli("repair", "run", "--out", "../b/pairs", "--runner", "none", "--n", "1", "--limit", "2", cwd=a)
    assert done.returncode == 0, done.stderr  # the same repair, named from the run's own directory


def test_the_prefect_flow_refuses_changed_inputs_and_restarts(prefect_harness, tmp_path):
    from tokencredit.flows.annotate import run_annotate_flow
    from tokencredit.pipeline.annotate import AnnotateConfig
    from tokencredit.pipeline.config import CreditConfig, SamplingConfig

    prompts = write_prompts(tmp_path / "p.jsonl", [title_record("a", "Write a title.")])
    config = AnnotateConfig(prompts=str(prompts), credit=CreditConfig(kinds=("gdpo",)),
                            sampling=SamplingConfig(n=2, max_new_tokens=8))
    out = str(tmp_path / "run")
    first = run_annotate_flow(config, out, workers=1, progress=False)
    write_prompts(prompts, [title_record("a", "Write a song title.")])
    with pytest.raises(ValueError, match=r"p\.jsonl changed .* --restart"):
        run_annotate_flow(config, out, workers=1, progress=False)
    fresh = run_annotate_flow(config, out, workers=1, progress=False, restart=True)
    assert fresh["inputs"][str(prompts)]["sha256"] != first["inputs"][str(prompts)]["sha256"]
