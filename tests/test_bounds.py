"""Per-record bounds: an over-long prompt is rejected by name before any model loads, the rest of its
shard is annotated; chat templates render under a time bound; a sandbox refusal is one line; a
built-in verifier's call is bounded on a thread."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from jinja2.exceptions import TemplateError

from tokencredit.pipeline.annotate import load_prompt_set
from tokencredit.pipeline.sample.bounds import BoundedCaller, CallAborted, CallTimeout, render_bounded
from tokencredit.pipeline.config import AnnotateConfig
from tokencredit.pipeline.models.loading import DEFAULT_POLICY, load_tokenizer
from tokencredit.schemas.records import InstructionSpec, TaskRecord
from tests.test_progress import without_phases

ROOT = Path(__file__).resolve().parent.parent
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x"
UNSAFE = "{{ ''.__class__.__mro__ }}"


def record(record_id: str, prompt: str) -> TaskRecord:
    return TaskRecord(record_id, "instructions", prompt, "ok", InstructionSpec(()))


def policy_with_template(folder: Path, template: str) -> Path:
    """A copy of the shipped tiny policy whose tokenizer has `template` as its chat template."""
    shutil.copytree(DEFAULT_POLICY, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return folder


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The CLI in a child process, reporting its peak resident memory (KiB) on the last stderr line."""
    code = ("import resource, sys; from tokencredit.flows.cli import main; rc = main(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


def test_a_template_that_raises_on_one_record_rejects_that_record(tmp_path):
    template = ("{% for m in messages %}{% if 'forbidden' in m['content'] %}"
                "{{ raise_exception('no forbidden words') }}{% endif %}{{ m['content'] }}{% endfor %}")
    model = policy_with_template(tmp_path / "policy", template)
    demo = json.loads((ROOT / "verifiers/demo/tools.jsonl").read_text().splitlines()[0])
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(demo) + "\n" + json.dumps({**demo, "id": "bad", "prompt": "a forbidden word"}) + "\n")
    records, rejected = load_prompt_set(AnnotateConfig(prompts=str(prompts), model=str(model), limit=None))
    assert [r.id for r in records] == [demo["id"]]
    assert [(r.record_id, r.line_no) for r in rejected] == [("bad", 2)] and "no forbidden words" in rejected[0].reason


@pytest.mark.parametrize("in_thread", [False, True])
def test_a_template_with_nested_loops_is_stopped(in_thread):
    tokenizer = load_tokenizer()
    tokenizer.chat_template = NESTED_LOOPS
    errors = []

    def render():
        try:
            render_bounded(tokenizer, record("loop", "hi"), seconds=0.5)
        except ValueError as error:
            errors.append(error)

    start = time.monotonic()
    if in_thread:  # Dask and thread-runner workers render off the main thread
        worker = threading.Thread(target=render)
        worker.start()
        worker.join(60)
    else:
        render()
    assert time.monotonic() - start < 30
    assert len(errors) == 1 and "ran past 0.5 s" in str(errors[0]) and "'loop'" in str(errors[0])


def test_a_sandbox_refusal_is_a_value_error_naming_the_template():
    tokenizer = load_tokenizer()
    tokenizer.chat_template = UNSAFE
    with pytest.raises(ValueError, match="refused by Jinja's sandbox"):
        render_bounded(tokenizer, record("a", "hi"))
    tokenizer.chat_template = "{{ raise_exception('bad') }}"
    with pytest.raises(TemplateError):  # not the template's fault in general: the caller rejects the record
        render_bounded(tokenizer, record("a", "hi"))


@pytest.mark.slow
def test_a_one_megabyte_prompt_is_rejected_and_its_shard_annotated(tmp_path):
    demo = [json.loads(line) for line in (ROOT / "verifiers/demo/tools.jsonl").read_text().splitlines()[:2]]
    huge = {**demo[0], "id": "huge-prompt", "prompt": "Call the tool for each city: " + "Lima, Cairo, " * 80_000}
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in (demo[0], huge, demo[1])))
    assert len(huge["prompt"]) > 1_000_000
    out = tmp_path / "run"
    result = run_cli("annotate", "--out", str(out), "--prompts", str(prompts), "--limit", "0", "--n", "2",
                     "--max-new-tokens", "16", "--shard-size", "8", "--runner", "none")
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stderr.splitlines()[-1]) < 3 * 1024 * 1024, "peak memory over 3 GiB"
    rejected = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert [(r["record_id"], r["line_no"]) for r in rejected] == [("huge-prompt", 2)]
    assert "cannot fit the model's context of 512 tokens" in rejected[0]["reason"]
    groups = set(ds.dataset(out / "responses", format="parquet").to_table()["group_id"].to_pylist())
    assert groups == {demo[0]["id"], demo[1]["id"]}  # the rest of the shard


@pytest.mark.slow
@pytest.mark.parametrize("template, message", [(NESTED_LOOPS, "ran past"), (UNSAFE, "refused by Jinja's sandbox")])
def test_a_bad_template_stops_the_run_with_one_line(tmp_path, template, message):
    model = policy_with_template(tmp_path / "policy", template)
    start = time.monotonic()
    result = run_cli("annotate", "--out", str(tmp_path / "run"), "--model", str(model), "--limit", "1",
                     "--n", "2", "--tasks", "tools", "--runner", "none", timeout=300)
    assert result.returncode == 2 and time.monotonic() - start < 120
    lines = without_phases(result.stderr)[:-1]  # the last line is the peak memory
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_a_user_error_inside_the_prefect_flow_is_one_line_without_traceback(tmp_path):
    """A reward model of two labels is found where the shard loads its models, inside a Prefect task:
    the error is still one line, with no traceback from Prefect's log."""
    from tokencredit.pipeline.models.loading import DEFAULT_REWARD_MODEL

    rm = tmp_path / "reward-model"
    shutil.copytree(DEFAULT_REWARD_MODEL, rm)
    config = json.loads((rm / "config.json").read_text())
    config["id2label"], config["label2id"] = {"0": "bad", "1": "good"}, {"bad": 0, "good": 1}
    (rm / "config.json").write_text(json.dumps(config))
    result = run_cli("annotate", "--out", str(tmp_path / "run"), "--reward-model", str(rm), "--credit", "gdpo,p2t",
                     "--limit", "1", "--n", "2", "--tasks", "tools", timeout=900)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("tokencredit annotate: error:")]
    assert len(errors) == 1 and "has num_labels=2; a reward model has one output" in errors[0]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


def test_a_bounded_call_past_its_time_is_abandoned_and_an_exit_in_one_is_its_own_failure():
    call = BoundedCaller(0.5)
    try:
        with pytest.raises(CallTimeout, match=r"ran past 0.5 s"):
            call(threading.Event().wait)  # never set: blocks for good
        assert call(sum, [1, 2]) == 3  # on a fresh thread
        with pytest.raises(CallAborted, match=r"^SystemExit\(3\)$"):
            call(sys.exit, 3)
        with pytest.raises(ZeroDivisionError):
            call(divmod, 1, 0)
    finally:
        call.close()
