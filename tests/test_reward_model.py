"""`tokencredit rm train`: preference pairs from a run's verifier labels, a head on the frozen base, held-out
accuracy over prompts never trained on, and a folder that P2T's `--reward-model` takes."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import torch

from tokencredit.flows.cli import main
from tokencredit.pipeline.config import AnnotateConfig, CreditConfig, SamplingConfig
from tokencredit.pipeline.credit.p2t import attribute, encode_for_reward_model
from tokencredit.pipeline.models.loading import DEFAULT_POLICY, load_reward_model
from tokencredit.pipeline.steps import Pipeline
from tokencredit.pipeline.train.reward_model import (L2_GRID, Response, RewardModelConfig, bootstrap_interval,
                                                     check_top_layers, choose_head, family_pairs, heldout_groups,
                                                     load_base, mean_reward_pairs, pairwise_accuracy,
                                                     response_features)
from tokencredit.pipeline.train.top_layers import all_scores, top_backbone, train_top_layers

ROOT = Path(__file__).resolve().parents[1]


def response(rid: str, group: str, rewards: list[float], names=("a", "b")) -> Response:
    return Response(rid, group, "prompt", rid, list(names), rewards)


def test_pairs_are_within_a_group_and_ordered_by_mean_reward():
    responses = [response("x0", "x", [1, 1]), response("x1", "x", [1, 0]), response("x2", "x", [0, 1]),
                 response("y0", "y", [0, 0]), response("z0", "z", [1, 1])]
    chosen, rejected = mean_reward_pairs(responses)
    assert sorted(zip(chosen, rejected)) == [(0, 1), (0, 2)]  # x1 and x2 tie; y and z are other prompts
    families = family_pairs(responses, {"x"})
    assert sorted(families["mean"]) == [(0, 1), (0, 2)]
    assert sorted(families["a"]) == [(0, 2), (1, 2)] and sorted(families["b"]) == [(0, 1), (2, 1)]


def test_heldout_groups_are_a_fixed_fraction_never_all():
    groups = [f"g{i}" for i in range(20)]
    held = heldout_groups(groups, 0.25, seed=0)
    assert len(held) == 5 and held == heldout_groups(list(reversed(groups)), 0.25, seed=0)
    assert held != heldout_groups(groups, 0.25, seed=1)
    assert len(heldout_groups(["a", "b"], 0.9, seed=0)) == 1


def test_the_bootstrap_interval_resamples_prompts_and_is_none_for_pairs_of_one_prompt():
    responses = [response("x0", "x", [1, 1]), response("x1", "x", [0, 0]), response("y0", "y", [1, 1]),
                 response("y1", "y", [0, 0]), response("y2", "y", [0, 1])]
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5])
    assert bootstrap_interval(scores, [(0, 1)], responses, 200, seed=0) == (None, None)  # was [nan, nan] in JSON
    low, high = bootstrap_interval(scores, [(0, 1), (2, 3), (2, 4)], responses, 200, seed=0)
    assert low == pytest.approx(0.0) and high == pytest.approx(1.0)  # a draw of only y (0/2) and one of only x (1/1)


def test_pairwise_accuracy_counts_ties_half():
    assert pairwise_accuracy(torch.tensor([2.0, 1.0, 1.0]), [(0, 1), (1, 2), (2, 0)]) == pytest.approx(0.5)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rm") / "run"
    config = AnnotateConfig(prompts="demo", tasks=("instructions",), limit=16, credit=CreditConfig(kinds=("gdpo",)),
                            sampling=SamplingConfig(n=8, max_new_tokens=32))
    Pipeline(config).run(str(out))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("pooling,train_layers", [("last", 0), ("response_mean", 0), ("last", 1)])
def test_rm_train_on_the_tiny_policy_end_to_end(tiny_run, tmp_path, capsys, pooling, train_layers):
    out = tmp_path / "rm"
    assert main(["rm", "train", str(tiny_run), "--base", str(DEFAULT_POLICY), "--out", str(out), "--steps", "200",
                 "--pooling", pooling, "--train-layers", str(train_layers), "--epochs", "1", "--layer-lr", "1e-3"]) == 0
    printed = capsys.readouterr().out
    assert f"use it as --reward-model {out}" in printed and "mean: held-out pairwise accuracy" in printed
    report = json.loads((out / "rm_train.json").read_text())
    assert (report["dev_accuracy_per_epoch"] is None) == (train_layers == 0)
    if train_layers:
        assert len(report["dev_accuracy_per_epoch"]) == 2 and "dev accuracy per epoch" in printed
    assert report["pairs_train"] >= 8 and report["pairs_heldout"] >= 8 and list(out.glob("*.safetensors"))
    assert report["pooling"] == pooling
    assert json.loads((out / "config.json").read_text())["tokencredit_pooling"] == pooling
    # the saved folder is the trained model: P2T's score of it reproduces the reported held-out accuracy
    model, tokenizer = load_reward_model(out)
    rows = duckdb.sql(f"select response_id, group_id, response, rewards from '{tiny_run}/responses/*.parquet' "
                      "where status = 'ok' order by response_id").fetchall()
    prompts = {r["id"]: r["prompt"] for r in map(json.loads, (ROOT / "verifiers/demo/instructions.jsonl").open())}
    encoded = [encode_for_reward_model(tokenizer, prompts[gid], text) for _, gid, text, _ in rows]
    found = attribute(model, [e[0] for e in encoded], [e[1] for e in encoded])
    scores = {rid: a.score for (rid, *_), a in zip(rows, found)}
    means = {rid: sum(rewards) / len(rewards) for rid, _, _, rewards in rows}
    groups = {rid: gid for rid, gid, _, _ in rows}
    if pooling == "last":  # ... which is HF's own classifier forward
        for (prompt_ids, ids, _), a in zip(encoded[:4], found):
            with torch.no_grad():
                assert float(model(input_ids=torch.tensor([prompt_ids + ids])).logits[0, 0]) == pytest.approx(
                    a.score, abs=1e-4)
    held = set(report["groups_heldout"])
    pairs = [(a, b) for a in scores for b in scores
             if groups[a] == groups[b] and groups[a] in held and means[a] > means[b]]
    right = sum((scores[a] > scores[b]) + 0.5 * (scores[a] == scores[b]) for a, b in pairs) / len(pairs)
    mean_row = next(r for r in report["families"] if r["family"] == "mean")
    assert len(pairs) == mean_row["pairs_heldout"] == report["pairs_heldout"]
    assert right == pytest.approx(mean_row["pairwise_accuracy"], abs=1e-6)  # float32 mean
    if pooling == "last":
        return
    # ... and P2T takes it as --reward-model
    config = AnnotateConfig(prompts="demo", tasks=("instructions",), limit=1, reward_model=str(out),
                            sampling=SamplingConfig(n=2, max_new_tokens=8), credit=CreditConfig(kinds=("gdpo", "p2t")))
    Pipeline(config).run(str(tmp_path / "p2t"))
    raws = duckdb.sql(f"select p2t_raw, token_ids from '{tmp_path}/p2t/responses/*.parquet'").fetchall()
    assert len(raws) == 2 and all(len(raw) == len(ids) for raw, ids in raws)


def test_rm_train_refuses_more_layers_than_the_base_has(tiny_run, tmp_path, capsys):
    assert main(["rm", "train", str(tiny_run), "--base", str(DEFAULT_POLICY), "--out", str(tmp_path / "rm"),
                 "--train-layers", "9"]) == 2
    assert "--train-layers 9: the base needs 1..4 decoder layers" in capsys.readouterr().err
    assert not (tmp_path / "rm").exists()


def test_rm_train_chooses_the_pooling_and_l2_by_cross_validation_on_train_groups():
    """Features where only the response mean separates the pairs: "auto" picks it, a fixed pooling is kept."""
    generator = torch.Generator().manual_seed(0)
    responses = [response(f"{g}{i}", f"g{g}", [float(i % 2)]) for g in range(8) for i in range(4)]
    signal = torch.tensor([r.mean for r in responses])[:, None]
    noise = torch.randn(len(responses), 6, generator=generator)
    features = {"last": noise, "response_mean": torch.cat([signal + 0.1 * noise[:, :1], noise[:, 1:]], 1)}
    chosen, rejected = mean_reward_pairs(responses)
    pairs = list(zip(chosen, rejected))
    pooling, l2 = choose_head(features, pairs, responses, RewardModelConfig(steps=100))
    assert pooling == "response_mean" and l2 in L2_GRID
    assert choose_head(features, pairs, responses, RewardModelConfig(steps=100, pooling="last"))[0] == "last"
    with pytest.raises(ValueError, match="--pooling must be one of"):
        RewardModelConfig(pooling="max")


@pytest.mark.slow
def test_rm_train_refuses_a_run_without_enough_pairs_before_loading_the_base(tmp_path, capsys):
    run = tmp_path / "run"
    Pipeline(AnnotateConfig(prompts="demo", tasks=("instructions",), limit=2, credit=CreditConfig(kinds=("gdpo",)),
                            sampling=SamplingConfig(n=1, max_new_tokens=8))).run(str(run))
    capsys.readouterr()
    assert main(["rm", "train", str(run), "--base", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "rm")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "0 preference pairs in 0 group(s)" in error[0], error
    assert not (tmp_path / "rm").exists()


def test_rm_train_refuses_an_out_folder_it_did_not_write(tmp_path, capsys):
    (tmp_path / "rm").mkdir()
    (tmp_path / "rm" / "notes.txt").write_text("mine")
    assert main(["rm", "train", str(tmp_path / "run"), "--out", str(tmp_path / "rm")]) == 2
    assert "is not a reward model folder of rm train" in capsys.readouterr().err


def tiny_classifier_and_states(n_layers: int):
    """The tiny policy as a one-output classifier, and its cached states entering its top n_layers layers."""
    model, tokenizer = load_base(str(DEFAULT_POLICY))
    texts = ["yes yes yes", "no", "a list:\n- one\n- two", "stop.", "Sure, here it is", "x " * 20]
    responses = [response(f"r{i}", "g", [0.0]) for i in range(len(texts))]
    for r, text in zip(responses, texts):
        r.text = text
    features, cached = response_features(model, tokenizer, responses, batch_size=4,
                                         cache_layer=model.config.num_hidden_layers - n_layers)
    return model, features, cached


@pytest.mark.parametrize("n_layers", [1, 4])
def test_top_layers_on_cached_states_reproduce_the_full_forward(n_layers):
    model, features, cached = tiny_classifier_and_states(n_layers)
    torch.nn.init.normal_(model.score.weight, generator=torch.Generator().manual_seed(0))
    top = top_backbone(model, n_layers)
    for pooling in ("last", "response_mean"):
        expected = features[pooling] @ model.score.weight[0]
        assert torch.allclose(all_scores(model, top, cached, pooling, batch_size=4), expected, atol=1e-4)
    with torch.no_grad():  # "last" is HF's own classifier forward
        full = torch.stack([model(input_ids=torch.tensor([c.ids])).logits[0, 0] for c in cached])
    assert torch.allclose(all_scores(model, top, cached, "last", batch_size=3), full, atol=1e-4)
    with pytest.raises(ValueError, match="--train-layers 5: the base needs 1..4 decoder layers"):
        top_backbone(model, 5)
    config = RewardModelConfig(base="tiny", train_layers=n_layers)  # rm train's own check before training
    check_top_layers(model, cached, features["last"] @ model.score.weight[0], "last", config)
    with pytest.raises(ValueError, match="does not reproduce its own scores from cached states"):
        check_top_layers(model, cached, features["last"] @ model.score.weight[0] + 0.1, "last", config)


def test_train_top_layers_learns_an_order_the_frozen_head_lacks_and_keeps_the_best_dev_epoch():
    """Pairs ordered by a token the zero head cannot see: training the top layer learns it; the modules
    trained are the classifier's own (its full forward agrees), and a dev set it cannot fit keeps epoch 0."""
    model, _, cached = tiny_classifier_and_states(1)
    torch.nn.init.zeros_(model.score.weight)
    fit = [(0, j) for j in range(1, 6)] + [(2, j) for j in (1, 3, 4, 5)]
    history = train_top_layers(model, cached, fit, fit, pairwise_accuracy, "last", 1, epochs=8, lr=3e-3, pair_batch=4,
                               seed=0)
    assert history[0] == 0.5 and max(history) == 1.0  # a zero head ties every pair
    scores = all_scores(model, top_backbone(model, 1), cached, "last", batch_size=6)
    assert pairwise_accuracy(scores, fit) == max(history)
    with torch.no_grad():
        full = torch.stack([model(input_ids=torch.tensor([c.ids])).logits[0, 0] for c in cached])
    assert torch.allclose(scores, full, atol=1e-4)
    before = [p.clone() for p in model.parameters()]
    history = train_top_layers(model, cached, fit, [(j, i) for i, j in fit], pairwise_accuracy, "last", 1, epochs=2,
                               lr=3e-3, pair_batch=4, seed=0)
    assert history[0] == max(history)  # the reversed dev order only gets worse: epoch 0 is kept
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
