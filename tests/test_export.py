"""Exports of a run for other trainers: load back with the module docstring's own snippets."""
import json
import re
import textwrap
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest

from tokencredit.pipeline.dataset import export as export_module
from tokencredit import verifiers
from tokencredit.pipeline.dataset.export import export_hf, export_verl, ground_truth, record_from_json, record_json
from tests.test_train import RESPONSES_SPEC, response_rows, write_run

DEMO = {r.task: r for r in verifiers.load_tasks("demo")[0]}  # one record per task
GROUPS = [DEMO["sql"], DEMO["tools"], DEMO["instructions"]]  # RESPONSES_SPEC's groups g0, g1, g2


def docstring_snippet(first_line):
    """The indented code block of pipeline.export's docstring that starts with `first_line`."""
    block = re.search(rf"\n(    {re.escape(first_line)}\n(?:    .+\n)*)", export_module.__doc__)
    return textwrap.dedent(block.group(1))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    rows = response_rows(p2t=True)
    for row in rows:
        row["group_id"] = GROUPS[int(row["group_id"][1:])].id
    rows.append({**rows[0], "response_id": "r_err", "status": "verifier_error: timeout"})
    return write_run(tmp_path_factory.mktemp("run"), rows)


def test_hf_export_loads_back_with_load_from_disk_and_load_dataset(run_dir, tmp_path):
    dest = tmp_path / "hf"
    export_hf(run_dir, dest, advantage="mrtpo")
    scope = {"dest": str(dest)}
    exec(docstring_snippet("import datasets"), scope)
    ds, row = scope["ds"], scope["row"]
    assert set(ds.column_names) == {"prompt", "response", "prompt_token_ids", "token_ids",
                                    "token_texts", "sample_logprobs", "sft_weight", "advantages", "reward_names",
                                    "rewards", "response_id", "group_id", "task"}
    assert scope["same"].to_list() == ds.to_list()
    assert ds["response_id"] == [f"r{i}" for i in range(len(RESPONSES_SPEC))]  # status 'ok' only
    assert row["response"] == "w10 w11 w12 w13" and row["prompt_token_ids"] == [5, 6, 7]
    for r, (_, tokens, _, mrtpo) in zip(ds, RESPONSES_SPEC):
        assert r["token_ids"] == tokens
        assert r["advantages"] == pytest.approx(mrtpo)
        assert r["sft_weight"] == pytest.approx([max(a, 0.0) for a in mrtpo])  # the view's sft_weight
        assert r["sample_logprobs"] == pytest.approx([-4.158883] * len(tokens))  # -log 64, as written


def test_verl_export_has_one_row_per_prompt_with_raw_messages_and_ground_truth(run_dir, tmp_path):
    dest_file = tmp_path / "verl" / "train.parquet"
    export_verl(run_dir, dest_file, advantage="p2t:1,gdpo:-1", prompts="demo")
    scope = {"dest_file": str(dest_file)}
    exec(docstring_snippet("import pyarrow.parquet as pq"), scope)
    rows = scope["rows"]
    assert len(rows) == 3 and [r["extra_info"]["group_id"] for r in rows] == [g.id for g in GROUPS]
    for row, record in zip(rows, GROUPS):
        assert row["data_source"] == f"tokencredit/{record.task}" and row["ability"] == record.task
        # the raw task prompt: verl applies the chat template itself (no "<|im_start|>" inside)
        assert row["prompt"] == [{"role": "user", "content": record.prompt}]
        assert row["reward_model"] == {"style": "rule", "ground_truth": ground_truth(record)}
        assert record_from_json(json.loads(row["extra_info"]["record"])) == record
    assert rows[0]["reward_model"]["ground_truth"] == DEMO["sql"].spec.reference_sql
    assert json.loads(rows[1]["reward_model"]["ground_truth"]) == record_json(DEMO["tools"])["reference_calls"]
    flat = [(r, j) for r in rows for j in range(len(r["response"]))]
    assert [r["response_id"][j] for r, j in flat] == [f"r{i}" for i in range(len(RESPONSES_SPEC))]
    for (row, j), (prompt, tokens, _, _) in zip(flat, RESPONSES_SPEC):
        assert row["prompt_token_ids"] == prompt and row["token_ids"][j] == tokens
        assert row["response"][j].split() == [f"w{t}" for t in tokens]
        assert row["sample_logprobs"][j] == pytest.approx([-4.158883] * len(tokens))
        # adv_p2t = gdpo + 0.1 t in the synthetic run, so p2t - gdpo = 0.1 t
        assert row["advantages"][j] == pytest.approx([0.1 * t for t in range(len(tokens))], abs=1e-6)
        assert row["reward_names"] == ["format", "execution"] and len(row["rewards"][j]) == 2


def test_export_errors_name_the_kind_and_the_missing_record(run_dir, tmp_path):
    run = write_run(tmp_path / "run", response_rows(p2t=False))
    with pytest.raises(ValueError, match="advantage kind 'p2t' .* is NULL"):
        export_verl(run, tmp_path / "x.parquet", advantage="p2t")
    with pytest.raises(ValueError, match="response 'r0' answers task record 'g0', which the prompt set demo lacks"):
        export_verl(run, tmp_path / "x.parquet", advantage="gdpo", prompts="demo")
    with pytest.raises(ValueError, match="names no prompt set"):
        export_verl(run, tmp_path / "x.parquet", advantage="gdpo")


@pytest.mark.parametrize("fmt", ["hf", "verl"])
def test_exports_refuse_non_finite_advantages_naming_the_response(tmp_path, capsys, fmt):
    from tokencredit.flows.cli import main

    rows = response_rows()
    rows[3]["mrtpo_sum"] = [0.5, float("nan"), 0.5]  # a NaN in the run's credit, and a mix that overflows float32
    rows[5]["gdpo_sum"] = 3e38
    run = write_run(tmp_path / "run", rows)
    for advantage, problem in [("mrtpo", "response 'r3': advantage 'mrtpo' is nan at token 1 (1 of 3 tokens"),
                               ("gdpo:4", "response 'r5': advantage 'gdpo:4' is 1.2e+39 at token 0 (3 of 3 tokens")]:
        dest = tmp_path / f"{fmt}-{advantage}"
        assert main(["export", run, "--format", fmt, "--dest", str(dest), "--advantage", advantage]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and problem in err, err
        assert not dest.exists()


def test_hf_export_of_a_real_run_carries_rewards_by_name_and_token_texts(tmp_path):
    import datasets
    import pyarrow.dataset as pads

    from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
    from tokencredit.pipeline.config import SamplingConfig

    out = tmp_path / "run"
    run_annotation(AnnotateConfig(limit=1, tasks=("sql",), sampling=SamplingConfig(n=3, max_new_tokens=16, seed=1)),
                   str(out), progress=False)
    ds = datasets.load_from_disk(str(export_hf(out, tmp_path / "hf")))
    stored = {r["response_id"]: r for r in pads.dataset(out / "responses").to_table().to_pylist()}
    assert len(ds) == 3
    for row in ds:
        assert row["reward_names"] == ["format", "executable", "execution"]
        assert row["rewards"] == pytest.approx(stored[row["response_id"]]["rewards"])
        assert len(row["token_texts"]) == len(row["token_ids"]) == len(row["advantages"])
        assert "".join(row["token_texts"]).startswith(row["response"])  # (+ the eos token's text)


def readme_vocabulary() -> dict[str, set[str]]:
    """The dataset page's "One vocabulary" table: for each of hf, verl and sft_dataset, the columns marked."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "dataset.md").read_text()
    table = page.split("## One vocabulary", 1)[1].split("\n\n")[2]
    header, _, *rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()]
    marked = {place: set() for place in header[2:]}
    for name, _, *marks in rows:
        for place, mark in zip(header[2:], marks):
            if mark == "x":
                marked[place].add(name.strip("`"))
    return marked


def test_the_exports_use_the_readme_vocabulary_which_is_the_datasets(run_dir, tmp_path):
    from tokencredit.pipeline.dataset.query import connect
    from tokencredit.pipeline.integrations.trl import sft_dataset

    vocabulary = readme_vocabulary()
    assert set(datasets.load_from_disk(str(export_hf(run_dir, tmp_path / "hf"))).column_names) == vocabulary["hf"]
    verl = pq.read_table(export_verl(run_dir, tmp_path / "verl.parquet", prompts="demo")).column_names
    assert set(verl) - {"data_source", "ability", "reward_model", "extra_info"} == vocabulary["verl"]  # verl's own
    assert set(sft_dataset(str(run_dir)).column_names) == vocabulary["sft_dataset"]
    db = connect(run_dir)
    dataset = {c for view in ("training", "responses") for c in db.sql(f"SELECT * FROM {view} LIMIT 0").columns}
    derived = {"token_texts", "advantages"}  # lists of the credits' token_text; the chosen adv_<kind> or mix
    assert set().union(*vocabulary.values()) - derived <= dataset
