"""Chunked JS divergence over the full vocabulary vs the naive full-tensor formula.

    python bench/bench_divergence.py [--quick]

Reports (1) the max abs difference of the two, (2) their median times at a size where the naive
one fits (target: chunked within 1.1x of naive), (3) the peak extra RSS of the chunked version at
T = 4096, vocab = 152064, batch 1, float32 logits, and at T = 1024 (bounded: below one float32 [T, V]
tensor as method.md asks, and not growing with T; each memory figure comes from a fresh process), and
the bytes the naive one would need there, extrapolated from fresh-process runs at smaller T (it is run
at 4096 only if that estimate is under 8 GB).
"""
from __future__ import annotations

import argparse
import json

import torch

from common import gib, interleaved_times, mib, peak_extra_bytes, run_child, upsert_result, verdict

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    parser.add_argument("--child", nargs=4, metavar=("KIND", "T", "V", "CHUNK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, T, V, chunk = args.child
        return child(kind, int(T), int(V), int(chunk))

    from tokencredit.pipeline.credit.divergence import js_divergence, js_divergence_naive

    chunk = 128
    t_time, repeats = (128, 3) if args.quick else (512, 5)
    t_mem = 1024 if args.quick else 4096
    print(f"sizes: vocab {VOCAB}, batch 1, float32, chunk_size {chunk}; timing at T={t_time} "
          f"({repeats} repeats, median); chunked memory at T={t_mem}")

    p, q = logits_pair(t_time, VOCAB)
    diff = (js_divergence(p, q, chunk) - js_divergence_naive(p, q)).abs().max().item()
    times = interleaved_times({"chunked": lambda: js_divergence(p, q, chunk),
                               "naive": lambda: js_divergence_naive(p, q)}, repeats=repeats)
    ratio = times["chunked"] / times["naive"]
    del p, q
    print(f"max |chunked - naive| = {diff:.2e}")
    print(f"T={t_time}: chunked {times['chunked']:.3f} s, naive {times['naive']:.3f} s, ratio {ratio:.2f}x "
          f"(target <= 1.1x: {verdict(ratio <= 1.1)})")

    # bounded (method.md): never one float32 [T, V] tensor; the T/4 figure shows it does not grow with T
    chunked_quarter = measure("chunked", t_mem // 4, VOCAB, chunk)
    chunked_peak = measure("chunked", t_mem, VOCAB, chunk)
    bounded = chunked_peak < t_mem * VOCAB * 4
    # naive peak extra is linear in T (a fixed number of float32 [T, V] temporaries): fit it on two sizes
    small = [t_time // 2, t_time]
    naive_small = [measure("naive", t, VOCAB, chunk) for t in small]
    per_position = (naive_small[1] - naive_small[0]) / (small[1] - small[0])
    naive_est = per_position * t_mem
    tensors = per_position / (VOCAB * 4)
    naive_note = f"estimated {gib(naive_est)} (~{tensors:.1f} float32 [T, V] tensors; not run, > 8 GB)"
    if naive_est < NAIVE_RUN_LIMIT:
        naive_est = measure("naive", t_mem, VOCAB, chunk)
        naive_note = f"measured {gib(naive_est)}"
    input_bytes = 2 * t_mem * VOCAB * 4
    print(f"T={t_mem}: inputs {gib(input_bytes)}; chunked peak extra {mib(chunked_peak)} "
          f"({chunked_peak / input_bytes:.1%} of the inputs; {mib(chunked_quarter)} at T={t_mem // 4}); "
          f"naive {naive_note}")
    print(f"naive peak extra at T={small}: {[mib(b) for b in naive_small]}")

    upsert_result(
        "JS divergence: chunked vs naive (bench_divergence.py)",
        "Chunked `js_divergence` vs `js_divergence_naive`, vocab 152064, batch 1, float32 logits. "
        "Peak extra = peak RSS minus RSS before the call, each in a fresh process.",
        "quick" if args.quick else "full",
        f"time at T={t_time} ({repeats} reps, median); memory at T={t_mem}; chunk {chunk}",
        f"max abs diff {diff:.1e}; chunked {times['chunked']:.3f} s vs naive {times['naive']:.3f} s = "
        f"{ratio:.2f}x; peak extra at T={t_mem}: chunked {mib(chunked_peak)} ({mib(chunked_quarter)} at "
        f"T={t_mem // 4}), naive {naive_note}",
        f"time <= 1.1x: {verdict(ratio <= 1.1)}; chunked peak < one float32 [T, V] tensor "
        f"({gib(t_mem * VOCAB * 4)}): {verdict(bounded)}",
    )


if __name__ == "__main__":
    main()
