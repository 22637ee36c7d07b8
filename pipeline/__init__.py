"""tokencredit's stages and algorithms: sample -> verify -> credit -> write -> train."""
import os

# Both are read when the OpenMP / MKL runtimes start, so they are set here, before torch does any work,
# and only where the user has not chosen otherwise.
# MKL may run a matmul on fewer threads than asked when the machine is busy, which changes the
# last bits of every log-prob and so the dataset's bytes; a fixed thread count keeps a run
# reproducible.
os.environ.setdefault("MKL_DYNAMIC", "FALSE")
# OpenMP threads that spin while waiting for work stall each other when another process holds a core:
# with 2 torch threads beside a busy process an annotation ran 9x slower than with one thread. Passive
# waiting yields the core; the thread count, and so the dataset's bytes, do not change.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Exported lazily: importing this package (the CLI's start) must not import torch, which `steps` needs.
_LAZY = {"Pipeline": "steps", "AnnotateConfig": "config", "SamplingConfig": "config", "CreditConfig": "config"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
