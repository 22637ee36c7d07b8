"""The annotate stage from Python (`tokencredit.pipeline.steps.Pipeline`): its steps, one by one or as `run`, write the rows
that `run_annotation` (the CLI's annotate) writes; the report links each response to its row."""
import dataclasses
import html.parser
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokencredit.pipeline.annotate import run_annotation
from tokencredit.flows.cli import main
from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig
from tokencredit.pipeline.dataset.query import connect
from tokencredit.pipeline.dataset.report import write_report
from tokencredit.pipeline.steps import Pipeline
from tokencredit.schemas.records import RewardScore, VerifiedSample

# One prompt of each demo task in shards of 2 prompts: the steps must split the records as the CLI does.
CONFIG = AnnotateConfig(limit=1, shard_size=2, sampling=SamplingConfig(n=4, max_new_tokens=24))
ROWS = ("SELECT response_id, shard, status, token_ids, reward_names, rewards, reward_advs, gdpo_sum, adv_gdpo, "
        "adv_mrtpo FROM responses ORDER BY response_id")


def rows(out) -> list[tuple]:
    return connect(str(out)).execute(ROWS).fetchall()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same config written three ways: run_annotation, Pipeline.run, and the steps one by one."""
    root = tmp_path_factory.mktemp("steps")
    manifest = run_annotation(CONFIG, str(root / "cli"), progress=False)
    run = Pipeline(CONFIG).run(root / "run", progress=False)
    pipe = Pipeline(CONFIG)
    records, rejected = pipe.load()
    samples = pipe.sample(records)
    verified = pipe.verify(records, samples)
    credited = pipe.credit(records, verified)
    steps = pipe.write(root / "steps", records, credited, rejected)
    return {"cli": (root / "cli", manifest), "run": (run.path, run.manifest), "steps": (steps.path, steps.manifest),
            "credited": credited}


def test_the_steps_and_run_write_the_rows_of_run_annotation(runs):
    cli = rows(runs["cli"][0])
    assert len(cli) == 3 * 4 and {r[1] for r in cli} == {0, 1}  # 3 prompts x 4 responses in 2 shards
    assert rows(runs["run"][0]) == cli
    assert rows(runs["steps"][0]) == cli
    checksums = {name: runs[name][1]["dataset_checksum"] for name in ("cli", "run", "steps")}
    assert len(set(checksums.values())) == 1, checksums  # the same Parquet bytes
    counts = [{k: v for k, v in runs[name][1]["stats"].items() if k != "seconds"} for name in ("steps", "cli")]
    assert counts[0] == counts[1]  # the same counts; each stage's seconds are each run's own


def test_the_credit_step_returns_the_records_it_writes(runs):
    credited = sorted(runs["credited"].responses, key=lambda a: a.verified.sample.response_id)
    assert [(a.verified.sample.response_id, a.verified.sample.token_ids, [r.score for r in a.verified.rewards],
             a.gdpo_sum) for a in credited] == [(r[0], r[3], r[5], r[7]) for r in rows(runs["cli"][0])]


def test_a_verify_step_of_your_own(tmp_path):
    """Replace one step: any function that returns VerifiedSamples feeds the credit step."""
    pipe = Pipeline(dataclasses.replace(CONFIG, credit=CreditConfig(kinds=("gdpo",))))
    records, _ = pipe.load()
    samples = pipe.sample(records)
    verified = [VerifiedSample(s, [RewardScore("short", float(len(s.response) < 40), "Answer in 40 characters.")])
                for s in samples]
    run = pipe.write(tmp_path / "own", records, pipe.credit(records, verified))
    got = connect(str(run.path)).execute("SELECT response_id, reward_names, rewards FROM responses "
                                         "ORDER BY response_id").fetchall()
    assert got == sorted((s.response_id, ["short"], [float(len(s.response) < 40)]) for s in samples)


class Anchors(html.parser.HTMLParser):
    """Every `id=` attribute of a page, in order."""

    def __init__(self):
        super().__init__()
        self.ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.ids += [value for name, value in attrs if name == "id"]


@pytest.mark.parametrize("per_task", [1, 4])
def test_the_report_anchors_each_response_at_its_row_id(runs, per_task, tmp_path, capsys):
    """1 card per task shows its 3 siblings folded under it; 4 cards per task are whole prompt groups, each card
    also listing the other 3 as its siblings: either way each response carries its id once."""
    out = runs["steps"][0]
    text = write_report(out, tmp_path / "report.html", responses_per_task=per_task).read_text()
    parser = Anchors()
    parser.feed(text)
    response_ids = [r[0] for r in rows(out)]
    anchored = [i for i in parser.ids if not i.startswith("task-") and i != "failures"]  # the page's sections
    assert sorted(anchored) == sorted(response_ids)
    rid = response_ids[5]
    assert f'id="{rid}"' in text and f'<a href="#{rid}">{rid}</a>' in text  # visible, and a link to itself
    assert main(["query", str(out), f"select response_id, rewards from responses where response_id = '{rid}'"]) == 0
    shown = capsys.readouterr().out
    assert shown.count(f"│ {rid} ") == 1  # one row


def test_import_pipeline_stays_light_and_exports_the_pipeline():
    code = ("import sys, tokencredit.pipeline; light = 'torch' not in sys.modules; from tokencredit.pipeline import Pipeline; "
            "print(light, Pipeline.__module__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert done.stdout.split() == ["True", "tokencredit.pipeline.steps"], done.stderr
