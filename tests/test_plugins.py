"""Plugin verifiers: the README example through the CLI, the Python API, entry points, Dask workers,
the source hash in the dataset identity, and a misbehaving plugin marking only its responses."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from tokencredit import verifiers
from tokencredit.pipeline.annotate import AnnotateConfig, verify_samples
from tokencredit.schemas.records import PluginSpec, RecordError, RewardScore, Sample, TaskRecord
from tokencredit.verifiers import plugins
from tokencredit.verifiers.trl_rewards import trl_verifier

ROOT = Path(__file__).resolve().parents[1]
HAIKU = '''
def haiku(record, response):
    lines = [line for line in response.splitlines() if line.strip()]
    yield "three_lines", float(len(lines) == 3), "Write exactly three lines.", f"{len(lines)} lines"
    yield "on_topic", float(record["topic"] in response.lower()), f"Mention the {record['topic']}."
'''


def readme_example(index: int = 0) -> str:
    """The `index`-th bash block of the "your own tasks" page's plugin section (docs/own-tasks.md)."""
    page = (ROOT / "docs" / "own-tasks.md").read_text()
    section = page[page.index("## A verifier of your own"):page.index("## The native prompt format")]
    return re.findall(r"```bash\n(.*?)```", section, re.DOTALL)[index]


def run_as_a_user(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    """`script` run as a user would: a console script whose sys.path does not hold the current
    folder, so the verifier module is found there by the plugin loader itself."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "tokencredit").write_text(f"#!{sys.executable}\nimport sys\nfrom tokencredit.flows.cli import main\n"
                                         "sys.exit(main())\n")
    (bin_dir / "tokencredit").chmod(0o755)
    (tmp_path / "work").mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path / "work", env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_the_readme_example_runs_through_the_cli(tmp_path):
    """The README's 15 lines, as a user runs them."""
    script = readme_example()
    assert len(script.strip().splitlines()) <= 16
    done = run_as_a_user(tmp_path, script)
    work = tmp_path / "work"
    assert "h1/0" in done.stdout and "three_lines" in done.stdout
    rows = ds.dataset(work / "runs/haiku/responses").to_table().to_pylist()
    assert len(rows) == 8 and {r["status"] for r in rows} == {"ok"}
    assert all(r["reward_names"] == ["three_lines", "on_topic"] for r in rows)
    for row in rows:  # the stored scores are the plugin's own verdicts on the stored responses
        lines = [line for line in row["response"].splitlines() if line.strip()]
        topic = "sea" if row["group_id"] == "h1" else "snow"
        assert row["rewards"] == [float(len(lines) == 3), float(topic in row["response"].lower())]
        assert row["feedback"] == ["Write exactly three lines.", f"Mention the {topic}."]
        assert row["observed"] == [f"{len(lines)} lines", ""]


@pytest.mark.slow
def test_the_readmes_trl_reward_function_example_runs_through_the_cli(tmp_path):
    files = readme_example(0).split("tokencredit annotate")[0]  # its haiku.jsonl
    run_as_a_user(tmp_path, files + readme_example(1))
    rows = ds.dataset(tmp_path / "work/runs/haiku-trl/responses").to_table().to_pylist()
    assert len(rows) == 8 and {r["status"] for r in rows} == {"ok"}
    for row in rows:
        assert row["reward_names"] == ["short"] and row["feedback"] == ["Keep it under 80 characters."]
        assert row["rewards"] == [pytest.approx(min(1.0, max(0.0, (80 - len(row["response"])) / 80)))]


def plugin_record(**fields) -> TaskRecord:
    obj = {"id": "h1", "task": "haiku", "prompt": "Write a haiku.", "topic": "sea", **fields}
    return TaskRecord(obj["id"], obj["task"], obj["prompt"], None, PluginSpec(obj))


def test_python_api_resolves_a_file_target_and_scores(tmp_path):
    (tmp_path / "haiku.py").write_text(HAIKU)
    (ref,) = plugins.resolve([f"haiku={tmp_path / 'haiku.py'}:haiku"])
    assert ref.task == "haiku" and ref.target == f"{(tmp_path / 'haiku.py').resolve()}:haiku"
    assert len(ref.source_sha256) == 64
    scores = verifiers.verify(plugin_record(), "sea waves\nsalt wind\nthe sea", [ref])
    assert scores == [RewardScore("three_lines", 1.0, "Write exactly three lines.", "3 lines"),
                      RewardScore("on_topic", 1.0, "Mention the sea.", "")]


class Verdict:
    def __init__(self, name, score, feedback):
        self.name, self.score, self.feedback = name, score, feedback


def objects(record, response):
    return [Verdict("long", min(1.0, len(response) / 100), "Write 100 characters.")]


def test_objects_with_attributes_and_a_task_free_plugin_after_the_built_in_rewards():
    ref = plugins.PluginRef(f"{__name__}:objects")  # no task: every record
    sql = next(r for r in verifiers.load_tasks("demo")[0] if r.task == "sql")
    scores = verifiers.verify(sql, sql.reference_response, [ref])
    assert [s.name for s in scores] == ["format", "executable", "execution", "long"]
    assert scores[-1].score == pytest.approx(len(sql.reference_response) / 100)
    assert plugins.record_dict(sql)["reference_sql"] == sql.spec.reference_sql


def bad_score(record, response):
    return [("x", 1.5, "?")]


def bad_shape(record, response):
    return "1.0"


class NanFloat(float):
    """A float whose own value passes every range check, but whose conversion is NaN."""

    def __float__(self):
        return float("nan")


def nan_subclass(record, response):
    return [("x", NanFloat(0.5), "?")]


def nan_score(record, response):
    return [("x", float("nan"), "?")]


def varying(record, response):
    return [(response[:1] or "empty", 1.0, "Anything.")]


@pytest.mark.parametrize("target,problem", [("bad_score", "expected a number in [0, 1]"),
                                            ("nan_subclass", "score 0.5 (a NanFloat), which converts to nan"),
                                            ("nan_score", "expected a number in [0, 1]"),
                                            ("bad_shape", "expected an iterable")])
def test_a_misbehaving_plugin_fails_only_its_responses_with_a_clear_status(target, problem):
    record = plugin_record()
    samples = [Sample(f"h1/{j}", "h1", "haiku", "p", [1], "a response", [2], [-0.1], "m", 0) for j in range(2)]
    verified = verify_samples(samples, {"h1": record}, [plugins.PluginRef(f"{__name__}:{target}", "haiku")])
    assert all(v.status.startswith("verifier_error: PluginError") and problem in v.status for v in verified), verified[0].status


@pytest.mark.parametrize("score", [float("nan"), float("inf"), -0.5, True])
def test_a_verifiers_score_out_of_range_fails_its_response_whoever_gave_it(score):
    """The last check before credit, built-in rewards included: a NaN stored there made GDPO's statistics NaN."""
    with pytest.raises(plugins.PluginError, match=rf"record 'h1': reward 'x' has score {score!r}; expected a number"):
        verifiers.checked(plugin_record(), "a response", [RewardScore("x", score, "?")])


def hanging(record, response):
    if response == "hang":
        threading.Event().wait(1000)
    if response == "exit":
        sys.exit(3)
    if response == "interrupt":
        raise KeyboardInterrupt
    return [("short", float(len(response) < 10), "Be brief.")]


def test_a_verifier_that_hangs_or_exits_fails_only_its_response_and_the_batch_goes_on():
    """A hung call is abandoned at the bound (its thread sleeps on as a daemon); SystemExit and
    KeyboardInterrupt raised by a verifier are that response's verifier_error, not this process's."""
    texts = ["ok", "hang", "exit", "interrupt", "fine"]
    samples = [Sample(f"h1/{j}", "h1", "haiku", "p", [1], text, [2], [-0.1], "m", 0) for j, text in enumerate(texts)]
    verified = verify_samples(samples, {"h1": plugin_record()}, [plugins.PluginRef(f"{__name__}:hanging", "haiku")],
                              timeout_s=0.5)
    assert [v.status for v in verified] == [
        "ok", "verifier_error: timeout: the verifiers ran past 0.5 s on this response (--verifier-timeout)",
        "verifier_error: SystemExit(3)", "verifier_error: KeyboardInterrupt()", "ok"]
    assert [v.rewards[0].score for v in verified if v.status == "ok"] == [1.0, 1.0]


def test_the_verifier_timeout_is_part_of_the_config_and_must_be_positive():
    assert AnnotateConfig(verifier_timeout_s=2.0).digest() != AnnotateConfig().digest()
    with pytest.raises(ValueError, match="verifier_timeout_s must be > 0"):
        AnnotateConfig(verifier_timeout_s=0)


HANGS_ON_SNOW = '''
import time
def haiku(record, response):
    if record["topic"] == "snow":
        time.sleep(1000)
    yield "on_topic", float(record["topic"] in response.lower()), f"Mention the {record['topic']}."
'''


@pytest.mark.slow
def test_a_plugin_that_hangs_on_one_record_is_bounded_through_the_cli(tmp_path):
    """It hung `annotate` for good; now each of its calls ends at --verifier-timeout, the other
    record is annotated and the process exits 0 (the sleeping threads do not hold it open)."""
    (tmp_path / "haiku.py").write_text(HANGS_ON_SNOW)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "h1", "task": "haiku", "prompt": "A haiku.", "topic": "sea"}\n'
                       '{"id": "h2", "task": "haiku", "prompt": "A haiku.", "topic": "snow"}\n')
    done = subprocess.run(
        [sys.executable, "-m", "tokencredit.flows.cli", "annotate", "--out", str(tmp_path / "out"), "--prompts", str(prompts),
         "--runner", "none", "--verifier", f"haiku={tmp_path / 'haiku.py'}:haiku", "--verifier-timeout", "1",
         "--n", "2", "--max-new-tokens", "8", "--credit", "gdpo"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = ds.dataset(tmp_path / "out/responses").to_table().to_pylist()
    status = {(r["group_id"], r["status"]) for r in rows}
    assert status == {("h1", "ok"), ("h2", "verifier_error: timeout: the verifiers ran past 1 s on this response "
                                           "(--verifier-timeout)")}
    assert len(rows) == 4


def test_reward_names_must_agree_across_a_records_responses():
    samples = [Sample(f"h1/{j}", "h1", "haiku", "p", [1], text, [2], [-0.1], "m", 0)
               for j, text in enumerate(["abc", "abd", "xyz"])]
    verified = verify_samples(samples, {"h1": plugin_record()}, [plugins.PluginRef(f"{__name__}:varying", "haiku")])
    assert [v.status for v in verified][:2] == ["ok", "ok"]
    assert verified[2].status.startswith("verifier_error") and "differ" in verified[2].status


def test_entry_points_are_discovered_and_usable_by_name(tmp_path, monkeypatch):
    (tmp_path / "haiku_rewards.py").write_text(HAIKU)
    dist = tmp_path / "haiku_rewards-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: haiku-rewards\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[tokencredit.verifiers]\nhaiku = haiku_rewards:haiku\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugins.installed()["haiku"] == "haiku_rewards:haiku"
    (ref,) = plugins.resolve(["haiku=haiku"])
    assert ref.target == "haiku_rewards:haiku"
    assert [s.name for s in verifiers.verify(plugin_record(), "a\nb\nc", [ref])] == ["three_lines", "on_topic"]
    with pytest.raises(plugins.PluginError, match="not module:callable nor an entry point"):
        plugins.resolve(["limerick"])


def test_the_source_hash_is_part_of_the_dataset_identity_and_a_changed_source_is_refused(tmp_path):
    path = tmp_path / "haiku.py"
    path.write_text(HAIKU)
    before = AnnotateConfig(verifiers=plugins.resolve([f"haiku={path}:haiku"]))
    path.write_text(HAIKU + "\n# tuned\n")
    after = AnnotateConfig(verifiers=plugins.resolve([f"haiku={path}:haiku"]))
    assert before.digest() != after.digest()
    assert before.to_dict()["verifiers"][0]["source_sha256"] == before.verifiers[0].source_sha256
    with pytest.raises(plugins.PluginError, match="source changed"):
        plugins.load(before.verifiers[0])


@pytest.mark.slow
def test_a_file_plugin_runs_in_dask_workers_and_writes_what_the_threads_runner_writes(prefect_harness, tmp_path):
    from tokencredit.flows.annotate import run_annotate_flow
    from tokencredit.pipeline.credit.assign import CreditConfig
    from tokencredit.pipeline.config import SamplingConfig

    (tmp_path / "haiku.py").write_text(HAIKU)
    prompts = tmp_path / "haiku.jsonl"
    prompts.write_text('{"id": "h1", "task": "haiku", "prompt": "Write a haiku about the sea.", "topic": "sea"}\n'
                       '{"id": "h2", "task": "haiku", "prompt": "Write a haiku about snow.", "topic": "snow"}\n')
    config = AnnotateConfig(prompts=str(prompts), verifiers=plugins.resolve([f"haiku={tmp_path / 'haiku.py'}:haiku"]),
                            shard_size=1, sampling=SamplingConfig(n=3, max_new_tokens=24, seed=3),
                            credit=CreditConfig(kinds=("gdpo",)))
    dask = run_annotate_flow(config, str(tmp_path / "dask"), runner="dask", workers=1, progress=False)
    threads = run_annotate_flow(config, str(tmp_path / "threads"), runner="threads", workers=1, progress=False)
    assert dask["dataset_checksum"] == threads["dataset_checksum"]
    rows = ds.dataset(tmp_path / "dask" / "responses").to_table().to_pylist()
    assert len(rows) == 6 and {r["status"] for r in rows} == {"ok"}
    assert dask["config"]["verifiers"][0]["source_sha256"] == config.verifiers[0].source_sha256


def crashing(record, response):
    raise RuntimeError("the grader is down")


@pytest.mark.slow
def test_a_run_where_every_response_is_a_verifier_error_exits_2_with_one_line(tmp_path, capsys):
    from tokencredit.flows.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "h1", "task": "haiku", "prompt": "Write a haiku."}\n')
    code = main(["annotate", "--out", str(tmp_path / "out"), "--prompts", str(prompts), "--runner", "none",
                 "--verifier", f"haiku={__file__}:crashing", "--n", "2", "--max-new-tokens", "8", "--credit", "gdpo"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("tokencredit annotate: error:")]
    assert code == 2 and "Traceback" not in err and len(errors) == 1  # beside it only progress bars
    assert "every one of 2 responses of task 'haiku' in shard 0 is a verifier_error" in errors[0]


TRL_REWARDS = '''
from tokencredit.verifiers.trl_rewards import trl_verifier


def newline_reward(completions, **kwargs):  # TRL's signature: a batch of completions, dataset columns as lists
    return [float(c.count("\\n")) for c in completions]


lines = trl_verifier(newline_reward, feedback=lambda record: f"Write {record['lines']} lines.", bounds=(0, 2))
'''


def test_a_trl_reward_function_is_a_verifier_in_annotate(tmp_path, capsys):
    from tokencredit.flows.cli import main

    (tmp_path / "trl_rewards.py").write_text(TRL_REWARDS)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "h1", "task": "haiku", "prompt": "Write a haiku.", "lines": 3}\n')
    code = main(["annotate", "--out", str(tmp_path / "out"), "--prompts", str(prompts), "--runner", "none",
                 "--verifier", f"haiku={tmp_path / 'trl_rewards.py'}:lines", "--n", "3", "--max-new-tokens", "12",
                 "--credit", "gdpo,mrtpo"])
    assert code == 0, capsys.readouterr().err
    rows = ds.dataset(tmp_path / "out" / "responses").to_table().to_pylist()
    assert len(rows) == 3 and {r["status"] for r in rows} == {"ok"}
    for row in rows:
        assert row["reward_names"] == ["newline_reward"] and row["feedback"] == ["Write 3 lines."]
        assert row["rewards"] == [min(1.0, row["response"].count("\n") / 2)]
    (ref,) = plugins.resolve([f"haiku={tmp_path / 'trl_rewards.py'}:lines"])
    assert ref.source_sha256 == hashlib.sha256((tmp_path / "trl_rewards.py").read_bytes()).hexdigest()


NAN_FLOAT = "class NanFloat(float):\n    def __float__(self):\n        return float('nan')\n"


@pytest.mark.parametrize("returned,problem", [("[1.0, 2.0]", "expected a list of one number"),
                                              ("[float('nan')]", "expected a list of one number"),
                                              ("[NanFloat(0.5)]", "expected a list of one number")])
def test_a_trl_reward_function_returning_no_single_number_is_named(tmp_path, returned, problem):
    (tmp_path / "bad.py").write_text("from tokencredit.verifiers.trl_rewards import trl_verifier\n" + NAN_FLOAT +
                                     f"def odd_reward(completions, **kwargs):\n    return {returned}\n"
                                     "odd = trl_verifier(odd_reward, feedback='Anything.')\n")
    (ref,) = plugins.resolve([f"haiku={tmp_path / 'bad.py'}:odd"])
    with pytest.raises(plugins.PluginError, match=f"TRL reward function odd_reward: returned .*{problem}"):
        verifiers.verify(plugin_record(), "a response", [ref])


# TRL's documented reward functions (TRL 1.16 docs, "Using a custom reward function"): a standard
# one scores strings, a conversational one reads `completions[i][0]["content"]`.
TRL_DOCS_REWARDS = '''
import re

from tokencredit.verifiers.trl_rewards import trl_verifier


def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def asked_reward(prompts, completions, **kwargs):  # conversational prompts are message lists too
    return [float(p[-1]["role"] == "user" and p[-1]["content"] in c[0]["content"])
            for p, c in zip(prompts, completions)]


length = trl_verifier(reward_len, feedback="Write 20 characters.", bounds=(-20, 0))
think = trl_verifier(format_reward_func, feedback="Think in <think></think>, then answer in <answer></answer>.")
asked = trl_verifier(asked_reward, feedback="Repeat the prompt.")
think_strings = trl_verifier(format_reward_func, feedback="Think first.", conversational=False)
'''


def test_trls_documented_standard_and_conversational_reward_functions_score_in_annotate(tmp_path):
    (tmp_path / "docs_rewards.py").write_text(TRL_DOCS_REWARDS)
    refs = plugins.resolve([f"haiku={tmp_path / 'docs_rewards.py'}:{name}" for name in ("length", "think", "asked")])
    samples = [Sample(f"h1/{i}", "h1", "haiku", "Write a haiku.", [1], text, [1], [0.0], "m", 0)
               for i, text in enumerate(["<think>sea</think><answer>waves</answer>", "Write a haiku. The sea."])]
    verified = verify_samples(samples, {"h1": plugin_record()}, refs)  # annotate's verify stage
    assert [v.status for v in verified] == ["ok", "ok"]
    assert [[r.score for r in v.rewards] for v in verified] == [[0.0, 1.0, 0.0], [pytest.approx(0.85), 0.0, 1.0]]
    assert [r.name for r in verified[0].rewards] == ["reward_len", "format_reward_func", "asked_reward"]
    verifiers.verify(plugin_record(), samples[0].response, refs)  # annotate called them in its worker; here, in this process
    length, think, asked = (plugins.load(ref) for ref in refs)
    assert (length.conversational, think.conversational, asked.conversational) == (False, True, True)  # remembered


def test_a_conversational_choice_is_kept_and_a_function_failing_either_way_raises_its_own_error(tmp_path):
    (tmp_path / "docs_rewards.py").write_text(TRL_DOCS_REWARDS)
    (ref,) = plugins.resolve([f"haiku={tmp_path / 'docs_rewards.py'}:think_strings"])
    with pytest.raises(TypeError, match="string indices must be integers"):  # told strings: no retry
        verifiers.verify(plugin_record(), "<think>a</think><answer>b</answer>", [ref])
    def broken_reward(completions, topic, **kwargs):
        return [float(len(topic[0]) / 0)]

    broken = plugins.of_object(trl_verifier(broken_reward, feedback="Anything."), "haiku")
    with pytest.raises(ZeroDivisionError) as raised:  # the error on strings, not a retry's
        verifiers.verify(plugin_record(), "a response", [broken])
    assert "raised by verifier tests.test_plugins:" in "".join(raised.value.__notes__)
    with pytest.raises(plugins.PluginError, match="conversational must be True, False or None"):
        trl_verifier(broken_reward, feedback="x", conversational="yes")
    for bounds in [(0, float("inf")), (float("nan"), 1), (1, 1)]:  # NaN or inf made every score 0
        with pytest.raises(plugins.PluginError, match=r"bounds .* must be two different finite numbers"):
            trl_verifier(broken_reward, feedback="x", bounds=bounds)


def test_a_verifier_object_scores_in_python_and_annotate_says_it_needs_an_importable_target():
    ref = plugins.of_object(objects, "haiku")
    assert ref.target == "tests.test_plugins:objects" and ref.task == "haiku"
    assert [s.name for s in verifiers.verify(plugin_record(), "x" * 50, [ref])] == ["long"]

    def trl_style(completions, **kwargs):
        return [1.0 for _ in completions]

    with pytest.raises(plugins.PluginError, match=r"a TRL reward function .*trl_verifier\(fn, feedback=\.\.\.\)"):
        plugins.of_object(trl_style, "haiku")
    with pytest.raises(TypeError, match=r"AnnotateConfig.verifiers: .* not an importable verifier.*resolve\("):
        AnnotateConfig(verifiers=(ref,))


def test_python_side_messages_name_the_python_argument(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "h1", "task": "haiku", "prompt": "Write a haiku."}\n')
    _, (rejected,) = verifiers.load_tasks(prompts)
    assert "plugin_tasks=('haiku',)" in rejected.reason
    with pytest.raises(RecordError, match=r"verifiers=\[\('haiku', verifier\)\]"):
        verifiers.reward_names(plugin_record())
