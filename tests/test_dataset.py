"""The dataset does not depend on how the run was split into shards (method.md section 1): GDPO's
batch step is taken over the whole run by the views, the rest depends only on each prompt group."""
from __future__ import annotations

import math

import pytest
import torch

from tokencredit.pipeline.credit.advantages import batch_statistics, gdpo, preset
from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
from tokencredit.pipeline.credit.assign import CreditConfig
from tokencredit.pipeline.dataset.query import connect
from tokencredit.pipeline.config import SamplingConfig

# Values that come out of a model forward (sampling log-probs, replay distances, P2T attributions)
# change in their last float bits with the batch's shape, which the shard changes; everything else
# must be equal exactly.
FORWARD = {"sample_logprobs", "mrtpo_sum", "adv_mrtpo", "p2t_raw", "p2t_reward", "adv_p2t", "sft_weight",
           "distance", "weight", "advantage"}
ORDER = {"responses": "response_id", "training": "response_id", "credits": "response_id, reward, position"}


def config(shard_size: int, **credit) -> AnnotateConfig:
    return AnnotateConfig(limit=2, shard_size=shard_size, sampling=SamplingConfig(n=3, max_new_tokens=40, seed=7),
                          credit=CreditConfig(kinds=("gdpo", "mrtpo", "p2t"), **credit))


def table(out, name: str) -> list[dict]:
    return connect(out).sql(f"SELECT * EXCLUDE (shard) FROM {name} ORDER BY {ORDER[name]}"
                            if name == "responses" else f"SELECT * FROM {name} ORDER BY {ORDER[name]}").fetchall()


def assert_same(a, b, columns, where: str) -> None:
    for x, y, column in zip(a, b, columns):
        if column in FORWARD and x is not None and y is not None:
            xs, ys = (x, y) if isinstance(x, list) else ([x], [y])
            assert ys == pytest.approx(xs, rel=1e-5, abs=1e-5), f"{where}: {column}"
        else:
            assert x == y, f"{where}: {column}: {x!r} != {y!r}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    outs = {size: root / f"size-{size}" for size in (1, 3, 6)}  # 6 = all prompts in one shard
    for size, out in outs.items():
        run_annotation(config(size), str(out), progress=False)
    return outs


@pytest.mark.parametrize("name", ["responses", "credits", "training"])
def test_shard_size_does_not_change_the_dataset(runs, name):
    columns = [c[0] for c in connect(runs[1]).sql(f"SELECT * FROM {name} LIMIT 0").description]
    columns = [c for c in columns if c != "shard"]
    one = table(runs[1], name)
    assert len(one) == {"responses": 18, "training": 18}.get(name, len(one)) and len(one) > 0
    for size in (3, 6):
        other = table(runs[size], name)
        assert len(other) == len(one)
        for row_one, row_other in zip(one, other):
            assert_same(row_one, row_other, columns, f"{name}, shard size {size}, row {row_one[0]}")


def test_views_apply_gdpos_batch_step_over_the_whole_run(runs):
    con = connect(runs[1])
    rows = con.sql("SELECT group_id, reward_names, rewards, token_ids, gdpo_sum, adv_gdpo, mrtpo_sum, adv_mrtpo, "
                   "p2t_reward, p2t_alpha, adv_p2t, gdpo_scale, gdpo_shift FROM responses "
                   "WHERE status = 'ok' ORDER BY response_id").fetchall()
    K = max(len(r[1]) for r in rows)
    rewards = torch.zeros(len(rows), K, dtype=torch.float64)
    mask = torch.zeros(len(rows), K, dtype=torch.bool)
    groups = {}
    for i, r in enumerate(rows):
        rewards[i, :len(r[2])] = torch.tensor(r[2], dtype=torch.float64)
        mask[i, :len(r[2])] = True
        groups.setdefault(r[0], len(groups))
    group = torch.tensor([groups[r[0]] for r in rows])
    whole = gdpo(rewards, mask, group)  # one batch: the whole run
    torch.testing.assert_close(torch.tensor([r[4] for r in rows], dtype=torch.float64), whole.summed,
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.tensor([r[5] for r in rows], dtype=torch.float64), whole.total,
                               atol=1e-5, rtol=0)
    scale, shift = rows[0][11], rows[0][12]
    assert scale == pytest.approx(whole.scale.item(), rel=1e-6) and shift == pytest.approx(whole.shift.item(), abs=1e-6)
    manifest_batch = run_annotation(config(1), str(runs[1]), progress=False)["gdpo_batch"]  # resumed: nothing to do
    assert manifest_batch == {"scale": scale, "shift": shift}
    for r in rows:
        assert r[7] == pytest.approx([scale * (s - shift) for s in r[6]], rel=1e-6, abs=1e-6)
        assert r[10] == pytest.approx([r[5] + r[9] * p for p in r[8]], rel=1e-5, abs=1e-5)
        # mass preservation carries through the batch step: mean_t adv_mrtpo = adv_gdpo
        assert sum(r[7]) / len(r[7]) == pytest.approx(r[5], abs=1e-5)
    # the old per-shard batch step would have given each one-prompt shard its own scale
    per_shard = {g: batch_statistics(whole.summed[group == g], torch.ones(int((group == g).sum()), dtype=torch.bool))
                 for g in range(len(groups))}
    assert max(abs(s.item() - scale) for s, _ in per_shard.values()) > 0.05


def test_the_runs_gdpo_options_reach_the_views(tmp_path):
    out = tmp_path / "trl"
    run_annotation(config(3, gdpo=preset("trl")), str(out), progress=False)
    rows = connect(out).sql("SELECT gdpo_sum, adv_gdpo, gdpo_scale FROM responses WHERE status = 'ok'").fetchall()
    S = [r[0] for r in rows]
    mean = sum(S) / len(S)
    sample_std = math.sqrt(sum((s - mean) ** 2 for s in S) / (len(S) - 1))
    assert rows[0][2] == pytest.approx(1 / (sample_std + 1e-4), rel=1e-6)
    for s, adv, _ in rows:
        assert adv == pytest.approx((s - mean) / (sample_std + 1e-4), rel=1e-5, abs=1e-6)
