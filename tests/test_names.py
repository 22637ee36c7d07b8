"""Names a user or a design file gives never lead a write or a delete outside the folder a command was given
(issue 49, item 1): compare's arm and pool names, `serve --name`, `runs OUT --resume FOLDER`, each one folder name
of safe characters or one line naming the key or option; and a symbolic link inside the folder that points outside
does not let compare or `runs --resume` write or delete there."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.test_compare import TINY, write
from tokencredit.flows.cli import main
from tokencredit.flows.schedule import state_home
from tokencredit.pipeline.names import check_name, inside

HOSTILE = ["..", ".", "", "../victim", "../../x", "/abs/dir", "a/b", "a\\b", "name with space", "tab\t", "é"]


def snapshot(folder: Path, leave_out: Path | None = None) -> dict[str, bytes | str]:
    """Every file under `folder` (but `leave_out`) with its bytes, every link with its target."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            if leave_out is not None and (path == leave_out or leave_out in path.parents):
                continue
            key = str(path.relative_to(folder))
            found[key] = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else "dir"
    return found


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENCREDIT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_that_is_not_one_safe_folder_name_is_refused_naming_its_key(name):
    with pytest.raises(ValueError, match=r"^design \[arms\] name .*: expected one folder name of letters, digits"):
        check_name(name, "design [arms] name")


@pytest.mark.parametrize("name", ["gdpo", "run.2", "a_b-c", "-x", "...", ".hidden"])
def test_a_safe_folder_name_is_kept(name):
    assert check_name(name, "--name") == name


@pytest.mark.parametrize("table, name", [("arms", "../victim"), ("arms", "../../victim"), ("arms", ""),
                                         ("pools", "../../escpool"), ("pools", "ABS"), ("pools", "..")])
def test_a_design_name_with_a_path_is_refused_before_anything_is_written(tmp_path, home, capsys, table, name):
    """`[arms."../victim"]` deleted the folder it named (a user file in it) before training the arm; a pool named
    with a path had its run written there."""
    work = tmp_path / "work"
    (work / "victim-0").mkdir(parents=True)  # where arm "../../victim" trained its seed 0: DIR/train/../../victim-0
    (work / "victim-0" / "user.txt").write_text("keep me")
    name = str(tmp_path / "abspool") if name == "ABS" else name
    text = (TINY.replace("[arms.mrtpo]", f'[arms."{name}"]') if table == "arms" else
            TINY.replace("[pools.flat]", f'[pools."{name}"]').replace('pool = "flat"', f'pool = "{name}"'))
    design = write(work / "design.toml", text)
    before = snapshot(tmp_path)
    assert main(["compare", str(design), "--out", str(work / "out"), "--runner", "none"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"design [{table}] name {name!r}: expected one folder name" in err, err
    assert snapshot(tmp_path) == before  # OUT not even created


def linked_out(tmp_path: Path, stage: str, name: str) -> Path:
    """A compare folder OUT whose OUT/STAGE links to TMP/outside, where NAME holds a user's file."""
    (tmp_path / "outside" / name).mkdir(parents=True)
    (tmp_path / "outside" / name / "user.txt").write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / stage).symlink_to(tmp_path / "outside")
    return out


def test_a_pools_link_out_of_the_compare_folder_is_refused_before_its_pool_is_annotated(tmp_path, home, capsys):
    out = linked_out(tmp_path, "pools", "flat")
    design = write(tmp_path / "design.toml", TINY)
    before = snapshot(tmp_path, leave_out=out)
    assert main(["compare", str(design), "--out", str(out), "--runner", "none"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{out / 'pools' / 'flat'} leads outside {out}" in err, err
    assert snapshot(tmp_path, leave_out=out) == before


def test_a_train_link_out_of_the_compare_folder_deletes_nothing_there(tmp_path, home):
    """A training cut short is started again by deleting its folder: never through a link to another folder."""
    from tokencredit.pipeline.compare.design import load_design
    from tokencredit.pipeline.compare.run import train_arm

    out = linked_out(tmp_path, "train", "gdpo-0")
    design = load_design(write(tmp_path / "design.toml", TINY))
    with pytest.raises(ValueError, match="leads outside .* through a symbolic link"):
        train_arm(design, design.arms["gdpo"], 0, out / "pools" / "flat", out)
    assert (tmp_path / "outside" / "gdpo-0" / "user.txt").read_text() == "keep me"


def test_inside_follows_links_and_keeps_what_stays_inside(tmp_path):
    (tmp_path / "out" / "real").mkdir(parents=True)
    (tmp_path / "out" / "here").symlink_to(tmp_path / "out" / "real")
    (tmp_path / "out" / "away").symlink_to(tmp_path)
    assert inside(tmp_path / "out", tmp_path / "out" / "here" / "x") == tmp_path / "out" / "here" / "x"
    for escaping in (tmp_path / "out" / "away" / "x", tmp_path / "out" / ".." / "x"):
        with pytest.raises(ValueError, match="leads outside"):
            inside(tmp_path / "out", escaping)


@pytest.mark.parametrize("name", ["/abs/dir", "../../../x", "", "..", "a/b"])
def test_serve_name_is_one_folder_name_refused_before_any_server_starts(tmp_path, home, capsys, name):
    """`--name /abs/dir` or `../../../x` put the Prefect database outside TOKENCREDIT_HOME; `--name ""` in the home's
    serve folder itself."""
    with pytest.raises(SystemExit) as stop:
        main(["serve", "--out", str(tmp_path / "runs"), "--every", "10s", "--name", name])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"argument --name: name {name!r}: expected one folder name" in err, err
    assert not home.exists() and not (tmp_path / "runs").exists()


def test_serve_keeps_its_state_per_output_folder(home, tmp_path):
    """Two --out of one --name never share a Prefect database: a first serve of a folder finds no runs missed by
    another folder's serve."""
    first, again, other = (state_home("nightly-annotate", str(tmp_path / out)) for out in ("a", "a", "b"))
    assert first == again and first != other
    assert first.parent == other.parent == home / "serve" / "nightly-annotate"


@pytest.mark.parametrize("folder", ["../../runs/x", "/abs/run", "", "..", "a/b"])
def test_runs_resume_is_one_folder_name_under_out(tmp_path, capsys, folder):
    (tmp_path / "runs").mkdir()
    with pytest.raises(SystemExit) as stop:
        main(["runs", str(tmp_path / "runs"), "--resume", folder])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"argument --resume: folder {folder!r}: expected one folder name" in err


def test_runs_resume_does_not_follow_a_link_out_of_out(tmp_path, capsys):
    """A link OUT/FOLDER to a run elsewhere: that run is not finished (written) from OUT."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "manifest.json").write_text('{"complete": false}')
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "2026-12-05T03-00-00").symlink_to(elsewhere)
    before = snapshot(elsewhere)
    assert main(["runs", str(tmp_path / "runs"), "--resume", "2026-12-05T03-00-00"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"leads outside {tmp_path / 'runs'} (to {elsewhere}" in err, err
    assert snapshot(elsewhere) == before
