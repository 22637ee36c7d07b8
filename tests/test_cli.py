"""The command line: starts without torch, shows defaults, rejects what it does not use, one-line errors,
and Prefect settings that hold under load."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tokencredit.flows import cli
from tokencredit.flows.cli import main
from tests.test_progress import without_phases

ROOT = Path(__file__).resolve().parent.parent


def python(code: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_the_cli_starts_without_torch_transformers_prefect_or_duckdb():
    code = ("import sys; from tokencredit.flows import cli; cli.build_parser().format_help(); "
            "print([m for m in ('torch', 'transformers', 'prefect', 'duckdb') if m in sys.modules])")
    done = python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert python("from tokencredit.flows.cli import main; main(['--help'])").returncode == 0


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["annotate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("(default: native)", "(default: gdpo,mrtpo)", "default: 16 of the demo set", "(default: 96)",
                  "(default: threads)", "(default: 8)", "(default: logprob_signed)"):
        assert shown in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_a_task_with_no_record_in_the_prompt_set_is_rejected(tmp_path, capsys):
    """Tasks are whatever the prompt set holds (plugins add their own), so the check is against it."""
    assert main(["annotate", "--out", str(tmp_path / "run"), "--tasks", "sql,math", "--runner", "none"]) == 2
    err = "\n".join(without_phases(capsys.readouterr().err))
    assert len(err.splitlines()) == 1 and "demo has no record of tasks math (its tasks: instructions, sql, tools)" in err, err


@pytest.mark.parametrize("refused", [["--tasks", "sql,math"], ["--prompts", "unreadable.jsonl"]])
def test_a_refused_input_loads_no_model(tmp_path, monkeypatch, refused):
    """annotate imports its models' modules on a thread while the inputs are checked (the engine's start overlaps
    the checks); a refused input, or a prompt set whose every record is rejected, ends that thread before any model
    loads."""
    import threading

    from tokencredit.pipeline import annotate

    monkeypatch.chdir(tmp_path)
    (tmp_path / "unreadable.jsonl").write_text("{\n")
    loads = annotate._load_models.cache_info()
    assert main(["annotate", "--out", "run", *refused, "--backend", "transformers",
                 "--runner", "none"]) == 2  # refused by the checks (auto's choice would read the prompts before)
    for thread in [t for t in threading.enumerate() if t.name == "preload-models"]:
        thread.join(timeout=300)
        assert not thread.is_alive()
    after = annotate._load_models.cache_info()
    assert (after.hits, after.misses) == (loads.hits, loads.misses)


@pytest.mark.parametrize("flag", [["--runner", "dask"], ["--workers", "4"], ["--run-id", "x"], ["--strict"],
                                  ["--dask-address", "tcp://127.0.0.1:8786"]])
def test_serve_rejects_flags_it_does_not_use(capsys, flag):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--out", "x", "--cron", "0 3 * * *", *flag])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "unrecognized arguments" in err


@pytest.mark.parametrize("argv, message", [
    (["annotate", "--out", "{tmp}/run", "--prompts", "{tmp}/missing.jsonl", "--runner", "none"], "no task file"),
    (["annotate", "--out", "{tmp}/run", "--model", "{tmp}/no-model", "--runner", "none"], "no such local folder"),
    (["annotate", "--out", "{tmp}/run", "--model", "smollm2-135m", "--runner", "none"],
     "did you mean 'smollm2-135m-instruct'?; tokencredit never downloads weights: pass a registry name "
     "(tokencredit models list: smollm2-135m-instruct"),
    (["query", "{tmp}/nowhere", "SELECT 1"], "is not a tokencredit run directory"),
    (["train", "--data", "{tmp}/nowhere", "--out", "{tmp}/ckpt"], "is not a tokencredit run directory"),
    (["report", "{tmp}/nowhere"], "is not a tokencredit run directory"),
])
def test_user_errors_are_one_line_with_exit_status_2(tmp_path, capsys, argv, message):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = "\n".join(without_phases(capsys.readouterr().err))
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("value", ["0", "false", "No", "", "off"])
def test_tokencredit_debug_off_values_keep_the_one_line_error(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("TOKENCREDIT_DEBUG", value)
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a tokencredit run directory" in err, err


@pytest.mark.parametrize("value", ["1", "true", "YES", " True "])
def test_tokencredit_debug_on_values_raise_for_the_traceback(tmp_path, monkeypatch, value):
    monkeypatch.setenv("TOKENCREDIT_DEBUG", value)
    with pytest.raises(FileNotFoundError, match="is not a tokencredit run directory"):
        main(["report", str(tmp_path / "nowhere")])


def test_unreadable_prompt_lines_are_reported_once_each_in_plain_words(tmp_path, capsys):
    prompts = tmp_path / "bad.jsonl"
    prompts.write_text('{"id": "a", "task": "sql", "prompt": "x\n'  # a string never closed
                       '{"id": "b", "task": "sql", "prompt": "y",}\n'
                       '[1]\n')
    assert main(["annotate", "--prompts", str(prompts), "--out", str(tmp_path / "run"), "--runner", "none"]) == 2
    lines = without_phases(capsys.readouterr().err)
    assert lines[1:4] == ["  bad.jsonl line 1: invalid JSON: Unterminated string starting at column 38",
                          "  bad.jsonl line 2: invalid JSON: Expecting property name enclosed in double quotes at column 42",
                          "  bad.jsonl line 3: expected a JSON object, got a list"], lines


def test_prefect_start_timeout_is_set_unless_the_user_set_one(monkeypatch):
    monkeypatch.delenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", raising=False)
    cli._prefect_settings()
    assert os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == str(cli.PREFECT_START_TIMEOUT_S)
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "42")
    cli._prefect_settings()
    assert os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "42"


@pytest.mark.slow
def test_a_temporary_server_that_fails_to_start_says_what_happened_and_what_to_do(tmp_path):
    """A real failure: Prefect's temporary server cannot open its database (in a folder that does not exist). The one
    line says what happened: its exit status, the error it printed, the seconds it took (not a start timeout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(tmp_path / "prefect"),
               PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path / 'missing' / 'prefect.db'}")
    done = subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", "annotate", "--out", str(tmp_path / "run"),
                           "--limit", "1", "--n", "2", "--tasks", "tools", "--credit", "gdpo"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("tokencredit annotate: error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert re.fullmatch(r"tokencredit annotate: error: Prefect's temporary API server exited with status \d+ after "
                        r"(\d+) s, before it answered: \S*OperationalError: .*unable to open database file.*; rerun "
                        r"with --runner none .* set PREFECT_API_URL to its API", errors[0]), errors[0]
    assert "Traceback" not in done.stderr
    assert not list((tmp_path / "run" / "_shards").glob("*.json"))


@pytest.mark.slow
def test_a_temporary_server_that_does_not_answer_in_time_is_named_with_its_wait():
    """A server frozen before it answers (SIGSTOP: as a machine too busy to run it): `wait` gives up after its
    timeout, saying so, instead of waiting for ever."""
    from tokencredit.flows.prefect_server import TemporaryServer

    server = TemporaryServer()
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(RuntimeError, match=r"temporary API server did not answer at http://127\.0\.0\.1:\d+/api "
                                               r"within 3 s \(a busy machine\?\); its last line: "):
            server.wait(3)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()
    assert server.process.poll() is not None


@pytest.mark.slow
def test_a_deterministic_shard_error_is_not_retried(prefect_harness, tmp_path):
    import torch
    from prefect.client.orchestration import get_client

    from tokencredit.flows.annotate import run_annotate_flow
    from tokencredit.pipeline.config import AnnotateConfig, SamplingConfig

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA (the shard fails moving the model to 'cuda')")
    config = AnnotateConfig(limit=1, tasks=("tools",), device="cuda", sampling=SamplingConfig(n=2))
    with pytest.raises(Exception) as failure:
        run_annotate_flow(config, str(tmp_path / "run"), run_id="no-retry", progress=False)
    assert "CUDA" in str(failure.value)
    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_task_runs() if r.name.startswith("annotate-window")
                and r.state is not None and r.state.is_failed()]
    assert runs and all(r.run_count == 1 for r in runs), [(r.name, r.run_count) for r in runs]


def test_only_transient_errors_are_retried():
    from prefect.states import Failed

    from tokencredit.flows.annotate import annotate_window_task, is_transient

    assert annotate_window_task.retry_condition_fn is is_transient and annotate_window_task.retries == 2
    for error in (ConnectionResetError("peer"), TimeoutError("slow"), OSError(5, "I/O error")):
        assert is_transient(None, None, Failed(data=error)), error
    for error in (FileNotFoundError("model"), ValueError("bad record"), RuntimeError("shape"), KeyError("x"),
                  PermissionError("denied")):
        assert not is_transient(None, None, Failed(data=error)), error


def test_cli_errors_name_the_flag_in_one_line(capsys):
    with pytest.raises(SystemExit):
        main(["annotate", "--out", "x", "--credit", "gdpo,magic"])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown credit kind(s) ['magic']" in err


def test_limit_is_16_per_task_of_the_demo_and_every_record_of_a_users_file(tmp_path):
    from tokencredit.pipeline.annotate import load_prompt_set

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "h{i}", "task": "haiku", "prompt": "Write a haiku."}}\n' for i in range(20)))

    def config(*argv):
        return cli.annotate_config(cli.build_parser().parse_args(["annotate", "--out", "x", *argv]))

    assert config().limit == 16 and config("--limit", "0").limit is None and config("--limit", "3").limit == 3
    own = config("--prompts", str(prompts), "--verifier", f"haiku={PLUGIN}:objects")
    assert own.limit is None and len(load_prompt_set(own)[0]) == 20
    assert config("--prompts", str(prompts), "--verifier", f"haiku={PLUGIN}:objects", "--limit", "5").limit == 5


PLUGIN = Path(__file__).resolve().parent / "test_plugins.py"


def test_rejections_are_shown_before_the_run_which_leaves_no_lock_and_no_repeated_lines(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "h1", "task": "haiku", "prompt": "Write a haiku about the sea.", "topic": "sea"}\n'
                       '{"id": "h2", "task": "haiku"}\n'
                       '{"id": "h3", "task": "haiku", "prompt": "Write a haiku.", "split": "dev"}\n')
    out = tmp_path / "run"
    assert main(["annotate", "--out", str(out), "--prompts", str(prompts), "--verifier", f"haiku={PLUGIN}:objects",
                 "--runner", "none", "--n", "2", "--max-new-tokens", "8", "--credit", "gdpo"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in without_phases(err) if line.strip()]
    assert lines[:3] == [f"2 prompt records rejected (all of them will be in {out}/rejected.jsonl):",
                         "  p.jsonl line 2, field 'prompt': missing (expected a non-empty string)",
                         "  p.jsonl line 3, field 'split': expected 'train' or 'test', got 'dev'"]
    assert err.index("rejected (all") < err.index("sampling:")  # before any model ran
    assert len(lines) == len(set(lines)), err  # each progress line once
    assert not (out / ".lock").exists() and (out / "manifest.json").exists()


def test_a_typo_in_a_verifiers_task_is_named(tmp_path, capsys):
    """`--verifier fact=...` against records of task `facts`: the errors name the typo, not only the file's task."""
    facts = tmp_path / "facts.jsonl"
    facts.write_text("".join(f'{{"id": "f{i}", "task": "facts", "prompt": "Name a fact."}}\n' for i in range(2)))
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(facts.read_text() + '{"id": "h1", "task": "haiku", "prompt": "Write a haiku."}\n')
    typo = ["--verifier", f"fact={PLUGIN}:objects", "--runner", "none"]
    assert main(["annotate", "--prompts", str(mixed), "--out", str(tmp_path / "a"), *typo,
                 "--verifier", f"haiku={PLUGIN}:objects"]) == 2
    err = "\n".join(without_phases(capsys.readouterr().err))
    assert err == (f"tokencredit annotate: error: --verifier fact={PLUGIN}:objects: the prompt set {mixed} has no "
                   "record of task 'fact' (its tasks: haiku; 2 records rejected)"), err
    assert main(["annotate", "--prompts", str(facts), "--out", str(tmp_path / "b"), *typo]) == 2
    lines = without_phases(capsys.readouterr().err)
    assert lines[1].startswith("  facts.jsonl line 1, field 'task': unknown task 'facts'") and \
        lines[1].endswith("on the command line --verifier facts=module:function; the plugin tasks given: 'fact')"), lines
