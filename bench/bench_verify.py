"""The verify stage in worker processes against the same calls in this process, on the demo set.

    python bench/bench_verify.py [--quick]

The demo set's prompts (16 per task, `--quick`: 4), sampled once by the shipped tiny policy with
annotate's default sampling, are verified shard by shard as annotate does (`verify_samples` per
shard of `AnnotateConfig.shard_size` prompts):
- isolated: `verify_samples`, each call in a worker process (`tokencredit.verifiers.isolation`),
  which at each shard's end also ends what its verifiers started;
- inline: the verify stage before isolation, each `verifiers.verify` call in this process on one
  thread (its `BoundedCaller`: a queue round trip) and awaited at most `verifier_timeout_s`.
Medians of interleaved repeats after one warm-up each, so the worker's start (once per annotate
process, timed on its own below) is not in the ratio. Both must give the same scores.
Target: isolated / inline <= 1.2. Writes bench/results/verify.json and a bench/RESULTS.md row.
"""
from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from common import ROOT, THREADS, interleaved_times, model_paths, update_figures, upsert_result, verdict

VERIFY_JSON = ROOT / "bench" / "results" / "verify.json"
TARGET = 1.2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 prompts per task, 3 repeats")
    args = parser.parse_args()

    from tokencredit import verifiers
    from tokencredit.pipeline.annotate import AnnotateConfig, load_models, load_prompt_set, shards_of, verify_samples
    from tokencredit.verifiers import isolation

    limit, repeats = (4, 3) if args.quick else (16, 5)
    policy, _, note = model_paths()
    config = AnnotateConfig(limit=limit, model=policy, cpu_threads=THREADS)
    records, _ = load_prompt_set(config)
    by_id = {r.id: r for r in records}
    sampler = load_models(config).sampler
    shards = [sampler.sample(shard, config.sampling) for shard in shards_of(records, config.shard_size)]
    n = sum(map(len, shards))

    def isolated():
        return [[v.rewards for v in verify_samples(samples, by_id)] for samples in shards]

    def inline():  # each call on a thread and awaited with a timeout, as the verify stage did before
        with ThreadPoolExecutor(max_workers=1) as thread:
            return [[thread.submit(verifiers.verify, by_id[s.group_id], s.response).result(config.verifier_timeout_s)
                     for s in samples] for samples in shards]

    start = time.perf_counter()
    isolated()  # the first call starts the worker
    first = time.perf_counter() - start
    if isolated() != inline():
        raise RuntimeError("the isolated and inline verify stages gave different scores")
    t = interleaved_times({"isolated": isolated, "inline": inline}, repeats=repeats)
    ratio = t["isolated"] / t["inline"]
    per_call_ms = (t["isolated"] - t["inline"]) / n * 1e3
    worker_start = first - t["isolated"]
    isolation.close_workers()
    tasks = sorted({r.task for r in records})
    sizes = (f"{len(records)} demo prompts ({', '.join(tasks)}) x {config.sampling.n} samples = {n} responses, "
             f"{len(shards)} shards of {config.shard_size} prompts; {note}; {repeats} interleaved reps, median")
    figures = (f"verify stage isolated {t['isolated']:.3f} s, inline {t['inline']:.3f} s: "
               f"{ratio:.3f}x ({per_call_ms:+.2f} ms per response); worker start {worker_start:.2f} s once per process")
    print(f"sizes: {sizes}\n{figures}\ntarget isolated/inline <= {TARGET}: {verdict(ratio <= TARGET)}")
    update_figures({"isolated_over_inline": round(ratio, 4), "isolated_s": round(t["isolated"], 4),
                    "inline_s": round(t["inline"], 4), "per_response_overhead_ms": round(per_call_ms, 3),
                    "worker_start_s": round(worker_start, 3), "responses": n, "shards": len(shards),
                    "mode": "quick" if args.quick else "full"}, VERIFY_JSON)
    upsert_result(
        "Verify stage in worker processes (bench_verify.py)",
        "Annotate's verify stage on the demo set with each verifier call in a worker process (bounded in time "
        "and memory, killable with what it started) over the same calls in the annotate process.",
        "quick" if args.quick else "full", sizes, figures, f"isolated/inline <= {TARGET}: {verdict(ratio <= TARGET)}")


if __name__ == "__main__":
    main()
