"""The reference checkers the fidelity benchmark compares against, taken from their own wheels.

    python bench/references.py          # unpack them into bench/.reference (ignored by git)

`pip download --no-deps` fetches lm-eval (its `tasks/ifeval` is a copy of Google's IFEval
checkers), bfcl-eval (BFCL's AST checker and data) and immutabledict (which IFEval's utilities
import) into `bench/.reference/wheels`; they are unpacked beside it and imported by path, without
their package `__init__`s (lm-eval's and bfcl-eval's pull in model clients). langdetect and nltk
are tokencredit's own dependencies. NLTK's Punkt tables are given to the reference through an
NLTK data folder holding tokencredit's shipped copy (`verifiers/data/punkt_tab`, byte-identical
to the one in the llama-index-core wheel), so nothing is downloaded at run time.
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "bench" / ".reference"
WHEELS = {"lm_eval": "lm-eval==0.4.13", "bfcl_eval": "bfcl-eval==2026.3.23", "immutabledict": "immutabledict==4.3.1"}


def available() -> bool:
    return all((HERE / name).is_dir() for name in WHEELS)


def unpack() -> Path:
    """Download (once) and unpack the reference wheels into bench/.reference."""
    if available():
        return HERE
    (HERE / "wheels").mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(HERE / "wheels"),
                    *WHEELS.values()], check=True)
    for wheel in (HERE / "wheels").glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(HERE)
    punkt = HERE / "nltk_data" / "tokenizers" / "punkt_tab" / "english"
    shutil.copytree(ROOT / "verifiers" / "data" / "punkt_tab" / "english", punkt, dirs_exist_ok=True)
    return HERE


def _package(name: str, folder: Path) -> None:
    """Register `name` as a package at `folder` without running its __init__."""
    if name not in sys.modules:
        module = types.ModuleType(name)
        module.__path__ = [str(folder)]
        sys.modules[name] = module


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def ifeval():
    """lm-eval's `tasks/ifeval/utils` (test_instruction_following_strict / _loose and InputExample)."""
    import nltk

    unpack()
    if str(HERE) not in sys.path:
        sys.path.append(str(HERE))  # immutabledict
    nltk.data.path.insert(0, str(HERE / "nltk_data"))
    base = HERE / "lm_eval" / "tasks" / "ifeval"
    for name, folder in (("lm_eval", HERE / "lm_eval"), ("lm_eval.tasks", HERE / "lm_eval" / "tasks"),
                         ("lm_eval.tasks.ifeval", base)):
        _package(name, folder)
    for name in ("instructions_util", "instructions", "instructions_registry", "utils"):
        module = _module(f"lm_eval.tasks.ifeval.{name}", base / f"{name}.py")
    return module


def bfcl():
    """bfcl-eval's `ast_checker` module (model-name lookups answered by a stub: no name mangling)."""
    unpack()
    base = HERE / "bfcl_eval"
    for name, folder in (("bfcl_eval", base), ("bfcl_eval.constants", base / "constants"),
                         ("bfcl_eval.eval_checker", base / "eval_checker"),
                         ("bfcl_eval.eval_checker.ast_eval", base / "eval_checker" / "ast_eval")):
        _package(name, folder)
    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = {"tokencredit": types.SimpleNamespace(underscore_to_dot=False)}
    sys.modules["bfcl_eval.constants.model_config"] = stub
    return _module("bfcl_eval.eval_checker.ast_eval.ast_checker", base / "eval_checker" / "ast_eval" / "ast_checker.py")


def bfcl_data() -> Path:
    """BFCL's data folder inside the wheel: BFCL_v4_*.json and possible_answer/."""
    unpack()
    return HERE / "bfcl_eval" / "data"


if __name__ == "__main__":
    print(f"references unpacked in {unpack()}")
