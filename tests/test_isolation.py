"""Verifiers in worker processes (`tokencredit.verifiers.isolation`): a plugin that allocates past
--verifier-memory, exits the interpreter, holds the GIL in a regex, or starts processes costs only
its own response, and nothing it started outlives the batch; a run with such a plugin completes and
resumes, warns about its failures, and stops after the first shard when a verifier fails on all of it."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from tokencredit import verifiers
from tokencredit.flows.cli import main
from tokencredit.pipeline.annotate import AnnotateConfig, load_prompt_set, verify_samples
from tokencredit.schemas.records import PluginSpec, Sample, TaskRecord
from tokencredit.verifiers import isolation, plugins

HOSTILE = '''
import os, re, subprocess, time


def hostile(record, response):
    pids = record["pid_file"]
    if response == "allocate":  # 4 GB in 10 MB pieces
        kept = [bytearray(10_000_000) for _ in range(400)]
    elif response == "exit":
        os._exit(7)
    elif response == "regex":  # holds the GIL for minutes
        re.match(r"(a+)+$", "a" * 34 + "b")
    elif response == "child":  # a child left running by a call that returns
        open(pids + ".child", "w").write(str(subprocess.Popen(["sleep", "1000"]).pid))
    elif response == "daemon":  # a grandchild in a session of its own, orphaned at once
        subprocess.run(["sh", "-c", f"setsid sleep 1000 & echo $! > {pids}.daemon"], check=True)
    elif response == "hang":  # a child, then a call that never returns
        open(pids + ".hang", "w").write(str(subprocess.Popen(["sleep", "1000"]).pid))
        time.sleep(1000)
    yield "short", float(len(response) < 5), "Be brief."
'''


def hostile_ref(tmp_path: Path) -> plugins.PluginRef:
    (tmp_path / "hostile.py").write_text(HOSTILE)
    return plugins.resolve([f"haiku={tmp_path / 'hostile.py'}:hostile"])[0]


def is_gone(pid: int) -> bool:
    """No such process, or a zombie (dead; its reaping is up to PID 1, which in a container may never do it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not is_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return is_gone(pid)


def test_each_hostile_call_is_its_own_verifier_error_and_nothing_it_started_survives(tmp_path):
    record = TaskRecord("h1", "haiku", "Write a haiku.", None,
                        PluginSpec({"id": "h1", "task": "haiku", "pid_file": str(tmp_path / "pid")}))
    texts = ["ok", "allocate", "fine", "exit", "regex", "child", "daemon", "hang", "last"]
    samples = [Sample(f"h1/{j}", "h1", "haiku", "p", [1], text, [2], [-0.1], "m", 0) for j, text in enumerate(texts)]
    plugin = hostile_ref(tmp_path)
    # The allocation gets a time bound no load reaches, so that the memory bound is what stops it (zero-filling
    # 1 GB took over 3 s on a loaded CI machine); the others need a short one to be stopped at all.
    allocated = verify_samples(samples[1:2], {"h1": record}, [plugin], timeout_s=600.0, memory_bytes=1_000_000_000)
    assert allocated[0].status.startswith("verifier_error: memory: the verifiers needed more than 1000 MB on this "
                                          "response (--verifier-memory); MemoryError")
    verified = verify_samples(samples, {"h1": record}, [plugin], timeout_s=3.0, memory_bytes=1_000_000_000)
    status = dict(zip(texts, (v.status for v in verified)))
    assert status["allocate"].startswith("verifier_error: ")  # memory, or time on a loaded machine
    assert status["exit"] == "verifier_error: the verifier process exited with status 7 (os._exit or a crash) on " \
                             "this response"
    assert status["regex"] == status["hang"] == ("verifier_error: timeout: the verifiers ran past 3 s on this "
                                                 "response (--verifier-timeout)")
    assert [status[t] for t in ("ok", "fine", "child", "daemon", "last")] == ["ok"] * 5
    assert [v.rewards[0].score for v in verified if v.status == "ok"] == [1.0, 1.0, 0.0, 0.0, 1.0]
    for kind in ("child", "daemon", "hang"):
        pid = int((tmp_path / f"pid.{kind}").read_text())
        assert wait_gone(pid), f"the {kind} process {pid} outlived the batch"


def worker_pids() -> set[int]:
    """The verifier worker processes this one started (idle ones included), from /proc."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):  # ended while we looked
            continue
        if ppid == os.getpid() and b"tokencredit.verifiers.isolation" in command:
            found.add(int(stat.parent.name))
    return found


WHERE = '''
import os
def where(record, response):
    yield "where", 1.0, "Any response.", str(os.getpid())
'''


def test_built_in_verifiers_start_no_worker_and_a_plugin_adds_its_rewards_from_one_after_theirs(tmp_path):
    isolation.close_workers()  # idle workers that earlier tests left
    records, _ = load_prompt_set(AnnotateConfig(limit=2))  # the demo set: sql, instructions, tools
    samples = [Sample(f"{r.id}/0", r.id, r.task, "p", [1], r.reference_response, [2], [-0.1], "m", 0) for r in records]
    by_id = {r.id: r for r in records}
    verified = verify_samples(samples, by_id)
    assert {r.task for r in records} == {"sql", "instructions", "tools"}
    assert [v.rewards for v in verified] == [verifiers.verify(r, r.reference_response) for r in records]
    assert worker_pids() == set()

    (tmp_path / "where.py").write_text(WHERE)
    refs = plugins.resolve([f"{tmp_path / 'where.py'}:where"])  # scores every record, after its built-ins
    verified = verify_samples(samples, by_id, refs)
    assert [v.rewards[:-1] for v in verified] == [verifiers.verify(r, r.reference_response) for r in records]
    (worker,) = worker_pids()
    assert [(v.rewards[-1].name, v.rewards[-1].observed) for v in verified] == [("where", str(worker))] * len(records)


def test_a_plugin_repeating_a_built_in_reward_name_is_a_verifier_error(tmp_path):
    (tmp_path / "twice.py").write_text("def twice(record, response):\n    yield 'format', 1.0, 'Any.'\n")
    records, _ = load_prompt_set(AnnotateConfig(limit=1, tasks=("sql",)))
    samples = [Sample(f"{r.id}/0", r.id, r.task, "p", [1], r.reference_response, [2], [-0.1], "m", 0) for r in records]
    refs = plugins.resolve([f"{tmp_path / 'twice.py'}:twice"])
    (verified,) = verify_samples(samples, {r.id: r for r in records}, refs)
    assert verified.status == (f"verifier_error: PluginError: record {records[0].id!r}: reward name(s) format "
                               "given twice")


def test_a_plugin_error_names_the_verifier_in_the_status(tmp_path):
    (tmp_path / "down.py").write_text("def down(record, response):\n    raise RuntimeError('the grader is down')\n")
    record = TaskRecord("h1", "haiku", "Write a haiku.", None, PluginSpec({"id": "h1", "task": "haiku"}))
    sample = Sample("h1/0", "h1", "haiku", "p", [1], "a", [2], [-0.1], "m", 0)
    (verified,) = verify_samples([sample], {"h1": record}, plugins.resolve([f"haiku={tmp_path / 'down.py'}:down"]))
    assert verified.status == (f"verifier_error: RuntimeError: the grader is down (raised by verifier "
                               f"{(tmp_path / 'down.py').resolve()}:down)")


EXITS_ON_SNOW = '''
import os
def haiku(record, response):
    if record["topic"] == "snow":
        os._exit(7)
    yield "on_topic", float(record["topic"] in response.lower()), f"Mention the {record['topic']}."
'''


def annotate(tmp_path: Path, plugin: str, prompts: list[dict], *options: str) -> int:
    (tmp_path / "plugin.py").write_text(plugin)
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return main(["annotate", "--out", str(tmp_path / "out"), "--prompts", str(path), "--runner", "none",
                 "--verifier", f"haiku={tmp_path / 'plugin.py'}:haiku", "--n", "2", "--max-new-tokens", "8",
                 "--credit", "gdpo", *options])


HAIKUS = [{"id": "h1", "task": "haiku", "prompt": "A haiku.", "topic": "sea"},
          {"id": "h2", "task": "haiku", "prompt": "A haiku.", "topic": "snow"}]


@pytest.mark.slow
def test_a_plugin_that_exits_the_interpreter_costs_its_responses_warns_and_the_run_resumes(tmp_path, capsys):
    """os._exit(7) in a plugin ended `annotate` itself (exit 7, incomplete) and a resume died at the same record."""
    assert annotate(tmp_path, EXITS_ON_SNOW, HAIKUS) == 0
    out, err = capsys.readouterr()
    warning = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warning == ["warning: 2 of 4 responses are verifier_errors (no rewards, no credit), the first record "
                       "'h2': the verifier process exited with status 7 (os._exit or a crash) on this response"]
    rows = ds.dataset(tmp_path / "out/responses").to_table().to_pylist()
    exited = "verifier_error: the verifier process exited with status 7 (os._exit or a crash) on this response"
    assert sorted((r["group_id"], r["status"]) for r in rows) == [("h1", "ok")] * 2 + [("h2", exited)] * 2
    checksum = json.loads((tmp_path / "out/manifest.json").read_text())["dataset_checksum"]
    assert annotate(tmp_path, EXITS_ON_SNOW, HAIKUS) == 0  # the same command again: resumed, nothing to redo
    assert json.loads((tmp_path / "out/manifest.json").read_text())["dataset_checksum"] == checksum


DOWN = '''
def haiku(record, response):
    raise RuntimeError("the grader is down")
'''


@pytest.mark.slow
def test_a_verifier_failing_on_a_whole_first_shard_stops_the_run_after_it(tmp_path, capsys):
    prompts = [{"id": f"h{i}", "task": "haiku", "prompt": "A haiku.", "topic": "sea"} for i in range(3)]
    code = annotate(tmp_path, DOWN, prompts, "--shard-size", "1")
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("tokencredit annotate: error:")]
    assert code == 2 and "Traceback" not in err and len(errors) == 1
    assert errors[0].startswith("tokencredit annotate: error: every one of 2 responses of task 'haiku' in shard 0 "
                                "is a verifier_error, the first record 'h0': RuntimeError: the grader is down "
                                f"(raised by verifier {(tmp_path / 'plugin.py').resolve()}:haiku); stopped after "
                                "that shard")
    assert sorted(p.name for p in (tmp_path / "out/_shards").iterdir()) == ["shard-00000.json"]  # not 3 shards


@pytest.mark.slow
def test_the_prefect_flow_survives_an_exiting_plugin_and_stops_on_a_failing_one(prefect_harness, tmp_path):
    """Under the threads runner os._exit in a plugin ended the run and left Prefect's server running."""
    from tokencredit.flows.annotate import run_annotate_flow
    from tokencredit.pipeline.annotate import AnnotateConfig
    from tokencredit.pipeline.config import CreditConfig, SamplingConfig

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in HAIKUS))
    for name, source in (("exits", EXITS_ON_SNOW), ("down", DOWN)):
        (tmp_path / f"{name}.py").write_text(source)
    config = AnnotateConfig(prompts=str(prompts), shard_size=1, sampling=SamplingConfig(n=2, max_new_tokens=8),
                            credit=CreditConfig(kinds=("gdpo",)),
                            verifiers=plugins.resolve([f"haiku={tmp_path / 'exits.py'}:haiku"]))
    manifest = run_annotate_flow(config, str(tmp_path / "exits"), runner="threads", workers=1, progress=False)
    assert manifest["complete"] and manifest["stats"]["verifier_failures"] == 2
    down = AnnotateConfig(**{**config.__dict__, "verifiers": plugins.resolve([f"haiku={tmp_path / 'down.py'}:haiku"])})
    with pytest.raises(RuntimeError, match="every one of 2 responses of task 'haiku' in shard 0 is a verifier_error"):
        run_annotate_flow(down, str(tmp_path / "down"), runner="threads", workers=1, progress=False)
    assert (tmp_path / "down/_shards/shard-00000.json").is_file()


def test_an_idle_worker_serves_only_a_caller_in_its_own_folder_and_environment(tmp_path, monkeypatch):
    """A plugin named by module imports from the caller's folder and may read its environment: after a chdir or
    an environment change in the same process, the next batch gets a worker started there, not a stale idle one."""
    record = load_prompt_set(AnnotateConfig(limit=1))[0][0]
    samples = [Sample(f"{record.id}/0", record.id, record.task, "p", [1], record.reference_response, [2], [-0.1], "m", 0)]
    by_id = {record.id: record}
    seen = []
    for folder, gate in (("a", "1"), ("b", "1"), ("b", "2")):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "gated.py").write_text(
            f'import os\n\ndef gated(record, response):\n    yield "gate", 1.0, "", "{folder}" + os.environ["GATE"]\n')
        monkeypatch.chdir(tmp_path / folder)
        monkeypatch.setenv("GATE", gate)
        (verified,) = verify_samples(samples, by_id, isolation.resolve(["gated:gated"], 2_000_000_000))
        seen.append(verified.rewards[-1].observed)
    assert seen == ["a1", "b1", "b2"]
