"""Load the policy and the reward model from local folders only: tokencredit never downloads.

A model argument is a registry name (`tokencredit.pipeline.models.registry`, e.g. `smollm2-135m-instruct`, once pulled), a
folder (`config.json`, `*.safetensors`, tokenizer files) or a Hugging Face repo id already in the local cache. `None` means the tiny models shipped inside the package.
Only safetensors weights are accepted (a pickled `.bin` checkpoint can run code when loaded), and remote
code runs only when the caller asks for it.
"""
from __future__ import annotations

import difflib
import importlib.resources
import inspect
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from tokencredit.pipeline.models.registry import (METADATA, MODELS, check_end_of_turn, registered_path,
                                                  tokenizer_settings)

DEFAULT_POLICY = Path(str(importlib.resources.files("tokencredit.pipeline") / "models" / "tiny-policy"))
DEFAULT_REWARD_MODEL = Path(str(importlib.resources.files("tokencredit.pipeline") / "models" / "tiny-rm"))


def model_name(path: str | Path | None, default: Path = DEFAULT_POLICY) -> str:
    """What the dataset records as the model: the argument as given, or the shipped model's name."""
    return str(path) if path is not None else f"tokencredit/{default.name}"


def resolve_model_path(path: str | Path | None, default: Path) -> Path:
    """The local folder of a model: a registry name (`tokencredit models list`) once pulled, `path`
    itself, its snapshot in the local HF cache, or `default`."""
    if path is None:
        path = default
    registered = registered_path(path) if isinstance(path, str) else None
    if registered is not None:
        return _check_safetensors(registered)
    folder = Path(path).expanduser()
    if folder.is_dir():
        return _check_safetensors(folder)
    from huggingface_hub import snapshot_download
    try:
        return _check_safetensors(Path(snapshot_download(str(path), local_files_only=True)))
    except Exception as error:  # noqa: BLE001 - hub errors vary (bad repo id, not cached, offline)
        raise FileNotFoundError(
            f"model {str(path)!r}: not a registry name, no such local folder and not in the local Hugging Face "
            f"cache ({type(error).__name__}){_suggestion(str(path))}; tokencredit never downloads weights: "
            f"pass a registry name (tokencredit models list: {', '.join(sorted(MODELS))}) or a local folder"
        ) from error


def _suggestion(name: str) -> str:
    close = difflib.get_close_matches(name.lower(), MODELS, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_safetensors(folder: Path) -> Path:
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"model folder {str(folder)!r} has no config.json")
    if not any(folder.glob("*.safetensors")):
        found = sorted(p.name for p in folder.glob("*.bin"))
        raise ValueError(f"model folder {str(folder)!r} has no *.safetensors weights"
                         + (f" (found {found}: pickled checkpoints are refused; convert them with "
                            "save_pretrained(..., safe_serialization=True))" if found else ""))
    return folder


def load_tokenizer(path: str | Path | None = None, *, default: Path = DEFAULT_POLICY,
                   trust_remote_code: bool = False):
    """The model's tokenizer, with a pad token (eos when it has none) and left padding for generation."""
    folder = resolve_model_path(path, default)
    registry = (folder / METADATA).is_file()
    # A registry folder converted before its tokenizer settings were saved gets them here, as a new one has them.
    settings = tokenizer_settings(folder) if registry else {}
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code,
                                              **settings)
    if registry:  # its end of turn was set when it was converted
        check_end_of_turn(folder, tokenizer)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {str(folder)!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _load(auto_class, path, default, device, dtype, trust_remote_code):
    folder = resolve_model_path(path, default)
    # float32 by default: the stored sampling log-probs must match a later teacher-forced forward.
    model = auto_class.from_pretrained(folder, local_files_only=True, use_safetensors=True,
                                       trust_remote_code=trust_remote_code, dtype=dtype or torch.float32)
    tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


def load_policy(path: str | Path | None = None, *, device: str = "cpu", dtype=None,
                trust_remote_code: bool = False):
    """(causal LM in eval mode on `device`, tokenizer). `dtype`: torch dtype or name; None = float32."""
    return _load(AutoModelForCausalLM, path, DEFAULT_POLICY, device, dtype, trust_remote_code)


def load_reward_model(path: str | Path | None = None, *, device: str = "cpu", dtype=None,
                      trust_remote_code: bool = False):
    """(sequence classifier with one output, the scalar reward, in eval mode; tokenizer). Its label count
    is read from config.json first: a wrong one is named before the weights load (or fail to)."""
    config = AutoConfig.from_pretrained(resolve_model_path(path, DEFAULT_REWARD_MODEL), local_files_only=True,
                                        trust_remote_code=trust_remote_code)
    if config.num_labels != 1:
        raise ValueError(f"reward model {str(path or DEFAULT_REWARD_MODEL)!r} has num_labels="
                         f"{config.num_labels}; a reward model has one output (num_labels=1)")
    return _load(AutoModelForSequenceClassification, path, DEFAULT_REWARD_MODEL, device, dtype, trust_remote_code)


def cache_keyword(module) -> str:
    """The forward's name for the KV cache argument: transformers renamed `past_key_values` to
    `cache` during 5.x (the old name warns, and goes in 5.40)."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"
