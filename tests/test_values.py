"""Value curves (`tokencredit values`) on the shipped tiny policy: a cut's value is the mean score of its
continuations (recomputed with the flat sampler, the prefix appended to the prompt) and, for a plugin reward the
prefix decides, the prefix's verdict exactly; cut 0's is a fresh sample's
with the same seeds, the decisive segment of a hand-made curve, a run killed by SIGKILL resumed without duplicates
or gaps, the Prefect flow, bad input (options, a folder that is no run, a run without failed pairs) refused
before a model loads, and `repair --cut decisive`."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from tokencredit import verifiers
from tokencredit.flows.cli import main
from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
from tokencredit.pipeline.config import SamplingConfig
from tokencredit.pipeline.dataset.export import run_records
from tokencredit.pipeline.sample.transformers_backend import load_sampler
from tokencredit.pipeline.values import (ValuesConfig, connect_values, continuation_seed, decisive_segment,
                                         grid_cuts, mean_and_stderr, run_sampling, run_values, span_start_token)
from tokencredit.schemas import DECISIVE, VALUES
from tokencredit.verifiers import plugins

# the transformers sampler, which the fresh samples below and CONFIG use (auto would take the engine where installed)
ARGS = ["--k", "3", "--cuts", "3", "--pairs", "5", "--shard-size", "1", "--seed", "2", "--runner", "none",
        "--backend", "transformers"]
CONFIG = ValuesConfig(k=3, cuts=3, pairs=5, shard_size=1, seed=2)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("values") / "run"
    run_annotation(AnnotateConfig(limit=2, tasks=("instructions", "tools"),
                                  sampling=SamplingConfig(n=4, max_new_tokens=24, temperature=1.0, seed=3)),
                   str(out), progress=False)
    return out


@pytest.fixture(scope="module")
def measured(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("measured") / "values"
    assert main(["values", str(run), "--out", str(out), *ARGS]) == 0
    return out


def rows(out, table: str) -> list[dict]:
    schema = {"values": VALUES, "decisive": DECISIVE}[table]
    return sorted(pq.read_table(out / table, schema=schema).to_pylist(),
                  key=lambda r: (r["response_id"], r["reward"], r["constraint_index"] or 0, r.get("position", 0)))


def test_grid_stderr_and_span_start():
    assert grid_cuts(10, 4) == [0, 2, 5, 7] and grid_cuts(2, 8) == [0, 1]
    mean, err = mean_and_stderr([1.0, 0.0, 1.0, 0.0])
    assert mean == 0.5 and err == pytest.approx((1 / 3) ** 0.5 / 2)
    assert mean_and_stderr([1.0]) == (1.0, None)
    # tokens "ab" "cd" "ef": a span starting at character 3 begins in token 1
    assert span_start_token([(3, 5)], [0, 2, 4], [2, 4, 6]) == 1 and span_start_token([], [0], [1]) is None


def test_the_decisive_segment_of_a_hand_made_curve():
    positions = [0, 10, 20, 30, 40, 57]
    assert decisive_segment(positions, [0.8, 0.7, 0.2, 0.2, 0.1, 0.0]) == (10, 20, pytest.approx(-0.5))
    # ties go to the earliest segment; a passed pair's segment is where the value rises most
    assert decisive_segment([0, 5, 9], [1.0, 0.5, 0.0]) == (0, 5, -0.5)
    assert decisive_segment(positions, [0.1, 0.2, 0.2, 0.9, 1.0, 1.0], rise=True) == (20, 30, pytest.approx(0.7))
    with pytest.raises(ValueError, match="2 or more points"):
        decisive_segment([0], [1.0])


def test_a_cut_value_is_the_mean_score_of_flat_continuations(run, measured):
    """Recompute two cuts independently: the flat sampler's `generate` on prompt + prefix with the documented
    seeds, each continuation decoded and verified by `verifiers.verify`."""
    from tokencredit.pipeline.dataset.query import connect

    values = rows(measured, "values")
    assert {r["k"] for r in values if r["sources"] != ["end"]} == {3}
    records, _, _ = run_records(run)
    _, sampling = run_sampling(str(run))
    sampler, tokenizer = load_sampler(None)
    checked = 0
    for row in [r for r in values if r["reward"] != "mean" and r["k"] and r["position"] > 0][:2]:
        (prompt_ids, ids, task, gid, names) = connect(run).execute(
            "SELECT prompt_token_ids, token_ids, task, group_id, reward_names FROM responses WHERE response_id = ?",
            [row["response_id"]]).fetchone()
        p = row["position"]
        seeds = [continuation_seed(sampling.seed, row["response_id"], p, j) for j in range(3)]
        config = dataclasses.replace(sampling, max_new_tokens=sampling.max_new_tokens - p)
        tokens, _ = sampler.generate([list(prompt_ids) + list(ids[:p])] * 3, seeds, config)
        k = row["constraint_index"] if row["constraint_index"] is not None else names.index(row["reward"])
        scores = [verifiers.verify(records[gid], tokenizer.decode(list(ids[:p]) + t, skip_special_tokens=True))[k].score
                  for t in tokens]
        assert row["value"] == pytest.approx(sum(scores) / 3)
        checked += 1
    assert checked == 2


def test_the_value_at_cut_0_is_a_fresh_samples_pass_rate_with_the_same_seeds(run, measured):
    """Cut 0 keeps nothing of the response: its continuations are fresh samples of the prompt under the run's
    sampling settings, the same as the flat sampler draws from the continuation seeds."""
    from tokencredit.pipeline.dataset.query import connect

    records, _, _ = run_records(run)
    _, sampling = run_sampling(str(run))
    sampler, tokenizer = load_sampler(None)
    at_zero = [r for r in rows(measured, "values") if r["position"] == 0 and r["k"]]
    assert at_zero
    for row in at_zero[:3]:
        prompt_ids, task, gid, names = connect(run).execute(
            "SELECT prompt_token_ids, task, group_id, reward_names FROM responses WHERE response_id = ?",
            [row["response_id"]]).fetchone()
        seeds = [continuation_seed(sampling.seed, row["response_id"], 0, j) for j in range(3)]
        fresh, _ = sampler.generate([list(prompt_ids)] * 3, seeds, sampling)
        scores = [verifiers.verify(records[gid], tokenizer.decode(t, skip_special_tokens=True)) for t in fresh]
        if row["reward"] == "mean":
            expected = [sum(s.score for s in found) / len(found) for found in scores]
        else:
            k = row["constraint_index"] if row["constraint_index"] is not None else names.index(row["reward"])
            expected = [found[k].score for found in scores]
        assert row["value"] == pytest.approx(sum(expected) / 3)


INITIAL = """def initial(record, response):
    first = response.lstrip()[:1]
    yield "initial", float(first != "" and first in "<`"), "Start with a tag or a code fence."
"""


def test_a_value_is_known_where_the_prefix_decides_the_reward(tmp_path):
    """A plugin reward decided by the response's first character: every cut past it keeps it, so its value is
    exactly the prefix's verdict (stderr 0), whatever the continuations are."""
    (tmp_path / "initial.py").write_text(INITIAL)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"i{i}", "task": "initial", "prompt": f"Say word {i}."}) + "\n"
                               for i in range(4)))
    run_annotation(AnnotateConfig(prompts=str(prompts), sampling=SamplingConfig(n=4, max_new_tokens=12, seed=1),
                                  verifiers=plugins.resolve([f"initial={tmp_path / 'initial.py'}:initial"])),
                   str(tmp_path / "run"), progress=False)
    assert main(["values", str(tmp_path / "run"), "--out", str(tmp_path / "v"), "--k", "3", "--cuts", "4",
                 "--passed", "--runner", "none"]) == 0
    _, tokenizer = load_sampler(None)
    from tokencredit.pipeline.dataset.query import connect

    ids = dict(connect(tmp_path / "run").execute("SELECT response_id, token_ids FROM responses").fetchall())
    decided = []
    for row in rows(tmp_path / "v", "values"):
        prefix = tokenizer.decode(ids[row["response_id"]][:row["position"]], skip_special_tokens=True).lstrip()
        if row["reward"] == "initial" and row["k"] and prefix:
            assert row["value"] == float(prefix[0] in "<`") and row["stderr"] == 0
            decided.append(row["value"])
    assert set(decided) == {0.0, 1.0}  # failed pairs (--passed: and passed ones) past their first character


@pytest.fixture(scope="module")
def passing_run(tmp_path_factory):
    """A run whose every reward passed: a plugin task whose one reward is always 1."""
    folder = tmp_path_factory.mktemp("passing")
    (folder / "always.py").write_text("def always(record, response):\n    yield 'ok', 1.0, 'Say anything.'\n")
    prompts = folder / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a1", "task": "always", "prompt": "Say anything."}) + "\n")
    run_annotation(AnnotateConfig(prompts=str(prompts), sampling=SamplingConfig(n=2, max_new_tokens=4),
                                  verifiers=plugins.resolve([f"always={folder / 'always.py'}:always"])),
                   str(folder / "run"), progress=False)
    return folder / "run"


def test_a_run_without_failed_pairs_is_one_clear_error(passing_run, tmp_path, capsys, no_model):
    assert main(["values", str(passing_run), "--out", str(tmp_path / "v"), "--runner", "none"]) == 2
    assert "the run has no failed (response, reward) pairs to measure" in capsys.readouterr().err
    assert not (tmp_path / "v").exists()


def test_curves_end_at_the_response_score_and_decisive_segments_are_their_largest_fall(run, measured):
    con = connect_values(str(measured))
    for rid, reward, positions, curve, failed, start, end, change in con.execute(
            "SELECT response_id, reward, positions, curve, failed, decisive_start, decisive_end, decisive_change "
            "FROM curves WHERE decisive_start IS NOT NULL").fetchall():
        drops = [b - a for a, b in zip(curve, curve[1:])]
        best = min(drops) if failed else max(drops)
        assert change == pytest.approx(best) and (start, end) in zip(positions, positions[1:])
        if failed and reward != "mean":
            assert curve[-1] < 1  # the end point is the response's own (failed) score
    decisive = rows(measured, "decisive")
    assert sum(r["failed"] and r["reward"] != "mean" for r in decisive) == 5  # --pairs 5 failed pairs


def test_a_killed_run_resumes_without_duplicates_or_gaps(run, measured, tmp_path):
    out = tmp_path / "values"
    env = {**os.environ, "DO_NOT_TRACK": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tokencredit.flows.cli", "values", str(run), "--out", str(out),
                             *ARGS], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not list((out / "_shards").glob("shard-*.json")) and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before its first shard"
    assert not (out / "values.json").exists()
    summary = run_values(str(run), str(out), CONFIG, progress=False)
    assert summary["shards"] == len(list((out / "_shards").glob("shard-*.json")))
    for table in ("values", "decisive"):
        resumed, whole = rows(out, table), rows(measured, table)
        keys = [(r["response_id"], r["reward"], r["constraint_index"], r.get("position")) for r in resumed]
        assert len(keys) == len(set(keys))
        assert resumed == whole


def test_the_prefect_flow_writes_the_same_values(run, measured, tmp_path, prefect_harness):
    from tokencredit.flows.derived import run_derived_flow
    from tokencredit.pipeline.values import VALUES_KIND

    out = tmp_path / "values"
    run_derived_flow(VALUES_KIND, str(run), str(out), CONFIG, progress=False)
    assert rows(out, "values") == rows(measured, "values")


@pytest.fixture
def no_model(monkeypatch):
    """A model load fails the test: bad input must be refused before one."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model loaded before the input was checked")
    monkeypatch.setattr("tokencredit.pipeline.sample.transformers_backend.load_sampler", refuse)


@pytest.mark.parametrize("args, message", [
    (["--k", "0"], "--k must be >= 1"),
    (["--cuts", "0"], "--cuts must be >= 1"),
    (["--pairs", "100000"], "--pairs 100000 is more than the run's"),
])
def test_bad_options_are_one_clear_error(run, tmp_path, capsys, no_model, args, message):
    assert main(["values", str(run), "--out", str(tmp_path / "v"), "--runner", "none", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_folder_that_is_not_a_run_is_refused(tmp_path, capsys, no_model):
    (tmp_path / "notarun").mkdir()
    assert main(["values", str(tmp_path / "notarun"), "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert "notarun" in err and len(err.strip().splitlines()) == 1


def listing(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("command", ["values", "repair"])
@pytest.mark.parametrize("inside", [False, True])
def test_an_out_in_another_run_is_refused_and_left_unchanged(run, passing_run, tmp_path, capsys, no_model, command,
                                                            inside):
    """`values/repair RUN --out OTHER_RUN` wrote config.json and folders into the other run, then a KeyError."""
    out = passing_run / "derived" if inside else passing_run
    before = listing(passing_run)
    assert main([command, str(run), "--out", str(out), "--runner", "none"]) == 2
    err = capsys.readouterr().err.strip()
    where = f"inside {passing_run}, another run's folder" if inside else "the folder of another run"
    assert err == (f"tokencredit {command}: error: --out {out} is {where} (it holds manifest.json and _shards/); "
                   f"choose a folder outside any run")
    assert listing(passing_run) == before


def test_repair_values_naming_a_repair_folder_is_one_line(run, tmp_path, capsys, no_model):
    """`repair --values` naming a repair folder (a folder of this run, of another kind) ended in a TypeError."""
    import pyarrow as pa

    from tokencredit.pipeline.repair import RepairConfig, RepairStore

    RepairStore(str(tmp_path / "repair"), str(run), RepairConfig()).write_shard(0, pa.table({"x": []}), {})
    assert main(["repair", str(run), "--out", str(tmp_path / "r"), "--cut", "decisive", "--values",
                 str(tmp_path / "repair"), "--runner", "none"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"tokencredit repair: error: --values {tmp_path / 'repair'} holds no values (no values/: a folder "
                   f"of another kind?); make it with tokencredit values {run} --out DIR")
    assert not (tmp_path / "r").exists()


def test_repair_from_the_decisive_point(run, measured, tmp_path, capsys, no_model):
    assert main(["repair", str(run), "--out", str(tmp_path / "r"), "--cut", "decisive", "--runner", "none"]) == 2
    assert "--cut decisive needs --values DIR" in capsys.readouterr().err


def test_repair_cuts_at_the_decisive_start(run, measured, tmp_path):
    from tokencredit.pipeline.repair import RepairConfig, prepare_repair

    job = prepare_repair(str(run), str(tmp_path / "r"), RepairConfig(cut="decisive", values=str(measured)))
    targets = [t for shard in job.shards for t in shard]
    starts = {(r["response_id"], r["reward"], r["constraint_index"]): r["start"]
              for r in rows(measured, "decisive") if r["failed"]}
    assert len(targets) == sum(rw != "mean" for _, rw, _ in starts)
    for t in targets:
        index = t.k if t.task == "instructions" else None
        assert t.source == "decisive" and t.cut == starts[t.response_id, t.reward_names[t.k], index]
