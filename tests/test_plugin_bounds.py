"""Plugin verifier bounds that hold for the plugin and everything it starts (`tokencredit.verifiers.isolation`):
a memory bound it cannot lift, over shared mappings and child processes too; a hard `ulimit -d` below
--verifier-memory said as such; threads a call leaves cannot fail the next response; a worker holding the GIL dies
with its caller, even one killed with SIGKILL; an import that exits, crashes, hangs or forks a daemon is one line
naming the plugin, and nothing outlives it; output capped per call; numpy scores accepted; text that is not valid
Unicode is that response's verifier error; and `export --format verl` runs plugins under the same isolation."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tokencredit.flows.cli import main
from tokencredit.pipeline.annotate import verify_samples
from tokencredit.schemas.records import PluginSpec, Sample, TaskRecord
from tokencredit.verifiers import isolation, plugins
from tests.test_progress import without_phases

MB = 1_000_000


def plugin(tmp_path: Path, source: str, name: str = "bounded") -> plugins.PluginRef:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    return plugins.resolve([f"haiku={tmp_path / name}.py:score"])[0]


def record(tmp_path: Path) -> TaskRecord:
    return TaskRecord("h1", "haiku", "Write a haiku.", None,
                      PluginSpec({"id": "h1", "task": "haiku", "prompt": "Write a haiku.", "dir": str(tmp_path)}))


def statuses(tmp_path: Path, ref: plugins.PluginRef, texts: list[str], memory: int = 400 * MB,
             timeout: float = 600.0) -> list[str]:
    samples = [Sample(f"h1/{j}", "h1", "haiku", "p", [1], text, [2], [-0.1], "m", 0) for j, text in enumerate(texts)]
    return [v.status for v in verify_samples(samples, {"h1": record(tmp_path)}, [ref], timeout_s=timeout,
                                             memory_bytes=memory)]


def wait_gone(pids, seconds: float = 30.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(map(isolation.is_gone, pids)):
        time.sleep(0.05)
    return [p for p in pids if not isolation.is_gone(p)]


# ---------------------------------------------------------------- memory

MEMORY = '''
import mmap, os, resource, subprocess, sys, time
KEPT = []

def score(record, response):
    if response == "lift":  # raise the soft limit to the hard one, then allocate past --verifier-memory
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        except ValueError:
            pass
        KEPT.append(bytearray(b"x") * 700_000_000)
    elif response == "shared":  # a shared mapping: not the heap that RLIMIT_DATA bounds
        block = mmap.mmap(-1, 700_000_000, flags=mmap.MAP_SHARED)
        chunk = b"x" * (1 << 20)
        for at in range(0, len(block) - len(chunk), len(chunk)):
            block[at: at + len(chunk)] = chunk
        KEPT.append(block)
    elif response == "children":  # two processes, each under the bound, over it together
        for i in range(2):
            done = os.path.join(record["dir"], f"child{i}")
            code = f"b = bytearray(b'x') * 250_000_000; open({done!r}, 'w').write('1'); import time; time.sleep(1000)"
            child = subprocess.Popen([sys.executable, "-c", code])
            open(done + ".pid", "w").write(str(child.pid))
        while not all(os.path.exists(os.path.join(record["dir"], f"child{i}")) for i in range(2)):
            time.sleep(0.01)
    yield "short", 1.0, "Be brief."
'''


@pytest.mark.parametrize("text", ["lift", "shared", "children"])
def test_the_memory_bound_holds_for_what_the_plugin_cannot_lift_shares_or_starts(tmp_path, text):
    ref = plugin(tmp_path, MEMORY)
    status = statuses(tmp_path, ref, ["fine", text, "after"])
    assert status[0] == status[2] == "ok"
    assert status[1].startswith("verifier_error: memory: the verifiers needed more than 400 MB on this response "
                                "(--verifier-memory)"), status[1]
    children = [int((tmp_path / f"child{i}.pid").read_text()) for i in range(2) if text == "children"]
    assert wait_gone(children) == []


def test_a_hard_data_limit_below_the_verifier_memory_is_said_as_such(tmp_path):
    (tmp_path / "p.py").write_text("def score(record, response):\n    yield 'short', 1.0, 'Be brief.'\n")
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "h1", "task": "haiku", "prompt": "Write a haiku."}) + "\n")
    limit = 3_000_000 * 1024  # `ulimit -d 3000000` (KiB): above what the command needs itself, below 4 GB
    done = subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", "annotate", "--out", str(tmp_path / "run"),
                           "--prompts", str(tmp_path / "p.jsonl"), "--verifier", f"haiku={tmp_path / 'p.py'}:score",
                           "--verifier-memory", "4GB", "--runner", "none"], capture_output=True, text=True, timeout=600,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (limit, limit)))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "tokencredit annotate: error: --verifier-memory 4000 MB is above the hard data limit of this process, "
        "3072 MB (ulimit -Hd 3000000): lower --verifier-memory to at most that, or raise the hard limit")


# ---------------------------------------------------------------- threads, the caller's death

THREADS = '''
import os, threading, time
GO = threading.Event()

def score(record, response):
    if response == "spawn":  # a thread that ends the process under whichever call runs next
        threading.Thread(target=lambda: (GO.wait(), os._exit(9))).start()
    else:
        GO.set()
        time.sleep(0.5)
    yield "short", 1.0, "Be brief."
'''


def test_a_thread_a_call_leaves_behind_cannot_fail_the_next_response(tmp_path):
    ref = plugin(tmp_path, THREADS)
    assert statuses(tmp_path, ref, ["spawn", "next", "last"]) == ["ok", "ok", "ok"]


CALLER = '''
import sys
from pathlib import Path
from tokencredit.pipeline.annotate import verify_samples
from tokencredit.schemas.records import PluginSpec, Sample, TaskRecord
from tokencredit.verifiers import plugins

tmp = Path(sys.argv[1])
ref = plugins.resolve([f"haiku={tmp / 'gil.py'}:score"])[0]
record = TaskRecord("h1", "haiku", "Write a haiku.", None, PluginSpec({"id": "h1", "task": "haiku", "dir": str(tmp)}))
verify_samples([Sample("h1/0", "h1", "haiku", "p", [1], "x", [2], [-0.1], "m", 0)], {"h1": record}, [ref],
               timeout_s=3600, memory_bytes=1_000_000_000)
'''

GIL = '''
import os, re, subprocess

def score(record, response):
    child = subprocess.Popen(["sleep", "1000"])
    open(os.path.join(record["dir"], "pids"), "w").write(f"{os.getpid()} {child.pid}")
    re.match(r"(a+)+$", "a" * 40 + "b")  # holds the GIL for hours
    yield "short", 1.0, "Be brief."
'''


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_worker_holding_the_gil_dies_with_its_caller_even_under_sigkill(tmp_path, signum):
    (tmp_path / "gil.py").write_text(textwrap.dedent(GIL))
    (tmp_path / "caller.py").write_text(textwrap.dedent(CALLER))
    caller = subprocess.Popen([sys.executable, str(tmp_path / "caller.py"), str(tmp_path)])
    deadline = time.monotonic() + 300
    while not (tmp_path / "pids").exists():
        assert caller.poll() is None and time.monotonic() < deadline, "the plugin never ran"
        time.sleep(0.05)
    time.sleep(0.1)  # (the pids are written before the regex starts; let it start)
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    caller.send_signal(signum)
    caller.wait()
    assert wait_gone(pids) == []


# ---------------------------------------------------------------- the reply pipe

PIPE = '''
import fcntl, os, pickle, stat, struct, time


def reply_pipe() -> int:
    """The worker's reply pipe: the pipe this process writes that is not its stderr (fd 1 is a copy of fd 2)."""
    for fd in sorted(map(int, os.listdir("/proc/self/fd"))):
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        writes = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
        if stat.S_ISFIFO(info.st_mode) and writes and info.st_ino != os.fstat(2).st_ino:
            return fd
    raise RuntimeError("no reply pipe")


def score(record, response):
    if response == "stall":  # 2 bytes of a reply's header, then nothing
        os.write(reply_pipe(), b"\\x10\\x00")
        time.sleep(1000)
    elif response == "garble":  # a whole frame that is no pickle, before the real reply
        os.write(reply_pipe(), struct.pack("<Q", 4) + b"junk")
    elif response == "forge":  # a pickle of something no verifier returns
        payload = pickle.dumps(("ok", "not a list of rewards", False))
        os.write(reply_pipe(), struct.pack("<Q", len(payload)) + payload)
    elif response == "run":  # a pickle that would run a command where it is unpickled
        class Run:
            def __reduce__(self):
                return os.system, ("touch " + os.path.join(record["dir"], "ran"),)
        payload = pickle.dumps(("ok", [Run()], False))
        os.write(reply_pipe(), struct.pack("<Q", len(payload)) + payload)
    elif response == "dumps":  # every later pickle this process makes is junk
        pickle.dumps = lambda *args, **kwargs: b"junk"
    yield "short", 1.0, "Be brief."
'''


def test_a_reply_cut_short_fails_its_response_at_the_timeout_and_the_next_response_gets_a_fresh_worker(tmp_path):
    ref = plugin(tmp_path, PIPE)
    assert statuses(tmp_path, ref, ["stall", "fine"], timeout=3.0) == [
        "verifier_error: timeout: the verifiers ran past 3 s on this response (--verifier-timeout)", "ok"]


def test_a_reply_a_plugin_garbles_costs_that_response_alone_and_runs_no_code_here(tmp_path):
    ref = plugin(tmp_path, PIPE)
    found = statuses(tmp_path, ref, ["garble", "fine", "forge", "run", "dumps", "fine"])
    garbled = "verifier_error: the verifier process sent a reply that is no verifier result ({}) on this response"
    assert found == [garbled.format("UnpicklingError: pickle data was truncated"), "ok",
                     garbled.format("'ok' with a str, not a list of rewards"),
                     garbled.format("UnpicklingError: posix.system is no part of a reply"), "ok", "ok"]
    assert not (tmp_path / "ran").exists()  # the forged pickle's command never ran in this process


# ---------------------------------------------------------------- imports

@pytest.mark.parametrize("body, how", [
    ("import os\nos._exit(3)\n", "ended the process, which exited with status 3 (os._exit or a crash)"),
    ("import ctypes\nctypes.string_at(0)\n", "ended the process, which was killed by SIGSEGV"),
    ("import time\ntime.sleep(1000)\n", "ran past 2 s"),
    ("raise RuntimeError('no GPU here')\n", "raised RuntimeError: no GPU here"),
])
def test_an_import_that_exits_crashes_hangs_or_raises_is_one_line_naming_the_plugin(tmp_path, monkeypatch, capsys,
                                                                                   body, how):
    monkeypatch.setattr(isolation, "IMPORT_TIMEOUT_S", 2.0)  # the sleeping import runs for 1000 s
    target = tmp_path / "broken.py"
    target.write_text(body + "def score(record, response):\n    yield 'short', 1.0, 'Be brief.'\n")
    assert main(["annotate", "--out", str(tmp_path / "run"), "--verifier", f"haiku={target}:score",
                 "--runner", "none"]) == 2
    assert without_phases(capsys.readouterr().err) == [
        f"tokencredit annotate: error: verifier haiku={target}:score: importing it {how}"]


def test_a_daemon_forked_by_a_plugins_import_does_not_outlive_its_use(tmp_path):
    source = f'''
        import subprocess
        subprocess.run(["sh", "-c", "setsid sleep 1000 & echo $! >> {tmp_path / 'daemons'}"], check=True)

        def score(record, response):
            yield "short", 1.0, "Be brief."
    '''
    (tmp_path / "forks.py").write_text(textwrap.dedent(source))
    ref = isolation.resolve([f"haiku={tmp_path / 'forks.py'}:score"], 400 * MB)[0]  # imports it once
    assert statuses(tmp_path, ref, ["a", "b"]) == ["ok", "ok"]  # and its worker once more
    daemons = [int(p) for p in (tmp_path / "daemons").read_text().split()]
    assert len(daemons) == 2 and wait_gone(daemons) == []


# ---------------------------------------------------------------- output, scores, text

OUTPUT = '''
import sys

def score(record, response):
    print("o" * 1_000_000)
    sys.stderr.write("e" * 1_000_000)
    yield "short", 1.0, "Be brief."
'''


def test_a_plugins_output_is_capped_per_call_and_the_rest_counted(tmp_path, capfd):
    ref = plugin(tmp_path, OUTPUT)
    assert statuses(tmp_path, ref, ["a", "b"]) == ["ok", "ok"]
    err, deadline = "", time.monotonic() + 60  # a thread forwards the output: wait for its two notes
    while err.count("dropped") < 2 and time.monotonic() < deadline:
        err += capfd.readouterr().err
        time.sleep(0.05)
    # each call printed 1,000,001 + 1,000,000 bytes: 64,000 shown, the rest counted
    assert err.count("[a plugin verifier's output: 1,936,001 more bytes of one call dropped; 64 KB a call are "
                     "shown]") == 2
    assert err.count("o") + err.count("e") < 2 * isolation.OUTPUT_PER_CALL + 1000


VALUES = '''
import numpy

def score(record, response):
    if response == "numpy":
        yield "half", numpy.float32(0.5), "Be brief."
        yield "one", numpy.int64(1), "Be brief."
    elif response == "name":
        yield "half\\ud800", 0.5, "Be brief."
    elif response == "feedback":
        yield "half", 0.5, "Be \\udcff brief."
    else:
        raise ValueError("a message with a lone \\ud800 surrogate")
'''


def test_numpy_scores_are_accepted_and_text_that_is_not_unicode_is_that_responses_error(tmp_path):
    ref = plugin(tmp_path, VALUES)
    samples = [Sample(f"h1/{j}", "h1", "haiku", "p", [1], text, [2], [-0.1], "m", 0)
               for j, text in enumerate(["numpy", "name", "feedback", "raise"])]
    verified = verify_samples(samples, {"h1": record(tmp_path)}, [ref], timeout_s=600, memory_bytes=400 * MB)
    assert verified[0].status == "ok" and [(s.name, s.score) for s in verified[0].rewards] == [("half", 0.5), ("one", 1.0)]
    assert "which is not valid Unicode text" in verified[1].status and "reward name" not in verified[1].status
    assert "has feedback" in verified[2].status and "not valid Unicode" in verified[2].status
    assert verified[3].status.startswith("verifier_error: ValueError: a message with a lone \\ud800 surrogate")
    for v in verified:
        v.status.encode("utf-8")  # what Parquet stores


# ---------------------------------------------------------------- export --format verl

PROBED = '''
import os, time

def score(record, response):
    if response == "PROBE" and os.path.exists(record["flag"]):  # the reference response, which the verl export
        os._exit(5)                                              # scores for the reward names
    if response == "hang":
        time.sleep(1000)
    yield "short", float(len(response) < 20), "Be brief."
'''


@pytest.mark.slow
def test_export_verl_and_its_reward_function_run_plugins_in_a_worker_under_the_runs_bounds(tmp_path):
    from tokencredit.pipeline.integrations.verl import compute_score

    (tmp_path / "probed.py").write_text(textwrap.dedent(PROBED))
    flag = tmp_path / "flag"
    flag.write_text("exit")
    lines = [{"id": f"h{i}", "task": "haiku", "prompt": "Write a haiku.", "reference_response": "PROBE",
              "flag": str(flag)} for i in range(2)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = tmp_path / "run"
    assert main(["annotate", "--out", str(run), "--prompts", str(tmp_path / "p.jsonl"), "--verifier",
                 f"haiku={tmp_path / 'probed.py'}:score", "--n", "2", "--max-new-tokens", "8", "--runner", "none",
                 "--verifier-timeout", "3"]) == 0
    export = [sys.executable, "-m", "tokencredit.flows.cli", "export", str(run), "--format", "verl"]
    done = subprocess.run(export, capture_output=True, text=True, timeout=600)  # in this process it would end pytest
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "tokencredit export: error: record 'h0': the verifiers failed on its reference response (for the reward "
        "names): the verifier process exited with status 5 (os._exit or a crash) on this response")
    flag.unlink()
    assert subprocess.run(export, capture_output=True, text=True, timeout=600).returncode == 0
    row = pq.read_table(run / "export-verl.parquet").to_pylist()[0]
    assert json.loads(row["extra_info"]["verifier_bounds"]) == [3.0, 2_000_000_000]  # the run's
    assert compute_score(row["data_source"], "fine", extra_info=row["extra_info"])["short"] == 1.0
    with pytest.raises(isolation.VerifierFailed, match="ran past 3 s"):
        compute_score(row["data_source"], "hang", extra_info=row["extra_info"])


EXITS = '''
import os

def score(record, response):
    if response == "exit":
        os._exit(5)
    yield "short", float(len(response) < 20), "Be brief."
'''


def test_the_verl_reward_function_runs_plugins_in_a_worker(tmp_path):
    from tokencredit.pipeline.dataset.export import record_json, refs_json
    from tokencredit.pipeline.integrations.verl import compute_score

    ref = plugin(tmp_path, EXITS)
    extra = {"record": json.dumps(record_json(record(tmp_path))), "verifiers": refs_json((ref,))}
    assert compute_score("tokencredit/haiku", "fine", extra_info=extra)["short"] == 1.0
    with pytest.raises(isolation.VerifierFailed, match=r"^the verifier process exited with status 5 \(os._exit or a "
                                                       r"crash\) on this response$"):
        compute_score("tokencredit/haiku", "exit", extra_info=extra)  # in this process it would end pytest


def test_the_trl_reward_functions_run_plugins_in_a_worker(tmp_path, caplog):
    from tokencredit.pipeline.integrations.trl import VerifierRewards

    ref = plugin(tmp_path, EXITS)
    rewards = VerifierRewards({"h1": record(tmp_path)}, (ref,))
    assert rewards.names == ["short"]
    assert rewards.functions[0](["fine", "exit"], record_id=["h1", "h1"]) == [1.0, None]
    assert rewards.last[2][1] == ("verifier_error: the verifier process exited with status 5 (os._exit or a crash) "
                                  "on this response")  # as annotate stores it
