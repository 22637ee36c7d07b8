"""Exports of a run for other trainers: load back with the module docstring's own snippets."""
import re
import textwrap

import pytest

import pipeline.export
from pipeline.export import export_hf, export_verl
from tests.test_train import RESPONSES_SPEC, response_rows, write_run


def docstring_snippet(first_line):
    """The indented code block of pipeline.export's docstring that starts with `first_line`."""
    block = re.search(rf"\n(    {re.escape(first_line)}\n(?:    .+\n)*)", pipeline.export.__doc__)
    return textwrap.dedent(block.group(1))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    rows = response_rows(p2t=True)
    rows.append({**rows[0], "response_id": "r_err", "status": "verifier_error: timeout"})
    return write_run(tmp_path_factory.mktemp("run"), rows)


def test_hf_export_loads_back_aligned(run_dir, tmp_path):
    dest = tmp_path / "hf"
    export_hf(run_dir, dest, advantage="mrtpo")
    scope = {"dest": str(dest)}
    exec(docstring_snippet("import datasets"), scope)
    ds, row = scope["ds"], scope["row"]
    assert set(ds.column_names) == {"prompt", "completion", "prompt_token_ids", "completion_token_ids", "weights",
                                    "advantages", "response_id", "task"}
    assert ds["response_id"] == [f"r{i}" for i in range(len(RESPONSES_SPEC))]  # status 'ok' only
    assert row["completion"] == "w10 w11 w12 w13" and row["prompt_token_ids"] == [5, 6, 7]
    for r, (_, tokens, _, mrtpo) in zip(ds, RESPONSES_SPEC):
        assert r["completion_token_ids"] == tokens
        assert r["advantages"] == pytest.approx(mrtpo)
        assert r["weights"] == pytest.approx([max(a, 0.0) for a in mrtpo])  # the view's sft_weight


def test_verl_export_loads_back_in_verl_layout(run_dir, tmp_path):
    dest_file = tmp_path / "verl" / "train.parquet"
    export_verl(run_dir, dest_file, advantage="p2t:1,gdpo:-1")
    scope = {"dest_file": str(dest_file)}
    exec(docstring_snippet("import pyarrow.parquet as pq"), scope)
    rows = scope["rows"]
    assert len(rows) == len(RESPONSES_SPEC)
    first = rows[0]
    assert first["data_source"] == "tokencredit/sql" and first["ability"] == "sql"
    assert first["prompt"] == [{"role": "user", "content": "w5 w6 w7"}]
    assert first["reward_model"] == {"style": "rule", "ground_truth": None}
    assert first["extra_info"] == {"index": 0, "response_id": "r0", "group_id": "g0",
                                   "reward_names": ["format", "execution"], "rewards": [1.0, 1.0]}
    for row, (prompt, tokens, _, _) in zip(rows, RESPONSES_SPEC):
        assert row["prompt_token_ids"] == prompt and row["token_ids"] == tokens
        assert row["response"].split() == [f"w{t}" for t in tokens]
        # adv_p2t = gdpo + 0.1 t in the synthetic run, so p2t - gdpo = 0.1 t
        assert row["token_level_advantages"] == pytest.approx([0.1 * t for t in range(len(tokens))], abs=1e-6)


def test_export_of_an_uncomputed_kind_names_it(tmp_path):
    run = write_run(tmp_path / "run", response_rows(p2t=False))
    with pytest.raises(ValueError, match="advantage kind 'p2t' .* is NULL"):
        export_verl(run, tmp_path / "x.parquet", advantage="p2t")
