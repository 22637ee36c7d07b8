"""verl integration, against verl 0.9.1's own registry, reward manager and compute_advantage on a
DataProto built from tokencredit's verl export of a real (small) run."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tokencredit import verifiers
import torch

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos, ray_trainer  # noqa: E402
from verl.workers.reward_manager.naive import NaiveRewardManager  # noqa: E402

from tokencredit import pipeline  # noqa: E402
from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation  # noqa: E402
from tokencredit.pipeline.credit.assign import CreditConfig  # noqa: E402
from tokencredit.pipeline.dataset.export import export_verl  # noqa: E402
from tokencredit.pipeline.integrations.verl import compute_mrtpo_advantage, compute_score  # noqa: E402
from tokencredit.pipeline.models.loading import load_policy  # noqa: E402
from tokencredit.pipeline.config import SamplingConfig  # noqa: E402

TINY_POLICY = Path(pipeline.__file__).parent / "models" / "tiny-policy"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    run_annotation(AnnotateConfig(limit=1, sampling=SamplingConfig(n=4, max_new_tokens=32, seed=3),
                                  credit=CreditConfig(kinds=("gdpo",))), str(out), progress=False)
    return pq.read_table(export_verl(out, out / "verl.parquet", advantage="gdpo")).to_pylist()


def test_compute_score_reproduces_the_runs_verifier_scores(exported):
    assert {r["data_source"] for r in exported} == {"tokencredit/sql", "tokencredit/instructions", "tokencredit/tools"}
    for row in exported:
        for response, rewards in zip(row["response"], row["rewards"]):
            result = compute_score(row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"])
            names = json.loads(result["reward_names"])
            assert [result[n] for n in names] == pytest.approx(rewards)
            keys = json.loads(row["extra_info"]["reward_keys"])  # every row returns the file's whole key set
            assert set(names) < set(keys) and all(result[k] == 0.0 for k in set(keys) - set(names))
            task = row["data_source"].split("/")[1]
            assert [verifiers.stored_reward(task, n)[0] for n in json.loads(result["reward_names"])] == row["reward_names"]
            assert len(json.loads(result["observed"])) == len(rewards)
            assert len(json.loads(result["feedback"])) == len(rewards)
            assert result["score"] == pytest.approx(sum(rewards) / len(rewards))
    with pytest.raises(ValueError, match="data_source 'openai/gsm8k' is not tokencredit's"):
        compute_score("openai/gsm8k", "x", "y", {})


def data_proto(rows, tokenizer) -> DataProto:
    """The exported responses as verl's rollout batch: left-padded prompts, right-padded responses."""
    items = [(row, j) for row in rows for j in range(len(row["response"]))]
    P = max(len(row["prompt_token_ids"]) for row, _ in items)
    T = max(len(row["token_ids"][j]) for row, j in items)
    pad = tokenizer.pad_token_id or 0
    prompts = torch.full((len(items), P), pad)
    responses = torch.full((len(items), T), pad)
    attention = torch.zeros(len(items), P + T, dtype=torch.long)
    for b, (row, j) in enumerate(items):
        p, r = row["prompt_token_ids"], row["token_ids"][j]
        prompts[b, P - len(p):] = torch.tensor(p)
        responses[b, :len(r)] = torch.tensor(r)
        attention[b, P - len(p):P + len(r)] = 1
    non_tensors = {"data_source": np.array([row["data_source"] for row, _ in items], dtype=object),
                   "reward_model": np.array([row["reward_model"] for row, _ in items], dtype=object),
                   "extra_info": np.array([dict(row["extra_info"]) for row, _ in items], dtype=object),
                   "uid": np.array([row["extra_info"]["group_id"] for row, _ in items], dtype=object)}
    return DataProto.from_dict(tensors={"prompts": prompts, "responses": responses, "attention_mask": attention,
                                        "input_ids": torch.cat([prompts, responses], 1),
                                        "response_mask": attention[:, P:].clone()}, non_tensors=non_tensors)


@pytest.fixture(scope="module")
def rewarded(exported):
    """The batch after verl's NaiveRewardManager scored it with compute_score (its dict form)."""
    _, tokenizer = load_policy()
    data = data_proto(exported, tokenizer)
    result = NaiveRewardManager(tokenizer, num_examine=0, compute_score=compute_score)(data, return_dict=True)
    data.batch["token_level_rewards"] = result["reward_tensor"]
    data.non_tensor_batch.update({k: np.array(v) for k, v in result["reward_extra_info"].items()})
    return data, result


def test_verls_reward_manager_takes_the_dict_form(rewarded, exported):
    data, result = rewarded
    keys = json.loads(exported[0]["extra_info"]["reward_keys"])
    assert set(keys) | {"reward_names", "feedback", "score"} <= set(result["reward_extra_info"])
    flat = [rewards for row in exported for rewards in row["rewards"]]
    info = result["reward_extra_info"]
    firsts = [info[json.loads(names)[0]][i] for i, names in enumerate(info["reward_names"])]
    assert firsts == pytest.approx([r[0] for r in flat])
    last = data.batch["response_mask"].sum(-1) - 1
    scores = result["reward_tensor"][torch.arange(len(flat)), last]
    assert scores.tolist() == pytest.approx([sum(r) / len(r) for r in flat])


def test_mrtpo_is_registered_in_verls_registry():
    assert core_algos.get_adv_estimator_fn("mrtpo") is compute_mrtpo_advantage
    assert ray_trainer.compute_advantage.tokencredit  # verl's compute_advantage hands mrtpo the batch


def test_mrtpo_without_replay_is_verls_gdpo(rewarded):
    data, _ = rewarded
    ours = ray_trainer.compute_advantage(copy.deepcopy(data), adv_estimator="mrtpo", config={})
    keys = json.loads(data.non_tensor_batch["extra_info"][0]["reward_keys"])  # verl's gdpo over the named rewards
    theirs = ray_trainer.compute_advantage(copy.deepcopy(data), adv_estimator="gdpo", config={"gdpo_reward_keys": keys})
    assert theirs.batch["advantages"].abs().max() > 0.1
    torch.testing.assert_close(ours.batch["advantages"], theirs.batch["advantages"], atol=1e-6, rtol=0)


def test_mrtpo_with_replay_reallocates_within_each_response(rewarded):
    data, _ = rewarded
    gdpo = ray_trainer.compute_advantage(copy.deepcopy(data), adv_estimator="mrtpo", config={}).batch["advantages"]
    config = {"mrtpo_replay_model": str(TINY_POLICY), "mrtpo_beta": 0.5}
    mrtpo = ray_trainer.compute_advantage(copy.deepcopy(data), adv_estimator="mrtpo", config=config).batch["advantages"]
    mask = data.batch["response_mask"].bool()
    assert (mrtpo[~mask] == 0).all()
    varied = 0
    for i in range(len(mask)):
        tokens = mrtpo[i][mask[i]]
        # mass preservation survives the token whitening: the mean over a response is GDPO's value
        assert tokens.mean().item() == pytest.approx(gdpo[i][mask[i]][0].item(), abs=1e-5)
        varied += int(tokens.std() > 1e-4)
    assert varied > 0, "the replay should move credit between the tokens of some response"
    with pytest.raises(ValueError, match="needs each response's reward scores and feedback"):
        compute_mrtpo_advantage(data.batch["token_level_rewards"], data.batch["response_mask"],
                                data.non_tensor_batch["uid"])


def test_the_readme_config_line_loads_compute_score_through_verl(exported):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create({"reward": {"custom_reward_function": {"path": "pkg://tokencredit.pipeline.integrations.verl",
                                                                     "name": "compute_score"}}})
    reward_fn = get_custom_reward_fn(config)
    row = exported[0]
    scores = reward_fn(data_source=row["data_source"], solution_str=row["response"][0],
                       ground_truth=row["reward_model"]["ground_truth"], extra_info=row["extra_info"])
    assert [scores[n] for n in json.loads(scores["reward_names"])] == pytest.approx(row["rewards"][0])


HAIKU = '''
def haiku(record, response):
    lines = [line for line in response.splitlines() if line.strip()]
    yield "three_lines", float(len(lines) == 3), "Write exactly three lines.", f"{len(lines)} lines"
    yield "long", min(1.0, len(response) / 100), f"Write about the {record['topic']} at length."
'''


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory):
    from tokencredit.verifiers import plugins

    root = tmp_path_factory.mktemp("plugin")
    (root / "haiku.py").write_text(HAIKU)
    prompts = root / "haiku.jsonl"
    prompts.write_text('{"id": "h1", "task": "haiku", "prompt": "Write a haiku about the sea.", "topic": "sea"}\n'
                       '{"id": "h2", "task": "haiku", "prompt": "Write a haiku about snow.", "topic": "snow"}\n')
    config = AnnotateConfig(prompts=str(prompts), verifiers=plugins.resolve([f"haiku={root / 'haiku.py'}:haiku"]),
                            sampling=SamplingConfig(n=4, max_new_tokens=24, seed=3),
                            credit=CreditConfig(kinds=("gdpo",)))
    run_annotation(config, str(root / "run"), progress=False)
    return root


def test_a_plugin_runs_verl_export_is_scored_by_compute_score(plugin_run):
    from tokencredit.flows.cli import main

    dest = plugin_run / "verl.parquet"
    assert main(["export", str(plugin_run / "run"), "--format", "verl", "--advantage", "gdpo",
                 "--dest", str(dest)]) == 0
    rows = pq.read_table(dest).to_pylist()
    assert [r["data_source"] for r in rows] == ["tokencredit/haiku"] * 2
    for row in rows:
        assert json.loads(row["extra_info"]["verifiers"])[0]["task"] == "haiku"
        for response, rewards in zip(row["response"], row["rewards"]):
            result = compute_score(row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"])
            assert json.loads(result["reward_names"]) == row["reward_names"] == ["three_lines", "long"]
            assert [result["three_lines"], result["long"]] == pytest.approx(rewards)
    _, tokenizer = load_policy()
    data = data_proto(rows, tokenizer)  # verl's reward manager and the mrtpo estimator on the plugin task's batch
    result = NaiveRewardManager(tokenizer, num_examine=0, compute_score=compute_score)(data, return_dict=True)
    data.non_tensor_batch.update({k: np.array(v) for k, v in result["reward_extra_info"].items()})
    advantages, _ = compute_mrtpo_advantage(result["reward_tensor"], data.batch["response_mask"],
                                            data.non_tensor_batch["uid"], non_tensor_batch=data.non_tensor_batch,
                                            batch=data.batch)
    mask = data.batch["response_mask"].bool()
    assert torch.isfinite(advantages).all() and (advantages[mask] != 0).any()


def test_a_plugin_runs_export_names_a_missing_verifier(plugin_run, tmp_path):
    from tokencredit.verifiers.plugins import PluginError

    (plugin_run / "haiku.py").rename(plugin_run / "moved.py")
    try:
        with pytest.raises(PluginError, match=r"verifier .*haiku\.py.*(not found|No such file)"):
            export_verl(plugin_run / "run", tmp_path / "verl.parquet", advantage="gdpo")
    finally:
        (plugin_run / "moved.py").rename(plugin_run / "haiku.py")
    edited = tmp_path / "haiku.jsonl"
    edited.write_text('{"id": "h1", "task": "haiku", "topic": "sea"}\n')
    with pytest.raises(ValueError, match=r"record 'h1', which the prompt set .* lacks: it was rejected there \("):
        export_verl(plugin_run / "run", tmp_path / "verl.parquet", advantage="gdpo", prompts=str(edited))


def test_mrtpo_on_the_v1_trainers_batch_says_to_set_use_v1_false(rewarded):
    """verl 0.9.1's v1 trainer (trainer_base._compute_advantage) builds its advantage batch from uid,
    response_mask and rm_scores only; mrtpo cannot replay from that and says what to change."""
    data, _ = rewarded
    v1 = DataProto.from_dict(tensors={"response_mask": data.batch["response_mask"],
                                      "token_level_scores": data.batch["token_level_rewards"],
                                      "token_level_rewards": data.batch["token_level_rewards"]},
                             non_tensors={"uid": data.non_tensor_batch["uid"]})
    with pytest.raises(ValueError, match=r"v1 trainer .*set trainer.use_v1=false"):
        ray_trainer.compute_advantage(v1, adv_estimator="mrtpo", num_repeat=4, config={})
