"""Shared pytest fixtures. Keep each fixture in its own delimited block."""
from tokencredit import pipeline  # noqa: F401 - first: its thread settings must be in place before torch loads OpenMP
# Prefect's console log handler takes sys.stderr as it is when Prefect's logging is set up: set it up here, at
# collection, so that the handler holds the session's stream rather than one test's capsys (closed after it).
import os  # noqa: E402

os.environ.setdefault("DO_NOT_TRACK", "1")
import prefect.main  # noqa: F401,E402
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM


# --- tiny_causal_lm (replay, divergence) -------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_causal_lm():
    """A random-weight 2-layer Llama (vocab 128, hidden 32), seeded, eval mode, float32.

    initializer_range 0.3 (not HF's 0.02) so its next-token distributions are far from uniform
    and replay distances are O(0.1), not O(1e-6): comparisons at 1e-5 then mean something.
    """
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):  # seeded without moving other tests' global RNG
        torch.manual_seed(0)
        return LlamaForCausalLM(config).eval()
# --- end tiny_causal_lm -------------------------------------------------------------------------


# --- prefect_harness (flows) ---------------------------------------------------------------------
@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server for the whole session (it takes ~25 s to start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
# --- end prefect_harness -------------------------------------------------------------------------


# --- bench_module (tests that read a benchmark's cases or checks) ------------------------------------
@pytest.fixture(scope="session")
def bench_module():
    """`importlib.import_module` for bench/'s scripts, without the settings bench/common.py makes on import (one
    torch thread, OMP_NUM_THREADS for the processes it starts: the benchmarks' own) staying in the session."""
    import importlib
    import sys
    from pathlib import Path

    def load(name: str):
        threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
        bench = str(Path(__file__).resolve().parents[1] / "bench")
        if bench not in sys.path:
            sys.path.insert(0, bench)
        try:
            return importlib.import_module(name)
        finally:
            torch.set_num_threads(threads)
            if omp is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = omp
    return load
# --- end bench_module ---------------------------------------------------------------------------------
