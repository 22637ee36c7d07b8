"""SIGINT and SIGTERM (`tokencredit.pipeline.interrupts`): the first ends a command within seconds with one line
and exit 130/143, every process under it ends too, nothing half-done is written, a second signal ends it at once;
rerunning the same command resumes to files byte-identical to an uninterrupted run's, in every runner (none,
threads, Dask) and in values, repair and train."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from tokencredit.flows.cli import main
from tokencredit.pipeline.interrupts import message
from tokencredit.verifiers.isolation import descendants, is_gone

EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
DEADLINE_S = 300  # for a condition a loaded machine reaches late; an interrupt is over long before


def start(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """The CLI in a session of its own (a terminal's Ctrl-C and a scheduler's cancel signal a whole group)."""
    return subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", *args], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"), env={**os.environ, **(env or {})})


def wait_for(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert proc.poll() is None, f"the command ended (status {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S} s"
        time.sleep(0.05)


def markers(out: Path) -> int:
    return len(list((out / "_shards").glob("shard-*.json")))


def interrupt(proc: subprocess.Popen, signum: int, log: Path, command: str) -> list[int]:
    """Signal the command's process group as a terminal or a scheduler does; check that it ends within seconds
    with one line and 128 + signum, and that no process it started outlives it. Returns the processes it had."""
    under = descendants(proc.pid)
    os.killpg(proc.pid, signum)
    try:
        code = proc.wait(timeout=60)  # today's code lived 71-220 s past the signal
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the command still ran 60 s after the signal") from None
    assert code == EXIT[signum], log.read_text()[-3000:]
    lines = log.read_text().splitlines()
    assert lines[-1] == message(command), lines[-5:]
    assert lines.count(message(command)) == 1, lines[-5:]  # said once (a phase line names the folder, which may say it too)
    assert "Traceback" not in log.read_text()
    deadline = time.monotonic() + 10
    while not all(map(is_gone, under)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in under if not is_gone(p)] == []
    return under


# ---------------------------------------------------------------- the handler alone, on a stand-in command

COMMAND = '''
import os, subprocess, sys, threading, time
from pathlib import Path
from tokencredit.pipeline import interrupts

out = Path(sys.argv[1])
if sys.argv[2] == "slow-kill":  # stands in for a process that takes long to end, to see the second signal
    interrupts.stop_descendants = lambda pid: time.sleep(600)

def writer():  # commits a file on each turn, as a shard writer does; none may be written after the signal
    n = 0
    while True:
        interrupts.hold()
        (out / f"{n}.done").write_text("x")
        n += 1
        time.sleep(0.01)

with interrupts.interruptible("demo"):
    sleeper = subprocess.Popen(["sleep", "1000"])  # a worker process
    daemon = subprocess.Popen(["sh", "-c", f"echo $$ > {out / 'sh.pid'}; sleep 1000 & echo $! > {out / 'daemon.pid'}; "
                               "wait"], start_new_session=True)  # one in a session of its own, with a child
    threading.Thread(target=writer, daemon=True).start()
    (out / "ready").write_text(str(sleeper.pid))
    while True:  # the main thread busy, as in a forward pass: the handler runs beside it
        sum(range(10_000))
'''


@pytest.fixture
def command(tmp_path):
    script = tmp_path / "command.py"
    script.write_text(textwrap.dedent(COMMAND))
    return script


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_stops_writes_ends_every_process_and_exits_128_plus_its_number(command, tmp_path, signum):
    out, log = tmp_path / "out", tmp_path / "log"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, str(command), str(out), "plain"], start_new_session=True,
                            stderr=log.open("w"))
    wait_for(lambda: (out / "daemon.pid").exists() and (out / "ready").exists() and (out / "3.done").exists(),
             proc, "the stand-in command's start")
    grandchild = int((out / "daemon.pid").read_text())
    under = interrupt(proc, signum, log, "demo")
    assert grandchild in under and is_gone(grandchild)
    written = {p.name for p in out.glob("*.done")}
    time.sleep(0.2)  # (nothing left to write them: the process is gone)
    assert {p.name for p in out.glob("*.done")} == written


def test_a_second_signal_ends_the_command_at_once(command, tmp_path):
    out, log = tmp_path / "out", tmp_path / "log"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, str(command), str(out), "slow-kill"], start_new_session=True,
                            stderr=log.open("w"))
    wait_for(lambda: (out / "ready").exists() and (out / "daemon.pid").exists(), proc, "the stand-in command's start")
    os.kill(proc.pid, signal.SIGINT)
    wait_for(lambda: message("demo") in log.read_text(), proc, "the interrupt's line")
    os.kill(proc.pid, signal.SIGTERM)  # the first is still ending its processes (for 600 s)
    assert proc.wait(timeout=60) == 130
    for group in (proc.pid, int((out / "sh.pid").read_text())):  # what the stand-in never ended
        os.killpg(group, signal.SIGKILL)


def test_the_handlers_are_restored_after_the_block():
    from tokencredit.pipeline.interrupts import interruptible

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with interruptible("demo"):
        assert signal.getsignal(signal.SIGINT) is not before[0]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# ---------------------------------------------------------------- annotate, in each runner

ANNOTATE = ["--limit", "2", "--n", "2", "--max-new-tokens", "24", "--shard-size", "1", "--seed", "5",
            "--credit", "gdpo,mrtpo", "--verifier-timeout", "120"]  # 6 shards: sql (a sandbox), instructions, tools


def rows(out: Path, table: str) -> list[dict]:
    return sorted(ds.dataset(out / table, format="parquet").to_table().to_pylist(), key=repr)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("interrupts") / "clean"
    assert main(["annotate", "--out", str(out), *ANNOTATE, "--runner", "none"]) == 0
    return out


def prefect_env() -> dict:
    """The test session's Prefect server for the commands it starts (each would start a server of its own)."""
    from prefect.settings import PREFECT_API_URL

    return {"PREFECT_API_URL": PREFECT_API_URL.value() or ""}


@pytest.mark.slow
@pytest.mark.parametrize("runner, signum, after", [
    ("none", signal.SIGINT, 1),
    ("threads", signal.SIGINT, 2),  # the case: a sandboxed SQL call cut short was stored as its error
    ("threads", signal.SIGTERM, 0),  # during the first shard
    ("dask", signal.SIGTERM, 1),
])
def test_an_interrupted_annotate_resumes_to_the_uninterrupted_runs_bytes(prefect_harness, clean, tmp_path, runner,
                                                                         signum, after):
    out, log = tmp_path / "run", tmp_path / "log"
    args = ["annotate", "--out", str(out), *ANNOTATE, "--runner", runner, "--workers", "2"]
    proc = start(args, log, prefect_env())
    wait_for(lambda: (out / "manifest.json").exists() and markers(out) >= after, proc, f"{after} shard markers")
    interrupt(proc, signum, log, "annotate")
    assert markers(out) < 6, "the signal came after the last shard"
    assert main(args) == 0
    manifest, whole = (json.loads((o / "manifest.json").read_text()) for o in (out, clean))
    assert manifest["dataset_checksum"] == whole["dataset_checksum"]  # the part files' bytes
    statuses = {r["status"] for r in rows(out, "responses")}
    assert not any(s.startswith("verifier_error") for s in statuses), statuses


# ---------------------------------------------------------------- values, repair, train

@pytest.mark.slow
@pytest.mark.parametrize("command, extra", [
    ("values", ["--k", "2", "--cuts", "2", "--pairs", "6", "--shard-size", "1"]),
    ("repair", ["--n", "2", "--shard-size", "1", "--limit", "5"]),
])
def test_an_interrupted_derived_command_resumes_to_the_uninterrupted_rows(prefect_harness, clean, tmp_path, command,
                                                                          extra):
    whole, out, log = tmp_path / "whole", tmp_path / "out", tmp_path / "log"
    assert main([command, str(clean), "--out", str(whole), *extra, "--runner", "none"]) == 0
    args = [command, str(clean), "--out", str(out), *extra, "--runner", "threads"]
    proc = start(args, log, prefect_env())
    wait_for(lambda: markers(out) >= 1, proc, "a shard marker")
    interrupt(proc, signal.SIGINT, log, command)
    assert main(args) == 0
    tables = [p.name for p in whole.iterdir() if p.is_dir() and not p.name.startswith("_")]
    assert tables
    for table in tables:
        assert rows(out, table) == rows(whole, table), table


@pytest.mark.slow
def test_an_interrupted_train_resumes_to_the_uninterrupted_weights(clean, tmp_path):
    args = ["--data", str(clean), "--steps", "4", "--batch-size", "2", "--save-every", "1", "--save-optimizer"]
    whole, out, log = tmp_path / "whole", tmp_path / "out", tmp_path / "log"
    assert main(["train", *args, "--out", str(whole)]) == 0
    proc = start(["train", *args, "--out", str(out)], log)
    wait_for(lambda: (out / "checkpoint-1" / "train_config.json").exists(), proc, "the first checkpoint")
    interrupt(proc, signal.SIGTERM, log, "train")
    assert not (out / "checkpoint-4" / "train_config.json").exists(), "the signal came after the last step"
    assert main(["train", *args, "--out", str(out)]) == 0
    for name in ("model.safetensors",):
        assert (out / "checkpoint-4" / name).read_bytes() == (whole / "checkpoint-4" / name).read_bytes()


@pytest.mark.slow
def test_an_interrupted_rm_train_leaves_no_folder_and_reruns_to_the_uninterrupted_model(tmp_path):
    from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig
    from tokencredit.pipeline.models.loading import DEFAULT_POLICY
    from tokencredit.pipeline.steps import Pipeline

    run = tmp_path / "run"
    Pipeline(AnnotateConfig(prompts="demo", tasks=("instructions",), limit=16, credit=CreditConfig(kinds=("gdpo",)),
                            sampling=SamplingConfig(n=8, max_new_tokens=32))).run(str(run))
    args = ["rm", "train", str(run), "--base", str(DEFAULT_POLICY), "--train-layers", "1", "--epochs", "30",
            "--layer-lr", "1e-3"]
    whole, out, log = tmp_path / "whole", tmp_path / "out", tmp_path / "log"
    assert main([*args, "--out", str(whole)]) == 0
    proc = start([*args, "--out", str(out)], log)
    wait_for(lambda: "rm top layers" in log.read_text(), proc, "the top layers' progress")
    interrupt(proc, signal.SIGINT, log, "rm")
    assert list(tmp_path.glob("*out*")) == [], "an interrupted rm train left a folder"
    (tmp_path / ".out.tmp-1").mkdir()  # as a kill -9 while saving leaves it
    assert main([*args, "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*out*")) == ["out"]
    assert json.loads((out / "rm_train.json").read_text()) == json.loads((whole / "rm_train.json").read_text())
    assert (out / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()
