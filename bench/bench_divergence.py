"""Chunked JS divergence over the full vocabulary vs the naive full-tensor formula.

    python -m bench divergence [--quick]

Reports (1) the max abs difference of the two, (2) their median times at a size where the naive
one fits (target: chunked within 1.1x of naive), (3) the peak extra RSS of the chunked version at
T = 4096, vocab = 152064, batch 1, float32 logits, and at T = 1024 (bounded: below one float32 [T, V]
tensor as method.md asks, and not growing with T; each memory figure comes from a fresh process), and
the bytes the naive one would need there, extrapolated from fresh-process runs at smaller T (it is run
at 4096 only if that estimate is under 8 GB).
"""
from __future__ import annotations

import json
import sys

import torch

from common import Harness, peak_extra_bytes, run_child
from registry import Target, benchmark

VOCAB = 152064
NAIVE_RUN_LIMIT = 8 * 2**30


def logits_pair(T: int, V: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two [1, T, V] float32 logit tensors: q is p plus a perturbation (nearly equal rows, as in replay)."""
    g = torch.Generator().manual_seed(seed)
    p = 3 * torch.randn(1, T, V, generator=g)
    q = p + 0.5 * torch.randn(1, T, V, generator=g)
    return p, q


def child(kind: str, T: int, V: int, chunk: int) -> None:
    """Print the peak extra RSS of one call of `kind` on fresh [1, T, V] inputs, as JSON."""
    from tokencredit.pipeline.credit.divergence import js_divergence, js_divergence_naive

    p, q = logits_pair(T, V)
    fn = (lambda: js_divergence(p, q, chunk)) if kind == "chunked" else (lambda: js_divergence_naive(p, q))
    extra, _ = peak_extra_bytes(fn)
    print(json.dumps({"kind": kind, "T": T, "V": V, "extra": extra, "inputs": 2 * p.nbytes}))


def measure(kind: str, T: int, V: int, chunk: int) -> int:
    return run_child(__file__, ["--child", kind, str(T), str(V), str(chunk)])["extra"]


@benchmark("divergence", measures="Chunked `js_divergence` against `js_divergence_naive`, vocab 152064, batch 1, "
           "float32 logits: the largest difference, time at T 512, and the peak extra RSS at T 4096 (each in a fresh "
           "process; the naive one's extrapolated where it would pass 8 GB).",
           targets=(Target("chunked_over_naive", "<=", 1.1), Target("chunked_peak_below_one_tensor", "==", True)))
def run(h: Harness) -> dict:
    from tokencredit.pipeline.credit.divergence import js_divergence, js_divergence_naive

    chunk, vocab = 128, VOCAB // 16 if h.quick else VOCAB
    t_time, h.repeats = (64, 2) if h.quick else (512, 5)
    t_mem = 256 if h.quick else 4096
    p, q = logits_pair(t_time, vocab)
    diff = (js_divergence(p, q, chunk) - js_divergence_naive(p, q)).abs().max().item()
    times = h.interleaved_times({"chunked": lambda: js_divergence(p, q, chunk),
                                 "naive": lambda: js_divergence_naive(p, q)}, repeats=h.repeats)
    del p, q
    # bounded (method.md): never one float32 [T, V] tensor; the T/4 figure shows it does not grow with T
    chunked_quarter = measure("chunked", t_mem // 4, vocab, chunk)
    chunked_peak = measure("chunked", t_mem, vocab, chunk)
    # naive peak extra is linear in T (a fixed number of float32 [T, V] temporaries): fit it on two sizes
    small = [t_time // 2, t_time]
    naive_small = [measure("naive", t, vocab, chunk) for t in small]
    per_position = (naive_small[1] - naive_small[0]) / (small[1] - small[0])
    naive_peak, naive_measured = per_position * t_mem, False
    if naive_peak < NAIVE_RUN_LIMIT:
        naive_peak, naive_measured = measure("naive", t_mem, vocab, chunk), True
    return {"vocab": vocab, "chunk": chunk, "t_time": t_time, "t_memory": t_mem, "max_abs_diff": diff,
            "chunked_s": round(times["chunked"], 4), "naive_s": round(times["naive"], 4),
            "chunked_over_naive": round(times["chunked"] / times["naive"], 3),
            "chunked_peak_mib": round(chunked_peak / 2**20, 1), "chunked_peak_mib_quarter_t": round(chunked_quarter / 2**20, 1),
            "naive_peak_mib": round(naive_peak / 2**20, 1), "naive_peak_measured": naive_measured,
            "chunked_peak_below_one_tensor": chunked_peak < t_mem * vocab * 4}


if __name__ == "__main__":  # a child process of measure(): --child KIND T V CHUNK
    child(sys.argv[2], *map(int, sys.argv[3:6]))
