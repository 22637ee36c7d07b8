"""What a hostile re-test found about a run's identity (issue 39, items 4, 5, 8, 9): derived folders tied to their
run, --restart that deletes only a run, a missing or cut part file named, and a prompt file edited behind the
hash cache's back."""
import json
import os
from pathlib import Path

import pytest

from tokencredit.flows.cli import main
from tests.test_progress import without_phases

FAST = ["--runner", "none", "--n", "2", "--max-new-tokens", "8", "--credit", "gdpo"]


@pytest.fixture(autouse=True)
def own_hash_cache(tmp_path, monkeypatch):
    """The checksum cache lives in $TOKENCREDIT_HOME: a test's own, not the user's."""
    monkeypatch.setenv("TOKENCREDIT_HOME", str(tmp_path / "home"))


def write_prompts(path: Path, prompts: list[str]) -> Path:
    records = [{"id": f"r{i}", "task": "instructions", "prompt": p, "constraints": [{"kind": "title", "args": {}}]}
               for i, p in enumerate(prompts)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def error_line(capsys) -> str:
    err = "\n".join(without_phases(capsys.readouterr().err))
    assert len(err.splitlines()) == 1, err
    return err


# ---------------------------------------------------------------- item 5: --restart deletes only a run

def test_restart_refuses_a_folder_that_holds_no_run_and_deletes_nothing(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", ["Title one."])
    out = tmp_path / "mine"
    (out / "responses").mkdir(parents=True)
    files = {"part-00000.parquet": b"user data", "shard-00001.json": b"{}", "responses/part-00000.parquet": b"x",
             "notes.txt": b"mine"}
    for name, data in files.items():
        (out / name).write_bytes(data)
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), "--restart", *FAST]) == 2
    err = error_line(capsys)
    assert "holds no tokencredit run" in err and "manifest.json" in err and "part-00000.parquet" in err
    assert {name: (out / name).read_bytes() for name in files} == files
    assert not (out / "manifest.json").exists() and not (out / "_shards").exists()


def test_restart_of_a_run_keeps_files_the_run_did_not_write(tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", ["Title one.", "Title two."])
    out = tmp_path / "run"
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), "--shard-size", "1", *FAST]) == 0
    mine = {"part-00000.parquet": b"user data", "_shards/shard-notes.json": b"{}", "responses/part-extra.parquet": b"x",
            "credits/.keep.tmp": b"kept", "shard-00000.json": b"{}"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), "--shard-size", "2", "--restart",
                 *FAST]) == 0
    assert {name: (out / name).read_bytes() for name in mine} == mine
    assert sorted(p.name for p in (out / "_shards").iterdir()) == ["shard-00000.json", "shard-notes.json"]
    assert json.loads((out / "manifest.json").read_text())["n_shards"] == 1


# ---------------------------------------------------------------- item 4: derived folders tied to their run

VALUES = ["--k", "2", "--cuts", "2", "--pairs", "2", "--shard-size", "1", "--runner", "none"]
DEMO = ["--limit", "2", "--tasks", "instructions", "--n", "4", "--max-new-tokens", "16", "--credit", "gdpo,mrtpo",
        "--runner", "none"]


def files_of(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """Two runs of the same prompts (the same record ids) with other seeds, and value curves of the first."""
    folder = tmp_path_factory.mktemp("derived")
    os.environ["TOKENCREDIT_HOME"] = str(folder / "home")
    try:
        assert main(["annotate", "--out", str(folder / "a"), "--seed", "3", *DEMO]) == 0
        assert main(["annotate", "--out", str(folder / "b"), "--seed", "4", *DEMO]) == 0
        assert main(["values", str(folder / "a"), "--out", str(folder / "va"), *VALUES]) == 0
    finally:
        del os.environ["TOKENCREDIT_HOME"]
    return folder


@pytest.mark.parametrize("inside", ["", "values", "responses/v"])
def test_an_out_equal_to_or_inside_the_run_is_refused_before_anything_is_written(demo_runs, inside, capsys):
    run = demo_runs / "a"
    before = files_of(run)
    out = run / inside if inside else run
    for command in (["values", str(run), "--out", str(out), *VALUES],
                    ["repair", str(run), "--out", str(out), "--runner", "none", "--n", "1"]):
        capsys.readouterr()
        assert main(command) == 2
        err = error_line(capsys)
        assert "--out" in err and "run folder" in err and str(run) in err
        assert files_of(run) == before


def test_values_record_the_run_identity(demo_runs):
    manifest = json.loads((demo_runs / "a" / "manifest.json").read_text())
    for name in ("config.json", "values.json"):
        recorded = json.loads((demo_runs / "va" / name).read_text())
        identity = recorded["identity" if name == "config.json" else "run_identity"]
        assert identity["config_hash"] == manifest["config_hash"]
        assert identity["dataset_checksum"] == manifest["dataset_checksum"]


def test_repair_refuses_the_values_of_another_run_with_the_same_record_ids(demo_runs, tmp_path, capsys):
    assert main(["repair", str(demo_runs / "b"), "--out", str(tmp_path / "r"), "--cut", "decisive", "--values",
                 str(demo_runs / "va"), "--runner", "none", "--n", "1"]) == 2
    err = error_line(capsys)
    assert "--values" in err and "of another run" in err and str(demo_runs / "a") in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", [["train", "--data", "{v}", "--out", "{tmp}/ckpt", "--steps", "1"],
                                     ["export", "{v}", "--dest", "{tmp}/e"],
                                     ["query", "{v}", "SELECT 1"]])
def test_train_export_and_query_name_a_derived_folder_and_its_run(demo_runs, tmp_path, command, capsys):
    argv = [a.format(v=demo_runs / "va", tmp=tmp_path) for a in command]
    assert main(argv) == 2
    err = error_line(capsys)
    assert str(demo_runs / "va") in err and "derived from the run" in err and str(demo_runs / "a") in err


def test_derived_folders_of_an_earlier_run_in_the_same_folder_are_refused(tmp_path, capsys):
    run, values = tmp_path / "run", tmp_path / "v"
    assert main(["annotate", "--out", str(run), "--seed", "3", *DEMO]) == 0
    assert main(["values", str(run), "--out", str(values), *VALUES]) == 0
    assert main(["annotate", "--out", str(run), "--seed", "7", "--restart", *DEMO]) == 0
    capsys.readouterr()
    assert main(["values", str(run), "--out", str(values), *VALUES]) == 2  # resuming it would mix two runs' curves
    err = error_line(capsys)
    assert "earlier run" in err and str(run) in err
    assert main(["repair", str(run), "--out", str(tmp_path / "r"), "--cut", "decisive", "--values", str(values),
                 "--runner", "none", "--n", "1"]) == 2
    err = error_line(capsys)
    assert "--values" in err and "earlier run" in err


def test_training_checkpoints_of_an_earlier_run_in_the_same_folder_are_not_resumed(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", ["Title one.", "Title two."])
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    train = ["train", "--data", str(run), "--out", str(ckpt), "--advantage", "gdpo", "--batch-size", "2",
             "--save-every", "1"]
    assert main(["annotate", "--out", str(run), "--prompts", str(prompts), *FAST]) == 0
    assert main([*train, "--steps", "1"]) == 0
    assert main(["annotate", "--out", str(run), "--prompts", str(prompts), "--seed", "7", "--restart", *FAST]) == 0
    capsys.readouterr()
    assert main([*train, "--steps", "2"]) == 2  # resuming would go on with the new run's responses
    err = error_line(capsys)
    assert str(ckpt) in err and "earlier or another run" in err and "--restart" in err
    assert not (ckpt / "checkpoint-2").exists()


# ---------------------------------------------------------------- item 8: a missing or cut part file

@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_missing_or_cut_part_file_is_one_line_naming_it_and_a_resume_repairs_it(tmp_path, damage, capsys):
    import shutil

    prompts = write_prompts(tmp_path / "p.jsonl", ["Title one.", "Title two."])
    run = tmp_path / "run"
    annotate = ["annotate", "--out", str(run), "--prompts", str(prompts), "--shard-size", "1", *FAST]
    assert main(annotate) == 0
    whole = run.parent / "whole"
    shutil.copytree(run, whole)
    part = run / "credits" / "part-00001.parquet"
    if damage == "deleted":
        part.unlink()
    else:
        part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    for command in (["export", str(run), "--dest", str(tmp_path / "e"), "--advantage", "gdpo"],
                    ["train", "--data", str(run), "--out", str(tmp_path / "ckpt"), "--steps", "1"],
                    ["values", str(run), "--out", str(tmp_path / "v"), *VALUES],
                    ["query", str(run), "SELECT count(*) FROM credits"]):
        capsys.readouterr()
        assert main(command) == 2, command
        err = error_line(capsys)
        assert "credits/part-00001.parquet" in err and "resume the run" in err, err
    assert not (tmp_path / "e").exists() and not (tmp_path / "ckpt").exists() and not (tmp_path / "v").exists()
    assert main(annotate) == 0  # the resume writes the shard again, byte for byte
    assert part.read_bytes() == (whole / "credits" / "part-00001.parquet").read_bytes()
    assert main(["export", str(run), "--dest", str(tmp_path / "e"), "--advantage", "gdpo"]) == 0


def test_a_missing_values_part_is_one_line_and_resuming_the_values_writes_it(demo_runs, tmp_path, capsys):
    import shutil

    values = tmp_path / "va"
    shutil.copytree(demo_runs / "va", values)
    part = values / "values" / "part-00000.parquet"
    kept = part.read_bytes()
    part.unlink()
    repair = ["repair", str(demo_runs / "a"), "--out", str(tmp_path / "r"), "--cut", "decisive", "--values",
              str(values), "--runner", "none", "--n", "1"]
    capsys.readouterr()
    assert main(repair) == 2
    err = error_line(capsys)
    assert "values/part-00000.parquet is missing" in err and "resume the values run" in err
    assert main(["values", str(demo_runs / "a"), "--out", str(values), *VALUES]) == 0
    assert part.read_bytes() == kept


# ---------------------------------------------------------------- item 9: what the hash cache trusts

def edit_keeping_size_and_mtime(path: Path, old: bytes, new: bytes) -> None:
    assert len(old) == len(new)
    stat = path.stat()
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns


def test_a_prompt_file_edited_to_the_same_size_and_mtime_is_not_resumed_with_old_rows(tmp_path, capsys):
    prompts = write_prompts(tmp_path / "p.jsonl", ["Title one.", "Title two."])
    out = tmp_path / "run"
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), *FAST]) == 0
    edit_keeping_size_and_mtime(prompts, b"Title two.", b"Title TWO.")
    capsys.readouterr()
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), *FAST]) == 2
    err = error_line(capsys)
    assert str(prompts) in err and "changed" in err and "--restart" in err


def test_the_hash_cache_of_a_large_file_trusts_its_times_and_a_sample_of_its_content(tmp_path, monkeypatch):
    from tokencredit.pipeline import identity

    monkeypatch.setattr(identity, "FULL_HASH_BYTES", 1000)  # weights-sized files, in small
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(bytes(range(256)) * 4096)  # 1 MiB: every byte inside one of the 16 sampled blocks
    first = identity.file_checksums([weights])[str(weights)]["sha256"]
    cache = json.loads((tmp_path / "home" / "hashes.json").read_text())
    (key,) = cache
    cache[key]["sha256"] = "f" * 64  # the cache is what a resume reads: no rehash while nothing changed
    (tmp_path / "home" / "hashes.json").write_text(json.dumps(cache))
    assert identity.file_checksums([weights])[str(weights)]["sha256"] == "f" * 64
    edit_keeping_size_and_mtime(weights, bytes(range(100, 108)), b"edited!!")
    assert identity.file_checksums([weights])[str(weights)]["sha256"] not in (first, "f" * 64)
    # the sample alone catches an edit even when every time and the inode are as before (another file system)
    cache = json.loads((tmp_path / "home" / "hashes.json").read_text())
    stat = weights.stat()
    (key,) = [k for k in cache if k.split("\x00")[4] == str(stat.st_ino) and k.split("\x00")[3] == str(stat.st_ctime_ns)]
    data = weights.read_bytes()
    weights.write_bytes(data[:-8] + b"lastbyte")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    forged = {"\x00".join([*key.split("\x00")[:3], str(weights.stat().st_ctime_ns), key.split("\x00")[4]]): cache[key]}
    (tmp_path / "home" / "hashes.json").write_text(json.dumps(forged))
    assert identity.file_checksums([weights])[str(weights)]["sha256"] == identity._sha256(weights)
