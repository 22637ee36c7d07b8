"""TRL integration: real TRL 1.16 GRPOTrainer steps on the shipped tiny policy, on CPU."""
from __future__ import annotations

import copy

import pytest
import torch

trl = pytest.importorskip("trl")

from tokencredit import verifiers  # noqa: E402
from tokencredit.pipeline.credit.advantages import gdpo, preset  # noqa: E402
from tokencredit.pipeline.credit.assign import CreditConfig  # noqa: E402
from tokencredit.pipeline.integrations.trl import (MRTPOTrainer, VerifierRewards, plugin_refs,  # noqa: E402
                                                   prompt_dataset, verifier_rewards)
from tokencredit.pipeline.models.loading import load_policy  # noqa: E402
from tokencredit.schemas.records import RecordError  # noqa: E402

G = 4  # completions per prompt
LR = 0.01  # plain SGD: a first-order step, where each token follows its own advantage


@pytest.fixture(scope="module")
def records():
    by_task = {}
    for r in verifiers.load_tasks("demo")[0]:
        by_task.setdefault(r.task, []).append(r)
    return [by_task["sql"][0], by_task["tools"][0], by_task["instructions"][1]]


def grpo_config(tmp_path, **overrides):
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=len_batch(), num_generations=G,
                    max_completion_length=32, max_steps=1, learning_rate=1e-3, beta=0.0, report_to="none",
                    use_cpu=True, logging_steps=1, save_strategy="no", seed=0, bf16=False,
                    multi_objective_aggregation="normalize_then_sum")
    return trl.GRPOConfig(**{**settings, **overrides})


def len_batch():
    return 3 * G


def generation_inputs(dataset):
    return [dataset[i] for i in range(len(dataset)) for _ in range(G)]  # as TRL's RepeatSampler orders them


def reward_tensors(scores):
    K = max(len(s) for s in scores)
    rewards, mask = torch.zeros(len(scores), K, dtype=torch.float64), torch.zeros(len(scores), K, dtype=torch.bool)
    for i, s in enumerate(scores):
        rewards[i, :len(s)] = torch.tensor([r.score for r in s], dtype=torch.float64)
        mask[i, :len(s)] = True
    return rewards, mask


@pytest.fixture(scope="module")
def scored(records, tmp_path_factory):
    """One TRL generation+scoring pass of a plain GRPOTrainer (TRL's own GDPO) with tokencredit's rewards,
    and an MRTPOTrainer at beta 0 sharing its model and reward functions."""
    torch.manual_seed(0)
    model, tokenizer = load_policy()
    rewards = VerifierRewards({r.id: r for r in records})
    dataset = prompt_dataset(records, tokenizer)
    base = trl.GRPOTrainer(model=model, reward_funcs=rewards.functions, args=grpo_config(tmp_path_factory.mktemp("a")),
                           train_dataset=dataset, processing_class=tokenizer)
    ours = MRTPOTrainer(model=model, records=records, args=grpo_config(tmp_path_factory.mktemp("b")),
                        train_dataset=dataset, processing_class=tokenizer,
                        credit=CreditConfig(kinds=("gdpo", "mrtpo"), beta=0.0, locate="replay", gdpo=preset("trl")))
    ours.verifier = rewards  # the same verification of the same completions
    inputs = generation_inputs(dataset)
    model.train()
    output = base._generate_and_score_completions(inputs)
    return base, ours, inputs, output, rewards.last[1]


def test_trl_preset_equals_trls_normalize_then_sum(scored):
    _, _, _, output, scores = scored
    rewards, mask = reward_tensors(scores)
    group = torch.arange(len(scores)) // G
    ours = gdpo(rewards, mask, group, preset("trl"))
    assert ours.varied.any(), "the tiny policy's completions must differ in some reward for this to mean anything"
    torch.testing.assert_close(ours.total.float(), output["advantages"], atol=1e-6, rtol=0)


def test_beta_zero_gives_trls_gdpo_loss(scored):
    base, ours, inputs, output, _ = scored
    advantages = ours.token_advantages(inputs, output)
    mask = output["completion_mask"].bool()
    assert advantages.shape == output["completion_ids"].shape
    expected = output["advantages"][:, None].expand_as(advantages)
    torch.testing.assert_close(advantages[mask], expected[mask], atol=1e-6, rtol=0)
    assert (advantages[~mask] == 0).all()
    base.current_gradient_accumulation_steps = ours.current_gradient_accumulation_steps = 1  # set by train()
    theirs = base.compute_loss(base.model, output)
    mine = ours.compute_loss(ours.model, {**output, "advantages": advantages})
    assert mine.item() == pytest.approx(theirs.item(), abs=1e-6)


class Capturing(MRTPOTrainer):
    def _generate_and_score_completions(self, inputs):
        self.captured = super()._generate_and_score_completions(inputs)
        return self.captured


def test_one_mrtpo_step_raises_credited_and_lowers_debited_tokens(records, tmp_path):
    torch.manual_seed(0)
    model, tokenizer = load_policy()
    trainer = Capturing(model=model, records=records, args=grpo_config(tmp_path, learning_rate=LR, optim="sgd"),
                        train_dataset=prompt_dataset(records, tokenizer), processing_class=tokenizer,
                        credit=CreditConfig(kinds=("gdpo", "mrtpo"), beta=1.0, locate="replay", gdpo=preset("trl")),
                        warmup_steps=0)
    before = copy.deepcopy(trainer.model)  # as TRL prepared it (its fused log-prob head)
    trainer.train()
    out = trainer.captured
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    attention = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    T = out["completion_ids"].shape[1]
    with torch.no_grad():
        old = trainer._get_per_token_logps_and_entropies(before, ids, attention, T)[0]
        new = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, T)[0]
    mask, adv = out["completion_mask"].bool(), out["advantages"]
    assert adv.dim() == 2 and (adv[mask] > 0).any() and (adv[mask] < 0).any()
    assert not torch.equal(adv[mask], adv[mask][:1].expand_as(adv[mask]))
    change = new - old
    assert change[mask & (adv > 0)].mean() > 0 and change[mask & (adv < 0)].mean() < 0
    assert (adv * change)[mask].sum() > 0  # the surrogate the step climbs
    metrics = trainer.state.log_history[0]
    assert metrics["mrtpo/beta"] == 1.0 and metrics["mrtpo/replays_done"] > 0


def test_token_weighted_sft_trainer_reads_the_training_view(tmp_path):
    from transformers import LlamaForCausalLM, TrainingArguments

    from tokencredit.pipeline.integrations.trl import TokenWeightedSFTTrainer, sft_dataset, weighted_collator
    from tokencredit.pipeline.train.losses import token_weighted_sft_loss
    from tests.test_train import PAD, response_rows, tiny_policy, write_run

    run = write_run(tmp_path / "run", response_rows())
    model = LlamaForCausalLM.from_pretrained(tiny_policy(tmp_path / "policy"))
    dataset = sft_dataset(run)  # sft_weight: the positive part of MRTPO; all-zero responses left out
    assert len(dataset) == 3 and dataset[1]["sft_weight"] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    batch = weighted_collator(PAD)(list(dataset))

    def loss():
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return token_weighted_sft_loss(logits, batch["labels"], batch["credit"]).item()

    before = loss()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=3, max_steps=1,
                             learning_rate=0.5, optim="sgd", report_to="none", use_cpu=True, logging_steps=1,
                             remove_unused_columns=False, save_strategy="no")
    trainer = TokenWeightedSFTTrainer(model=model, args=args, train_dataset=dataset,
                                      data_collator=weighted_collator(PAD))
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(before, rel=1e-5)
    assert loss() < before


def test_p2t_and_mixes_reach_the_loss(scored, records, tmp_path):
    from tokencredit.pipeline.models.loading import load_reward_model
    from tokencredit.pipeline.credit.p2t import attribute, token_rewards

    base, _, inputs, output, _ = scored
    reward_model, _ = load_reward_model()
    trainer = MRTPOTrainer(model=base.model, records=records, args=grpo_config(tmp_path),
                           train_dataset=base.train_dataset, processing_class=base.processing_class,
                           credit=CreditConfig(kinds=("gdpo", "p2t"), gdpo=preset("trl")), advantage="p2t:2,gdpo:-1",
                           reward_model=reward_model)
    trainer.verifier = scored[1].verifier
    advantages = trainer.token_advantages(inputs, output)
    mask = output["completion_mask"].bool()
    prompts = [output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist() for i in range(len(mask))]
    completions = [output["completion_ids"][i][mask[i]].tolist() for i in range(len(mask))]
    for i, a in enumerate(attribute(reward_model, prompts, completions)):
        expected = 2 * (output["advantages"][i] + 0.1 * token_rewards(a.score, a.raw)) - output["advantages"][i]
        torch.testing.assert_close(advantages[i][mask[i]], expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"needs credit kinds \['mrtpo'\]"):
        MRTPOTrainer(model=base.model, records=records, args=grpo_config(tmp_path), train_dataset=base.train_dataset,
                     processing_class=base.processing_class, credit=CreditConfig(kinds=("gdpo",)))


HAIKU_TRL = '''
from tokencredit.verifiers.trl_rewards import trl_verifier


def length_reward(completions, **kwargs):  # a TRL reward function: a batch in, one float per completion out
    return [float(len(c)) for c in completions]


def topic_reward(completions, topic, **kwargs):
    return [float(t in c.lower()) for c, t in zip(completions, topic)]


length = trl_verifier(length_reward, feedback="Write about 100 characters.", name="length", bounds=(0, 100))
topic = trl_verifier(topic_reward, feedback=lambda record: f"Mention the {record['topic']}.", name="on_topic")
'''


@pytest.fixture()
def haiku_task(tmp_path):
    (tmp_path / "haiku_rewards.py").write_text(HAIKU_TRL)
    prompts = tmp_path / "haiku.jsonl"
    prompts.write_text('{"id": "h1", "task": "haiku", "prompt": "Write a haiku about the sea.", "topic": "sea"}\n'
                       '{"id": "h2", "task": "haiku", "prompt": "Write a haiku about snow.", "topic": "snow"}\n')
    specs = [f"haiku={tmp_path / 'haiku_rewards.py'}:length", f"haiku={tmp_path / 'haiku_rewards.py'}:topic"]
    records, rejected = verifiers.load_tasks(prompts, plugin_tasks=("haiku",))
    assert len(records) == 2 and not rejected
    return records, specs


def test_a_plugin_task_of_trl_reward_functions_trains_one_step_with_named_rewards(haiku_task, tmp_path):
    records, specs = haiku_task
    torch.manual_seed(0)
    model, tokenizer = load_policy()
    trainer = Capturing(model=model, records=records, verifiers=specs,
                        args=grpo_config(tmp_path, per_device_train_batch_size=2 * G),
                        train_dataset=prompt_dataset(records, tokenizer), processing_class=tokenizer,
                        credit=CreditConfig(kinds=("gdpo", "mrtpo"), beta=1.0, locate="replay", gdpo=preset("trl")),
                        warmup_steps=0)
    assert trainer.verifier.names == ["length", "on_topic"]
    trainer.train()
    metrics = trainer.state.log_history[0]
    assert {"rewards/length/mean", "rewards/on_topic/mean"} <= set(metrics)
    assert not any("tokencredit_reward" in key for key in metrics)
    scores = trainer.verifier.last[1]
    texts = tokenizer.batch_decode(trainer.captured["completion_ids"], skip_special_tokens=True)
    assert [s[0].score for s in scores] == pytest.approx([min(1.0, len(t) / 100) for t in texts], abs=0.02)
    assert {s[1].feedback for s in scores} == {"Mention the sea.", "Mention the snow."}
    mask, adv = trainer.captured["completion_mask"].bool(), trainer.captured["advantages"]
    assert (adv[mask] > 0).any() and (adv[mask] < 0).any() and metrics["mrtpo/replays_done"] > 0


def test_a_missing_plugin_verifier_is_named_and_a_short_run_says_beta_is_warming_up(haiku_task, tmp_path, caplog):
    records, specs = haiku_task
    model, tokenizer = load_policy()
    kwargs = dict(model=model, records=records, args=grpo_config(tmp_path, per_device_train_batch_size=2 * G),
                  train_dataset=prompt_dataset(records, tokenizer), processing_class=tokenizer)
    with pytest.raises(RecordError, match="no verifier for task 'haiku'"):
        MRTPOTrainer(**kwargs)
    with caplog.at_level("WARNING", logger="tokencredit.pipeline.integrations.trl"):
        MRTPOTrainer(**kwargs, verifiers=specs)
    assert "beta warms up over 10 steps and the run has 1" in caplog.text


CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n### Response\n{% endfor %}"  # a minimal chat template


def test_conversational_trl_reward_functions_work_through_trl_verifier_in_a_trl_step(haiku_task, tmp_path):
    """A conversational dataset: TRL hands the reward functions message lists; TRL's documented
    conversational function, a `trl_verifier` object in a (task, verifier) pair, scores the assistant text."""
    from tests.test_plugins import TRL_DOCS_REWARDS

    records, _ = haiku_task
    (tmp_path / "docs_rewards.py").write_text(TRL_DOCS_REWARDS)
    torch.manual_seed(0)
    model, tokenizer = load_policy()
    tokenizer.chat_template = CHAT_TEMPLATE
    dataset = prompt_dataset(records, tokenizer)
    assert dataset[0]["prompt"] == [{"role": "user", "content": "Write a haiku about the sea."}]
    think = verifiers.plugins.load(verifiers.plugins.resolve([f"{tmp_path / 'docs_rewards.py'}:think"])[0])
    funcs = verifier_rewards(records, verifiers=[("haiku", think), f"haiku={tmp_path / 'docs_rewards.py'}:length"])
    seen = []

    def spy(completions, **kwargs):  # what TRL passes the reward functions
        seen.extend(completions)
        return [None] * len(completions)

    trainer = trl.GRPOTrainer(model=model, reward_funcs=[*funcs, spy], processing_class=tokenizer, train_dataset=dataset,
                              args=grpo_config(tmp_path, per_device_train_batch_size=2 * G))
    trainer.train()
    assert all(isinstance(c, list) and c[0]["role"] == "assistant" for c in seen)
    assert think.conversational is True
    metrics = trainer.state.log_history[0]
    assert {"rewards/format_reward_func/mean", "rewards/reward_len/mean"} <= set(metrics)
    texts = [c[0]["content"] for c in seen]
    lengths = [min(1.0, max(0.0, (20 - abs(20 - len(t))) / 20)) for t in texts]
    assert metrics["rewards/reward_len/mean"] == pytest.approx(sum(lengths) / len(lengths), abs=1e-5)


FAILS_ON_SNOW = '''
def haiku(record, response):
    if record["topic"] == "snow":
        raise RuntimeError("no snow today")
    yield "long", min(1.0, len(response) / 100), "Write 100 characters."
'''


def test_a_verifier_failing_inside_trl_gives_a_warned_none_reward_and_training_goes_on(haiku_task, tmp_path, caplog):
    records, _ = haiku_task
    (tmp_path / "fails.py").write_text(FAILS_ON_SNOW)
    torch.manual_seed(0)
    model, tokenizer = load_policy()
    trainer = Capturing(model=model, records=records, verifiers=[f"haiku={tmp_path / 'fails.py'}:haiku"],
                        args=grpo_config(tmp_path, per_device_train_batch_size=2 * G),
                        train_dataset=prompt_dataset(records, tokenizer), processing_class=tokenizer,
                        credit=CreditConfig(kinds=("gdpo", "mrtpo"), beta=1.0, locate="replay", gdpo=preset("trl")),
                        warmup_steps=0)
    with caplog.at_level("WARNING", logger="tokencredit.pipeline.integrations.trl"):
        trainer.train()
    assert trainer.state.global_step == 1
    warned = [r.getMessage() for r in caplog.records if "verifiers failed" in r.getMessage()]
    assert len(warned) == G and all("record 'h2'" in w and "RuntimeError: no snow today" in w
                                    and "fails.py:haiku" in w for w in warned)
    _, scores, statuses = trainer.verifier.last
    failed = [s != "ok" for s in statuses]
    assert sum(failed) == G and all(s == f"verifier_error: RuntimeError: no snow today (raised by verifier "
                                        f"{tmp_path / 'fails.py'}:haiku)" for s in statuses if s != "ok")
    assert all(scores[i] == [] for i in range(len(scores)) if failed[i])
    out = trainer.captured
    mask, adv = out["completion_mask"].bool(), out["advantages"]
    assert all((adv[i][mask[i]] == 0).all() for i, bad in enumerate(failed) if bad)  # no advantage, as TRL's
    assert (adv[mask] != 0).any()
    metrics = trainer.state.log_history[0]
    assert metrics["rewards/long/mean"] == pytest.approx(
        sum(s[0].score for s in scores if s) / (len(scores) - G), abs=1e-5)  # TRL's mean leaves None out


def test_reward_funcs_and_a_dataset_without_record_id_say_what_to_pass(haiku_task, tmp_path):
    records, specs = haiku_task
    model, tokenizer = load_policy()
    kwargs = dict(model=model, records=records, verifiers=specs, processing_class=tokenizer,
                  args=grpo_config(tmp_path, per_device_train_batch_size=2 * G))
    with pytest.raises(TypeError, match=r"not reward_funcs: pass records= and verifiers=.*trl_verifier"):
        MRTPOTrainer(**kwargs, train_dataset=prompt_dataset(records, tokenizer), reward_funcs=[len])
    no_ids = prompt_dataset(records, tokenizer).remove_columns("record_id")
    with pytest.raises(ValueError, match="train_dataset has no record_id column.*names the task record each prompt "
                                         r"was made from.*prompt_dataset\(records, tokenizer\) adds it"):
        MRTPOTrainer(**kwargs, train_dataset=no_ids)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=verifier_rewards(records, specs), train_dataset=no_ids,
                              processing_class=tokenizer, args=kwargs["args"])
    with pytest.raises(ValueError, match="reward function 'length': the dataset has no record_id column"):
        trainer.train()


class CountingVerifier:
    """Counts its calls; the reward names it gives depend on the record's task only."""

    def __init__(self):
        self.calls = 0

    def __call__(self, record, response):
        self.calls += 1
        return [(f"{record['task']}_short", float(len(response) < 40), "Answer in 40 characters.")]


def test_construction_asks_each_plugin_once_per_task_and_a_record_with_other_names_is_a_warned_failure(tmp_path,
                                                                                                      caplog):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "{task}{i}", "task": "{task}", "prompt": "Write."}}\n'
                               for task in ("haiku", "limerick") for i in range(5)))
    records, _ = verifiers.load_tasks(prompts, plugin_tasks=("*",))
    counter = CountingVerifier()
    rewards = VerifierRewards({r.id: r for r in records}, plugin_refs([counter]))
    assert counter.calls == 2 and rewards.names == ["haiku_short", "limerick_short"]
    assert rewards.functions[1](["short", "a" * 50], record_id=["limerick3", "limerick3"]) == [1.0, 0.0]
    assert rewards.functions[0](["short"], record_id=["limerick3"]) == [None]  # not this record's reward

    def by_record(record, response):
        return [(record["id"], 1.0, "Anything.")]

    rewards = VerifierRewards({r.id: r for r in records}, plugin_refs([by_record]))
    with caplog.at_level("WARNING", logger="tokencredit.pipeline.integrations.trl"):
        assert rewards.functions[0](["x", "x"], record_id=["haiku0", "haiku1"]) == [1.0, None]
    assert "record 'haiku1'" in caplog.text and "a plugin must give every record of a task the same reward names" \
        in caplog.text


def test_plugin_refs_take_objects_pairs_specs_and_refs(haiku_task):
    _, specs = haiku_task
    counter = CountingVerifier()
    refs = plugin_refs([("haiku", counter), counter, specs[0], verifiers.plugins.resolve([specs[1]])[0]])
    assert [r.task for r in refs] == ["haiku", None, "haiku", "haiku"]
    assert refs[0].target == "tests.test_trl:CountingVerifier" and refs[0].obj is counter
    with pytest.raises(TypeError, match=r"expected a list of verifiers, e.g. \[\('haiku', haiku\)\]"):
        plugin_refs(counter)
    with pytest.raises(TypeError, match="is not a \\(task, verifier\\) pair"):
        plugin_refs([("haiku", counter, "extra")])
