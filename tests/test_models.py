"""Local model loading: real tiny Llama checkpoints written to disk and read back."""
from __future__ import annotations

import importlib.resources
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, PreTrainedTokenizerFast

from tokencredit.pipeline.models.loading import DEFAULT_POLICY, DEFAULT_REWARD_MODEL, load_policy, load_reward_model, resolve_model_path

SPECIALS = ["<pad>", "<s>", "</s>"]


def tiny_tokenizer(pad: bool = True) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer with no merges: one token per byte plus 3 specials (vocab 259)."""
    vocab = {t: i for i, t in enumerate(SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   **({"pad_token": "<pad>"} if pad else {}))


def tiny_config(vocab_size: int, **extra) -> LlamaConfig:
    # initializer_range well above the default 0.02 so the random model's next-token
    # distributions are peaked (greedy decoding then has no near-ties to flip).
    return LlamaConfig(**{**dict(vocab_size=vocab_size, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                 initializer_range=0.3, pad_token_id=0, bos_token_id=1, eos_token_id=2), **extra})


def save_tiny_policy(folder: Path, seed: int = 0, pad: bool = True) -> Path:
    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer(pad)
    LlamaForCausalLM(tiny_config(len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_load_policy_reads_the_saved_weights(tmp_path):
    torch.manual_seed(1)
    tokenizer = tiny_tokenizer()
    original = LlamaForCausalLM(tiny_config(len(tokenizer))).eval()
    original.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    model, loaded_tokenizer = load_policy(tmp_path)
    ids = torch.tensor([loaded_tokenizer("SELECT 1;")["input_ids"]])
    assert not model.training and model.dtype == torch.float32
    assert loaded_tokenizer.padding_side == "left" and loaded_tokenizer.pad_token == "<pad>"
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, original(ids).logits, rtol=0, atol=1e-6)


def test_tokenizer_without_pad_token_pads_with_eos(tmp_path):
    _, tokenizer = load_policy(save_tiny_policy(tmp_path, pad=False))
    assert tokenizer.pad_token == "</s>" and tokenizer.pad_token_id == tokenizer.eos_token_id == 2


def test_refuses_a_pickled_only_checkpoint(tmp_path):
    tokenizer = tiny_tokenizer()
    model = LlamaForCausalLM(tiny_config(len(tokenizer)))
    model.config.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"no \*\.safetensors.*pytorch_model\.bin.*refused"):
        load_policy(tmp_path)


def test_missing_model_names_the_path_and_never_downloads(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model.*never downloads"):
        load_policy(missing)
    with pytest.raises(FileNotFoundError, match="someone/not-cached-model.*never downloads"):
        resolve_model_path("someone/not-cached-model", DEFAULT_POLICY)


def test_load_reward_model_has_one_output_and_pools_the_last_real_token(tmp_path):
    torch.manual_seed(2)
    tokenizer = tiny_tokenizer()
    LlamaForSequenceClassification(tiny_config(len(tokenizer), num_labels=1)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, tokenizer = load_reward_model(tmp_path)
    batch = tokenizer(["ab", "a longer text"], padding=True, return_tensors="pt")
    alone = tokenizer(["ab"], return_tensors="pt")
    with torch.no_grad():
        scores = model(**batch).logits
        score_alone = model(**alone).logits
    assert scores.shape == (2, 1)
    torch.testing.assert_close(scores[0], score_alone[0], rtol=0, atol=1e-5)  # left padding is ignored


def test_reward_model_with_several_labels_is_refused(tmp_path):
    tokenizer = tiny_tokenizer()
    LlamaForSequenceClassification(tiny_config(len(tokenizer), num_labels=2)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="num_labels=2"):
        load_reward_model(tmp_path)


def test_default_models_live_inside_the_package():
    package = Path(str(importlib.resources.files("tokencredit.pipeline")))
    assert DEFAULT_POLICY == package / "models" / "tiny-policy"
    assert DEFAULT_REWARD_MODEL == package / "models" / "tiny-rm"


@pytest.mark.skipif(not (DEFAULT_POLICY / "config.json").is_file() or not (DEFAULT_REWARD_MODEL / "config.json").is_file(),
                    reason="the shipped tiny models are not built yet")
def test_shipped_models_load_and_share_a_tokenizer():
    policy, policy_tokenizer = load_policy()
    reward_model, rm_tokenizer = load_reward_model()
    assert isinstance(policy, LlamaForCausalLM) and isinstance(reward_model, LlamaForSequenceClassification)
    assert policy_tokenizer.get_vocab() == rm_tokenizer.get_vocab()
