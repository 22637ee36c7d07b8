"""Progress of sampling, replay and P2T: log lines with tokens/s without a terminal, a bar on one; phases announced
before they start and heard from every few seconds; the commands' lines read from runs without a terminal."""
from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tokencredit import verifiers
from tokencredit.pipeline.annotate import annotate_shard, complete_run, load_models
from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig
from tokencredit.pipeline.progress import LOG_EVERY_S, Phase, Progress
from tokencredit.pipeline.sample.engine_output import CHUNKED_PREFILL_NOTE
from tokencredit.pipeline.credit.replay import ReplayItem, ReplayStats, replay_distances

LINE = re.compile(r"^(sampling|replay|p2t): ([\d,]+)/([\d,]+) (responses|tokens)(, ([\d,]+) tokens)?, "
                  r"([\d,]+) tokens/s, \d+ s$")


def test_each_long_stage_logs_its_progress_with_tokens_per_second(capsys):
    config = AnnotateConfig(sampling=SamplingConfig(n=4, max_new_tokens=24, seed=4),
                            credit=CreditConfig(kinds=("gdpo", "mrtpo", "p2t"), locate="replay"))
    demo = verifiers.load_tasks("demo")[0]
    records = [next(r for r in demo if r.task == task) for task in ("sql", "tools")]
    capsys.readouterr()
    tables, stats = annotate_shard(records, 0, config, load_models(config))
    lines = {m.group(1): m for m in map(LINE.match, capsys.readouterr().err.splitlines()) if m}
    assert set(lines) == {"sampling", "replay", "p2t"}
    responses = tables["responses"].num_rows
    sampled = sum(map(len, tables["responses"]["token_ids"].to_pylist()))
    assert lines["sampling"].group(2) == lines["sampling"].group(3) == str(responses)
    assert int(lines["sampling"].group(6).replace(",", "")) == sampled
    assert stats["tokens_replayed"] > 0  # seed 4: some groups have variance, so the replay runs
    assert int(lines["replay"].group(2).replace(",", "")) == stats["tokens_replayed"]  # every replayed token
    assert lines["p2t"].group(2) == str(responses) and int(lines["p2t"].group(6).replace(",", "")) == sampled
    assert all(int(m.group(7).replace(",", "")) > 0 for m in lines.values())


def test_replay_reports_every_replayed_token(tiny_causal_lm):
    items = [ReplayItem([1, 5, 6, 7], [[1, 5, 7], None, [1, 6, 7]], [9, 10, 11]),
             ReplayItem([1, 5, 8], [None, None], [12, 13]),
             ReplayItem([1, 4, 4, 4], [[1, 4]], [20, 21, 22, 23])]
    seen, stats = [], ReplayStats()
    replay_distances(tiny_causal_lm, items, batch_size=2, stats=stats, on_progress=seen.append)
    assert sum(seen) == stats.tokens_replayed == 2 * 3 + 4 and len(seen) >= 1


def test_without_a_terminal_a_line_at_most_every_few_seconds_and_at_the_end_never_twice():
    often, rarely = io.StringIO(), io.StringIO()
    for stream, every in ((often, 0.0), (rarely, 3600.0)):
        with Progress("replay", total=40, unit="token", stream=stream, every=every) as progress:
            for _ in range(4):
                progress.update(10)
    assert [line.split(",")[0] for line in often.getvalue().splitlines()] == [
        "replay: 10/40 tokens", "replay: 20/40 tokens", "replay: 30/40 tokens", "replay: 40/40 tokens"]
    assert [line.split(",")[0] for line in rarely.getvalue().splitlines()] == ["replay: 40/40 tokens"]
    assert "tokens/s" in rarely.getvalue()


def read_until(fd: int, done, seconds: float = 60.0) -> str:
    """What the terminal shows once `done(text)` holds, the writer closed it, or `seconds` passed:
    on a loaded machine the final redraw may arrive after the first read."""
    text, deadline = "", time.monotonic() + seconds
    while not done(text) and select.select([fd], [], [], max(deadline - time.monotonic(), 0))[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side is closed and everything it wrote has been read
            break
        if not chunk:
            break
        text += chunk.decode(errors="replace")
    return text


def test_on_a_terminal_a_bar():
    primary, secondary = os.openpty()
    with os.fdopen(secondary, "w") as tty:
        with Progress("sampling", total=4, unit="response", stream=tty) as progress:
            progress.update(2, tokens=50)
            progress.update(2, tokens=30)
        tty.flush()
        drawn = read_until(primary, lambda text: "4/4" in text and "tokens/s" in text.rpartition("4/4")[2])
    os.close(primary)
    assert "sampling" in drawn and "4/4" in drawn and "tokens/s" in drawn


def test_a_phase_is_announced_before_it_starts_and_heard_from_while_it_lasts():
    stream, every = io.StringIO(), 0.2
    with Phase("loading the policy x", stream=stream, every=every) as phase:
        assert stream.getvalue() == "loading the policy x ...\n"
        deadline = time.monotonic() + 60
        while stream.getvalue().count("\n") < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        phase.mark()
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3 and all(re.fullmatch(r"loading the policy x: \d+ s", line) for line in lines[1:])
    time.sleep(3 * every)
    assert stream.getvalue().splitlines() == lines  # nothing once it is over
    quiet = io.StringIO()
    with Phase("x", stream=quiet, enabled=False):
        pass
    assert quiet.getvalue() == ""


def test_a_unit_that_takes_long_is_heard_from_and_nothing_is_once_closed():
    stream, every = io.StringIO(), 0.2
    with Progress("sampling", total=4, unit="response", stream=stream, every=every) as progress:
        deadline = time.monotonic() + 60
        while stream.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # no unit done yet: a slow first batch
        progress.update(4, tokens=40)
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 3 and all(LINE.match(line) for line in lines)
    assert lines[0].startswith("sampling: 0/4 responses, 0 tokens, ") and lines[-1].startswith("sampling: 4/4 ")
    time.sleep(3 * every)
    assert stream.getvalue().splitlines() == lines


# ---- the commands without a terminal: every line's time, read as it comes

ROOT = Path(__file__).resolve().parent.parent
# A line at least every LOG_EVERY_S is the promise; the gaps allowed here are three times it, for a loaded machine
# (a heartbeat waits while an import or a C call holds the interpreter), and still catch a silent half-minute.
MAX_GAP_S = 3 * LOG_EVERY_S


def timed_run(*args: str, timeout: float = 900, env: dict | None = None) -> tuple[int, list[tuple[float, str]], str]:
    """`tokencredit ARGS` with pipes for output: (exit status, (seconds since start, line) of each stderr line as it
    arrived, stdout)."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "DO_NOT_TRACK": "1", **(env or {})}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))
    reader.start()
    lines = [(time.monotonic() - start, line.rstrip("\n")) for line in proc.stderr]
    proc.wait(timeout=timeout)
    reader.join()
    return proc.returncode, lines, "".join(out)


PHASE = re.compile(r".+ \.\.\.|.+: \d+ s")  # Phase's lines: '<what> ...' and '<what>: 5 s'


def without_phases(err: str) -> list[str]:
    """The lines of `err` that are not a phase's announcement or heartbeat (an error is one line among them)."""
    return [line for line in err.strip().splitlines() if not PHASE.fullmatch(line)]


def longest_silence(lines: list[tuple[float, str]]) -> float:
    """The longest time between two stderr lines, from the first line on (the interpreter's own start before it
    is not the command's)."""
    times = [t for t, _ in lines]
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def annotated(tmp_path_factory) -> tuple[Path, list[tuple[float, str]]]:
    """A small complete run, written without a terminal, and that run's stderr lines."""
    out = tmp_path_factory.mktemp("progress") / "demo"
    status, lines, stdout = timed_run("annotate", "--out", str(out), "--limit", "1", "--n", "4",
                                      "--max-new-tokens", "16", "--runner", "none")
    assert status == 0, "\n".join(line for _, line in lines)[-2000:]
    return out, lines


@pytest.fixture
def demo_run(annotated) -> Path:
    return annotated[0]


@pytest.mark.slow
def test_annotate_says_what_it_does_before_each_phase_and_never_falls_silent(annotated):
    said = [line for _, line in annotated[1]]
    first = {name: next(i for i, line in enumerate(said) if line.startswith(name))
             for name in ("annotate: loading torch, reading the prompt set", "loading the policy", "sampling: ")}
    assert first["annotate: loading torch, reading the prompt set"] == 0
    assert first["loading the policy"] < first["sampling: "]
    assert longest_silence(annotated[1]) <= MAX_GAP_S, annotated[1]


@pytest.mark.slow
def test_a_complete_run_found_again_says_so_in_one_line_writes_nothing_and_starts_no_prefect(demo_run):
    before = snapshot(demo_run)
    # the default runner, with Prefect's API where nothing answers: a run that reached Prefect would fail
    status, lines, stdout = timed_run("annotate", "--out", str(demo_run), "--limit", "1", "--n", "4",
                                      "--max-new-tokens", "16", env={"PREFECT_API_URL": "http://127.0.0.1:9/api"})
    assert status == 0, lines
    assert len(stdout.splitlines()) == 1, stdout
    assert re.fullmatch(rf"{re.escape(str(demo_run))}: complete with this config and these inputs \(.*'responses': "
                        r"12.*\); nothing to do", stdout.strip())
    assert not any("loading the policy" in line or "Prefect" in line or "flow" in line for _, line in lines), lines
    assert snapshot(demo_run) == before


def test_a_folder_without_a_complete_run_is_left_as_it_was(tmp_path):
    """The no-op check reads; it makes no run folders where nothing was annotated yet."""
    assert complete_run(AnnotateConfig(), str(tmp_path / "fresh")) is None
    assert not (tmp_path / "fresh").exists()


@pytest.mark.slow
def test_train_prints_each_step_on_a_line_of_its_own_and_never_falls_silent(demo_run, tmp_path):
    status, lines, stdout = timed_run("train", "--data", str(demo_run), "--out", str(tmp_path / "ckpt"),
                                      "--steps", "3", "--batch-size", "2")
    assert status == 0, lines
    said = [line for _, line in lines]
    assert said[0] == "train: loading torch and transformers ..."
    assert any(line.startswith(f"train: reading {demo_run} and loading the policy") for line in said)
    steps = [line for line in said if re.match(r"train: step \d+/3, ", line)]
    assert [line.split(",")[0] for line in steps] == ["train: step 1/3", "train: step 2/3", "train: step 3/3"]
    assert all(re.fullmatch(r"train: step \d/3, loss \S+, kl \S+, mean advantage \S+, tokens \d+", s) for s in steps)
    assert not any("{'loss'" in line or "\r" in line or "it/s]" in line for line in said + stdout.splitlines())
    assert stdout.strip().startswith("final checkpoint: ")
    assert longest_silence(lines) <= MAX_GAP_S, lines


@pytest.mark.slow
def test_runs_resume_says_what_it_does_before_each_phase_and_never_falls_silent(demo_run, tmp_path):
    """A scheduled run stopped before its shard was marked written: `runs --resume` writes the shard again."""
    out = tmp_path / "runs"
    folder = out / "2026-12-05T03-00-00"
    shutil.copytree(demo_run, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    (folder / "_shards" / "shard-00000.json").unlink()
    status, lines, stdout = timed_run("runs", str(out), "--resume", folder.name)
    assert status == 0, lines
    said = [line for _, line in lines]
    assert said[0] == f"runs: resuming {folder} (its written shards are kept): loading torch ..."
    assert next(i for i, line in enumerate(said) if line.startswith("loading the policy")) < next(
        i for i, line in enumerate(said) if line.startswith("sampling: "))
    assert stdout.strip().startswith(f"wrote {{'responses': 12") and stdout.strip().endswith("(complete)")
    assert longest_silence(lines) <= MAX_GAP_S, lines


VLLM_LOG = re.compile(r"\b(INFO|WARNING|DEBUG)\b \d\d-\d\d ")  # vLLM's own log lines: 'INFO 12-07 11:12:50 [...]'


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (.ci/vllm-env builds the "
                    "engine's environment)")
@pytest.mark.parametrize("verbose", [False, True])
def test_an_engine_run_prints_the_transformers_runs_lines_and_explains_what_tokencredit_does_on_purpose(
        annotated, tmp_path, verbose):
    """The same `sampling:` line as the transformers backend, the engine's start announced, a line every few
    seconds; quiet, none of vLLM's log lines; verbose, its lines with the chunked-prefill warning explained first."""
    status, lines, stdout = timed_run("annotate", "--backend", "vllm", "--out", str(tmp_path / "engine"), "--limit",
                                      "1", "--n", "4", "--max-new-tokens", "16", "--runner", "none",
                                      *(["--verbose"] if verbose else []), env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert status == 0, lines
    said = [line for _, line in lines]
    start = said.index("starting the vllm engine (tokencredit/tiny-policy on cpu, float32) ...")
    sampling = [line for line in said if line.startswith("sampling: ")]
    assert sampling and all(LINE.match(line) for line in sampling), sampling
    assert sampling[-1].startswith("sampling: 12/12 responses, ")
    assert start < said.index(sampling[0])
    transformers_lines = [line for _, line in annotated[1] if line.startswith("sampling: ")]
    assert {LINE.match(line).group(1, 3, 4) for line in transformers_lines + sampling} == {("sampling", "12",
                                                                                           "responses")}
    assert not any(VLLM_LOG.search(line) for line in stdout.splitlines()), stdout  # the result, not a log
    vllm_lines = [line for line in said if VLLM_LOG.search(line)]
    if verbose:
        note = said.index(CHUNKED_PREFILL_NOTE)
        warned = [i for i, line in enumerate(said) if "disabling chunked prefill" in line.lower()]
        assert vllm_lines and warned and note < warned[0], said
    else:
        assert not vllm_lines and CHUNKED_PREFILL_NOTE not in said, vllm_lines
        assert not any("chunked prefill" in line.lower() or "Processed prompts" in line for line in said)
    assert longest_silence(lines) <= MAX_GAP_S, lines


def test_a_run_found_again_is_known_without_torch_and_an_edited_prompt_file_is_not(tmp_path):
    """The found-again check reads the manifest and hashes the recorded inputs: in a fresh process it says
    'nothing to do' with torch never imported; once a prompt file changes it finds nothing and the full checks
    refuse the run's other inputs."""
    from tokencredit.flows.cli import _found_complete, annotate_config, build_parser, main
    from tokencredit.pipeline.annotate import run_annotation
    from tokencredit.verifiers.tasks import demo_dir

    prompts, out = tmp_path / "demo", tmp_path / "run"
    shutil.copytree(demo_dir(), prompts)
    argv = ["annotate", "--out", str(out), "--prompts", str(prompts), "--tasks", "sql", "--limit", "1", "--n", "2",
            "--max-new-tokens", "8", "--runner", "none", "--backend", "transformers"]
    run_annotation(annotate_config(build_parser().parse_args(argv)), str(out), progress=False)
    script = ("import sys; from tokencredit.flows.cli import main; "
              f"code = main({argv!r}); print(code, 'torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].endswith("nothing to do") and done.stdout.splitlines()[-1] == "0 False False"
    edited = next(prompts.rglob("*.jsonl"))
    edited.write_text(edited.read_text() + "\n")
    assert _found_complete(build_parser().parse_args(argv)) is None
    assert main(argv) == 2  # the full checks name the changed input



def test_verbose_shows_the_engine_log_even_where_a_quiet_run_set_its_level(monkeypatch):
    """A quiet engine import leaves VLLM_LOGGING_LEVEL=ERROR in the process's environment, which the processes it
    starts inherit; `--verbose` in one of them still shows the engine's INFO lines."""
    from tokencredit.pipeline.sample.engine_output import VERBOSE_ENV, quiet_import

    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "ERROR")
    monkeypatch.setenv(VERBOSE_ENV, "1")
    with quiet_import():
        pass
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
