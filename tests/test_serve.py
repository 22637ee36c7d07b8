"""`tokencredit serve` on a real Prefect server: a schedule fires, runs do not overlap, a failed run is visible and
the next one still fires, a stop is one line and leaves every run marked; `tokencredit runs` lists what ran."""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from tokencredit.flows.cli import main
from tokencredit.flows.runs import list_runs
from tokencredit.flows.schedule import check_folder, folder_name, parse_every
from tokencredit.pipeline.dataset.writer import read_manifest

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = ["--limit", "1", "--n", "2", "--tasks", "tools", "--max-new-tokens", "24"]


# --- schedules and folders ----------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("10s", 10), ("10m", 600), ("1h", 3600), ("1d", 86400), ("1h30m", 5400),
                                           ("2M", 120)])
def test_every_reads_durations(text, seconds):
    assert parse_every(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["10", "10x", "", "m", "0s", "1h 30", "-5m", "367d", "99999999999999999999d"])
def test_every_refuses_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match="--every"):
        parse_every(text)


def test_folder_templates_name_a_run_by_its_scheduled_time():
    when = datetime.datetime(2026, 12, 5, 3, 0, 7)
    assert folder_name("{datetime}", when) == "2026-12-05T03-00-07"
    assert folder_name("nightly-{date}", when) == "nightly-2026-12-05"
    for bad in ["fixed", "{time}", "a/{date}", "_{date}", ".{date}"]:
        with pytest.raises(ValueError, match="--folder"):
            check_folder(bad)


@pytest.mark.parametrize("argv, message", [
    (["--cron", "61 * * * *"], "--cron '61 * * * *': not a valid cron expression"),
    (["--every", "5 minutes"], "--every '5 minutes': expected a duration"),
    (["--every", "10s", "--timezone", "Mars/Olympus"], "--timezone 'Mars/Olympus': not an IANA time zone"),
    (["--every", "10s", "--folder", "latest"], "--folder 'latest': expected one folder name"),
    (["--every", "99999999999999999999d"], "--every '99999999999999999999d': the interval must be at most 366d"),
])
def test_a_bad_schedule_is_one_line_before_any_server_starts(tmp_path, capsys, argv, message):
    assert main(["serve", "--out", str(tmp_path / "runs"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "runs").exists()


def test_serve_needs_exactly_one_schedule(capsys):
    for argv in ([], ["--cron", "* * * * *", "--every", "1m"]):
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "--out", "x", *argv])
        assert exit_.value.code == 2
    assert "one of the arguments --cron --every is required" in capsys.readouterr().err


def test_a_run_whose_process_died_mid_way_lists_as_incomplete_with_how_to_resume(tmp_path, capsys):
    """A run killed outright leaves its record `running` behind a process that is gone."""
    out = tmp_path / "runs"
    code = f"from tokencredit.flows.runs import start_record; start_record({str(out)!r}, '2026-12-05T03-00-00', {{}})"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    [run] = list_runs(str(out))
    assert run["state"] == "incomplete" and "its process is gone" in run["error"] and run["responses"] == 0
    assert main(["runs", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"2026-12-05T03-00-00: incomplete; resume it with: tokencredit runs {out} --resume 2026-12-05T03-00-00")


def test_runs_shows_each_runs_wall_times_and_stage_seconds(tmp_path, capsys):
    """A complete run's from its manifest; a run whose manifest is not complete, summed over the shards it wrote."""
    from tokencredit.pipeline.annotate import run_annotation
    from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig

    out = tmp_path / "runs"
    config = AnnotateConfig(limit=1, shard_size=1, credit=CreditConfig(kinds=("gdpo", "mrtpo")),
                            sampling=SamplingConfig(n=2, max_new_tokens=8))
    manifest = run_annotation(config, str(out / "a"), progress=False)
    [run] = list_runs(str(out))
    assert run["seconds"] == manifest["stats"]["seconds"] and run["run_seconds"] == manifest["run_seconds"]
    assert {"sample", "verify", "credit_gdpo", "credit_mrtpo", "credit_rows", "write"} <= set(run["seconds"])
    assert 0 < run["run_seconds"]["startup"] < run["run_seconds"]["total"]
    assert main(["runs", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(r"a: startup \d+\.\d s, (engine start \d+\.\d s, )?sampling \d+\.\d s, total \d+\.\d s; "
                        r"shards: sample \d+\.\d s, verify .*, write \d+\.\d s", printed), printed
    shards = [json.loads(p.read_text())["stats"]["seconds"] for p in (out / "a" / "_shards").glob("*.json")]
    assert len(shards) == 3  # one prompt of each demo task, one shard each
    (out / "a" / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))  # as a killed run's
    [run] = list_runs(str(out))
    assert run["run_seconds"] == {} and run["seconds"]["sample"] == pytest.approx(sum(s["sample"] for s in shards))


# --- on a real Prefect server -------------------------------------------------------------------

def sorted_rows(path: Path, table: str) -> list[dict]:
    rows = ds.dataset(str(path / table), format="parquet").to_table().to_pylist()
    key = ("response_id", "reward", "constraint_index", "position") if table == "credits" else ("response_id",)
    return sorted(rows, key=lambda r: tuple(-1 if r[k] is None else r[k] for k in key))


def wait_for(check, what: str, timeout: float, serve: subprocess.Popen | None = None, log: Path | None = None):
    """Poll `check` until it returns something true; fail after `timeout` s or when serve exits."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if serve is not None and serve.poll() is not None:
            pytest.fail(f"serve exited ({serve.returncode}) before {what}:\n{log.read_text()[-4000:] if log else ''}")
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout:.0f} s"
        time.sleep(0.5)


def states(out: Path) -> list[str]:
    return [r["state"] for r in list_runs(str(out))] if out.exists() else []


class Serve:
    """`tokencredit serve` as a user runs it, in a process of its own, its output in a log file."""

    def __init__(self, tmp_path: Path, argv: list[str], env: dict[str, str]):
        self.log = tmp_path / "serve.log"
        self.process = subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", "serve", *argv],
                                        stdout=open(self.log, "w"), stderr=subprocess.STDOUT, cwd=tmp_path, env=env)

    def wait(self, check, what: str, timeout: float = 600):
        return wait_for(check, what, timeout, self.process, self.log)

    def stop(self, signum: int, timeout: float = 120) -> str:
        """Signal serve; its output once it exited (with the status 128 + signum)."""
        self.process.send_signal(signum)
        self.process.wait(timeout)
        output = self.log.read_text()
        assert self.process.returncode == 128 + signum, output[-4000:]
        return output

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def serve_env(tmp_path: Path, api_url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=str(ROOT), DO_NOT_TRACK="1", TOKENCREDIT_HOME=str(tmp_path / "home"),
               OMP_WAIT_POLICY="PASSIVE")
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """One long-lived `prefect server start` for the tests that name it with PREFECT_API_URL."""
    from tokencredit.flows.prefect_server import local_server

    with local_server(tmp_path_factory.mktemp("prefect-server")) as server:
        server.wait(timeout_s=600)
        yield server.api_url


@pytest.mark.slow
def test_a_schedule_fires_twice_with_no_setup_and_sigint_stops_it_with_one_line(tmp_path):
    """No PREFECT_API_URL: serve starts a server whose scheduler runs; every 5 s, two complete datasets equal
    to an annotate of the same config; SIGINT stops it with one line and no run left unmarked."""
    out = tmp_path / "runs"
    serve = Serve(tmp_path, ["--every", "5s", "--out", str(out), *OPTIONS, "--name", "fires"], serve_env(tmp_path))
    try:
        serve.wait(lambda: states(out).count("complete") >= 2, "two complete runs")
        ui = re.search(r"its UI: (http://127\.0\.0\.1:\d+)", serve.log.read_text()).group(1)
        with urllib.request.urlopen(ui, timeout=30) as page:  # the Prefect UI it names answers
            assert page.status == 200 and b"<html" in page.read().lower()
        output = serve.stop(signal.SIGINT)
    finally:
        serve.kill()
    assert "Prefect API: http://127.0.0.1:" in output and "started by serve" in output
    assert "Traceback" not in output, output[-4000:]
    assert output.strip().splitlines()[-1] == f"tokencredit serve: stopped on SIGINT; what ran: tokencredit runs {out}"
    runs = list_runs(str(out))
    assert {r["state"] for r in runs} <= {"complete", "incomplete"}  # none left `running`
    complete = [out / r["folder"] for r in runs if r["state"] == "complete"]

    reference = tmp_path / "annotate"
    assert main(["annotate", "--out", str(reference), *OPTIONS, "--runner", "none"]) == 0
    for folder in complete[:2]:
        assert read_manifest(str(folder))["config_hash"] == read_manifest(str(reference))["config_hash"]
        for table in ("responses", "credits"):
            assert sorted_rows(folder, table) == sorted_rows(reference, table), (folder, table)
    assert all(r["responses"] == 2 for r in runs if r["state"] == "complete")


GATE = '''
import os, time


def gated(record, response):
    """Scores 1 once the file $GATE exists: the run stays writing until the test opens it. $GATE.waiting says
    that a call waits."""
    open(os.environ["GATE"] + ".waiting", "w").close()
    deadline = time.monotonic() + 600
    while not os.path.exists(os.environ["GATE"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [("gated", 1.0, "Wait for the gate.")]


def failing(record, response):
    raise RuntimeError("the grader is down")
'''


def plugin_options(tmp_path: Path, verifier: str) -> list[str]:
    (tmp_path / "gate_verifiers.py").write_text(GATE)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "h1", "task": "haiku", "prompt": "Write a haiku."}\n')
    return ["--prompts", str(prompts), "--verifier", f"haiku={tmp_path / 'gate_verifiers.py'}:{verifier}",
            "--verifier-timeout", "900", "--n", "2", "--max-new-tokens", "8", "--credit", "gdpo"]


def flow_runs(api_url: str, name: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        with get_client(sync_client=True) as client:
            return client.read_flow_runs(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])))


def writing(out: Path) -> bool:
    """A run is past its start: its manifest is written, its verifier waits at the gate."""
    runs = list_runs(str(out)) if out.exists() else []
    return any(r["state"] == "running" and read_manifest(str(out / r["folder"])) for r in runs)


@pytest.mark.slow
def test_a_run_due_while_one_writes_is_skipped_and_a_stopped_run_resumes(tmp_path, prefect_server):
    """Every 3 s while one run is held writing: the runs due meanwhile are cancelled by the server (skipped),
    no second folder starts; SIGTERM stops serve with the run marked incomplete, and `runs --resume` finishes it."""
    out = tmp_path / "runs"
    env = {**serve_env(tmp_path, prefect_server), "GATE": str(tmp_path / "gate-open")}
    serve = Serve(tmp_path, ["--every", "3s", "--out", str(out), *plugin_options(tmp_path, "gated"), "--name", "held"],
                  env)
    try:
        serve.wait(lambda: writing(out), "a run writing")
        serve.wait(lambda: sum(r.state_type.value == "CANCELLED" for r in flow_runs(prefect_server, "held")) >= 2,
                   "two runs due while it writes")
        assert states(out) == ["running"], list_runs(str(out))  # the skipped runs never started a folder
        output = serve.stop(signal.SIGTERM)
    finally:
        serve.kill()
    assert "Traceback" not in output, output[-4000:]
    assert output.strip().splitlines()[-1].startswith("tokencredit serve: stopped on SIGTERM")
    [run] = list_runs(str(out))
    assert run["state"] == "incomplete" and run["resume"] == f"tokencredit runs {out} --resume {run['folder']}"
    assert not read_manifest(str(out / run["folder"])).get("complete")
    cancelled = [r for r in flow_runs(prefect_server, "held") if r.state_type.value == "CANCELLED"]
    assert len(cancelled) >= 2

    (tmp_path / "gate-open").touch()
    os.environ["GATE"] = env["GATE"]  # the resume's verifier runs in this process's worker
    try:
        assert main(["runs", str(out), "--resume", run["folder"]]) == 0
    finally:
        del os.environ["GATE"]
    [resumed] = list_runs(str(out))
    assert resumed["state"] == "complete" and resumed["responses"] == 2
    assert read_manifest(str(out / run["folder"]))["complete"]


@pytest.mark.slow
def test_a_failed_run_is_visible_and_the_next_one_fires(tmp_path, prefect_server, capsys):
    out = tmp_path / "runs"
    serve = Serve(tmp_path, ["--every", "3s", "--out", str(out), *plugin_options(tmp_path, "failing"),
                             "--name", "failing"], serve_env(tmp_path, prefect_server))
    try:
        serve.wait(lambda: states(out).count("failed") >= 2, "two failed runs")
        serve.wait(lambda: sum(r.state_type.value == "FAILED" for r in flow_runs(prefect_server, "failing")) >= 2,
                   "two Failed flow runs in Prefect")
        serve.stop(signal.SIGTERM)
    finally:
        serve.kill()
    failed = [r for r in list_runs(str(out)) if r["state"] == "failed"]
    assert all("every one of 2 responses of task 'haiku' in shard 0 is a verifier_error" in r["error"] for r in failed)
    assert main(["runs", str(out)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["folder", "start", "end", "state", "responses", "error"]
    assert sum(" failed " in line and "verifier_error" in line for line in table.splitlines()) >= 2
    assert main(["runs", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == list_runs(str(out))


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:  # ended while we looked
        return ""


def processes_in(folder: Path) -> dict[int, str]:
    """The live processes working in `folder` (a command started there, and every process under it that kept its
    working directory, however it was started or reparented): pid -> command line."""
    from tokencredit.verifiers.isolation import is_gone

    found = {}
    for entry in Path("/proc").iterdir():
        try:
            here = entry.name.isdigit() and Path(os.readlink(entry / "cwd")) == folder
        except OSError:  # ended while we looked, or not ours to read
            continue
        if here and not is_gone(int(entry.name)):
            found[int(entry.name)] = command_line(int(entry.name))
    return found


def end_all(folder: Path) -> None:
    """Kill what is left working in `folder`: a failed test leaves no process behind."""
    for pid in processes_in(folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_serve_killed_with_sigkill_takes_its_server_runner_run_and_verifier_worker_along(tmp_path):
    """kill -9 of serve alone, while a run writes: its Prefect server, its runner, the run and the run's verifier
    worker all end (each watches the process that started it), and no later run starts a folder."""
    out = tmp_path / "runs"
    env = {**serve_env(tmp_path), "GATE": str(tmp_path / "gate-open")}  # the gate never opens
    serve = Serve(tmp_path, ["--every", "3s", "--out", str(out), *plugin_options(tmp_path, "gated"),
                             "--name", "killed"], env)
    try:
        serve.wait(lambda: writing(out) and (tmp_path / "gate-open.waiting").exists(), "a run's verifier call")
        commands = " | ".join(processes_in(tmp_path).values())
        for what in ("tokencredit.flows.cli serve", "prefect server start", "tokencredit.flows.runner",
                     "tokencredit.verifiers.isolation"):  # the last one a child of the run's process
            assert what in commands, f"no {what} in {commands}"
        serve.process.send_signal(signal.SIGKILL)
        serve.process.wait()
        wait_for(lambda: not processes_in(tmp_path), "the end of every process serve started", timeout=120)
    finally:
        serve.kill()
        end_all(tmp_path)
    [run] = list_runs(str(out))  # the run it was writing, and no later one
    assert run["state"] == "incomplete", run


# --- serve --rounds: a rounds job on the schedule ---------------------------------------------------

ROUNDS_GATE = '''
import os, time


def half_gated(record, response):
    """Scores a response by its length's parity; on the records of the second shard (h3, h4) only once the file
    $GATE exists, so that a run has written one shard and waits while the test stops serve."""
    if record["id"] in ("h3", "h4"):
        deadline = time.monotonic() + 600
        while not os.path.exists(os.environ["GATE"]) and time.monotonic() < deadline:
            time.sleep(0.2)
    return [("even", float(len(response) % 2 == 0), "An even number of characters.")]
'''


def rounds_options(tmp_path: Path) -> list[str]:
    """One round on the tiny policy: 4 train prompts x 2 responses in 2 shards, 2 LoRA steps, 2 dev prompts."""
    (tmp_path / "rounds_verifiers.py").write_text(ROUNDS_GATE)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "task": "haiku", "prompt": "Write a haiku.", "split": split}) + "\n"
                               for i, split in [("h1", "train"), ("h2", "train"), ("h3", "train"), ("h4", "train"),
                                                ("d1", "test"), ("d2", "test")]))
    return ["--prompts", str(prompts), "--verifier", f"haiku={tmp_path / 'rounds_verifiers.py'}:half_gated",
            "--verifier-timeout", "900", "--n", "2", "--max-new-tokens", "8", "--credit", "gdpo", "--shard-size", "2",
            "--rounds", "1", "--advantage", "gdpo", "--steps", "2", "--batch-size", "4", "--lr", "5e-2", "--lora",
            "--dev-limit", "2"]


@pytest.mark.slow
def test_serve_rounds_schedules_a_rounds_job_that_a_stop_leaves_to_the_next_run_of_its_folder(tmp_path,
                                                                                            prefect_server, capsys):
    """serve --rounds: each run writes its rounds into its dated folder; stopped in round 0's annotate run it lists
    as incomplete with the start policy's dev reward, and the next run of the same {date} folder (a serve started
    again) resumes it, keeping the shard written, to the round's checkpoint and dev reward, listed by `runs`."""
    out = tmp_path / "runs"
    argv = ["--every", "5s", "--folder", "rounds-{date}", "--out", str(out), *rounds_options(tmp_path),
            "--name", "rounds"]
    env = {**serve_env(tmp_path, prefect_server), "GATE": str(tmp_path / "gate-open")}

    def runs_so_far():  # a failed run fails the test at once, with its error
        runs = list_runs(str(out)) if out.exists() else []
        assert all(r["state"] != "failed" for r in runs), runs
        return runs

    def one_shard_written():
        runs = runs_so_far()
        return runs and list((out / runs[0]["folder"] / "round-000" / "run" / "_shards").glob("shard-*.json"))

    serve = Serve(tmp_path, argv, env)
    try:
        [first_shard] = serve.wait(one_shard_written, "round 0's first shard")
        output = serve.stop(signal.SIGTERM)
    finally:
        serve.kill()
    assert "Traceback" not in output, output[-4000:]
    [run] = list_runs(str(out))
    folder = out / run["folder"]
    assert run["folder"].startswith("rounds-") and run["rounds"] == 1
    assert run["state"] == "incomplete" and run["resume"] == f"tokencredit runs {out} --resume {run['folder']}"
    assert [d["round"] for d in run["dev"]] == ["start"] and run["responses"] == 2 * 2  # one shard of two
    assert not (folder / "round-000" / "dev.json").exists()
    written = first_shard.stat().st_mtime_ns

    (tmp_path / "gate-open").touch()
    serve = Serve(tmp_path, argv, env)
    try:
        serve.wait(lambda: [r["state"] for r in runs_so_far()] == ["complete"], "the rounds finished")
        serve.stop(signal.SIGTERM)
    finally:
        serve.kill()
    [run] = list_runs(str(out))
    assert run["folder"] == folder.name and run["state"] == "complete" and run["responses"] == 4 * 2
    assert first_shard.stat().st_mtime_ns == written  # resumed: the shard written before the stop was kept
    manifest = read_manifest(str(folder / "round-000" / "run"))
    assert manifest["complete"] and manifest["totals"]["responses"] == 4 * 2
    assert (folder / "round-000" / "checkpoint" / "final" / "adapter_config.json").is_file()
    dev = [json.loads((folder / name / "dev.json").read_text()) for name in ("start", "round-000")]
    assert [d["prompts"] for d in dev] == [2, 2] and dev[1]["policy"] == str(folder / "round-000" / "policy")
    assert run["dev"] == [{"round": d["round"], "reward": d["reward"], "prompts": 2} for d in dev]
    assert main(["runs", str(out)]) == 0
    assert (f"{folder.name}: dev reward start {dev[0]['reward']:.4f}, round-000 {dev[1]['reward']:.4f}"
            in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize("argv, message", [
    (["--steps", "5"], "--steps 5: an option of a rounds job; add --rounds R to serve rounds"),
    (["--lora"], "--lora: an option of a rounds job; add --rounds R to serve rounds"),
    (["--rounds", "2", "--split", "test"], "--split test --dev-split test: the dev prompts would be trained on"),
])
def test_serve_refuses_a_rounds_option_without_rounds_or_rounds_that_cannot_run_in_one_line(tmp_path, capsys, argv,
                                                                                         message):
    assert main(["serve", "--out", str(tmp_path / "runs"), "--every", "1d", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"tokencredit serve: error: {message}"), err
    assert not (tmp_path / "runs").exists()


def test_runs_resume_finishes_a_rounds_job_from_its_rounds_json(tmp_path, capsys):
    """A rounds job whose process died before its first round (its rounds.json and record written): `runs` lists it
    incomplete with the command that finishes it, which runs its rounds in this process to each dev reward."""
    from tokencredit.flows.cli import build_parser, rounds_config
    from tokencredit.pipeline.rounds import check_settings

    out = tmp_path / "runs"
    options = rounds_options(tmp_path)
    args = build_parser().parse_args(["rounds", "--out", str(out / "x"), *options])
    check_settings(rounds_config(args, []), out / "x")
    code = f"from tokencredit.flows.runs import start_record; start_record({str(out)!r}, 'x', {{'rounds': 1}})"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    [run] = list_runs(str(out))
    assert run["state"] == "incomplete" and run["dev"] == [] and run["resume"] == f"tokencredit runs {out} --resume x"

    (tmp_path / "gate-open").touch()
    os.environ["GATE"] = str(tmp_path / "gate-open")  # the verifier runs in this process's worker
    try:
        assert main(["runs", str(out), "--resume", "x"]) == 0
    finally:
        del os.environ["GATE"]
    [run] = list_runs(str(out))
    dev = [json.loads((out / "x" / name / "dev.json").read_text())["reward"] for name in ("start", "round-000")]
    assert run["state"] == "complete" and run["responses"] == 4 * 2 and [d["reward"] for d in run["dev"]] == dev
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{out}/x: complete, dev reward {dev[0]:.4f} (start) -> {dev[1]:.4f} after round 1")
