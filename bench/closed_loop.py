"""The closed loop: annotate -> train, repeated, for GDPO (uniform), MRTPO and P2T token credit.

    python bench/closed_loop.py [--quick] [--iterations I] [--steps S] [--seeds 0,1,2]
    python bench/closed_loop.py --model smollm2-135m-instruct --lora --tasks instructions --kinds gdpo,mrtpo ...

From the shipped tiny policy (or `--model`), each (advantage kind, seed) run repeats: sample the train-split demo
prompts with the current policy and annotate them (`run_annotation`, credit gdpo + that kind),
then `S` steps of the offline clipped policy gradient (`pipeline.train.trainer`) on that run's chosen
advantage column, starting from the current policy. After every iteration the policy is scored on
the held-out test-split prompts: mean verifier reward (mean over a response's rewards, then over
responses) per task, sampled at temperature 1.0 with a fixed evaluation seed, so that every run
and iteration is scored on the same prompts and the same random numbers.

Writes `bench/closed_loop.png` (mean reward per task against training steps, mean over seeds with
min-max band), `bench/closed_loop.csv` (every point) and a row in bench/RESULTS.md, including
whether MRTPO reaches GDPO's final reward in fewer steps (`closed_loop_<model>.*` for another model).
With `--lora` each iteration trains LoRA adapters and merges them into the next iteration's policy.
`--quick` (CI-sized) runs one seed and one short iteration per kind and writes nothing but its printout.
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
import time
from pathlib import Path

from common import ROOT, THREADS, upsert_result

KINDS = ("gdpo", "mrtpo", "p2t")


def evaluate(policy: str | None, records, n: int, seed: int, max_new_tokens: int = 96) -> dict[str, float]:
    """Mean verifier reward per task (and 'all') of `n` temperature-1.0 samples per record."""
    import verifiers
    from pipeline.sampling import SamplingConfig, make_sampler

    sampler = make_sampler("transformers", policy)
    samples = sampler.sample(records, SamplingConfig(n=n, max_new_tokens=max_new_tokens, seed=seed, batch_size=64))
    by_id = {r.id: r for r in records}
    per_task: dict[str, list[float]] = {}
    for s in samples:
        scores = [r.score for r in verifiers.verify(by_id[s.group_id], s.response)]
        per_task.setdefault(s.task, []).append(sum(scores) / len(scores))
    out = {task: sum(v) / len(v) for task, v in sorted(per_task.items())}
    out["all"] = sum(out.values()) / len(out)
    return out


def one_run(kind: str, seed: int, args, work: Path, test_records) -> list[dict]:
    """Curve of one (kind, seed): a row per iteration (steps done, reward per task)."""
    from pipeline.annotate import AnnotateConfig, run_annotation
    from pipeline.credit.assign import CreditConfig
    from pipeline.sampling import SamplingConfig
    from pipeline.train.trainer import TrainConfig, train

    policy: str | None = args.model  # None: the shipped tiny policy
    rows = []
    for it in range(args.iterations):
        run_dir, ckpt = work / f"{kind}-{seed}-data-{it}", work / f"{kind}-{seed}-ckpt-{it}"
        config = AnnotateConfig(tasks=tuple(args.tasks.split(",")), split="train", limit=args.prompts,
                                model=policy, shard_size=args.prompts * 3, cpu_threads=THREADS,
                                sampling=SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens,
                                                        seed=1000 * seed + it),
                                credit=CreditConfig(kinds=("gdpo",) if kind == "gdpo" else ("gdpo", kind)))
        start = time.perf_counter()
        run_annotation(config, str(run_dir), progress=False)
        annotate_s = time.perf_counter() - start
        train(TrainConfig(data=str(run_dir), out=str(ckpt), advantage=kind, objective="pg", model=policy,
                          steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=seed,
                          save_every=args.steps, lora=args.lora))
        policy = merge_adapter(policy, ckpt / "final", work / f"{kind}-{seed}-policy-{it}") if args.lora \
            else str(ckpt / "final")
        reward = evaluate(policy, test_records, args.eval_n, args.eval_seed, args.max_new_tokens)
        rows.append({"kind": kind, "seed": seed, "iteration": it + 1, "steps": (it + 1) * args.steps,
                     "annotate_s": round(annotate_s, 1), **reward})
        print(json.dumps(rows[-1]), flush=True)
        if it > 0:  # keep only the current policy: the runs stay within a few hundred MB of disk
            shutil.rmtree(work / f"{kind}-{seed}-ckpt-{it - 1}")
            shutil.rmtree(work / f"{kind}-{seed}-policy-{it - 1}", ignore_errors=True)
        shutil.rmtree(run_dir)
    return rows


def merge_adapter(base: str | None, adapter: Path, out: Path) -> str:
    """The base policy with a LoRA adapter merged in, saved as a safetensors folder the sampler loads."""
    from peft import PeftModel

    from pipeline.models.loading import load_policy

    model, tokenizer = load_policy(base)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return str(out)


def steps_to_reach(rows: list[dict], kind: str, target: float, seeds: list[int]) -> int | None:
    """First step at which `kind`'s seed-mean 'all' reward reaches `target` (None: never)."""
    for steps in sorted({r["steps"] for r in rows if r["kind"] == kind}):
        values = [r["all"] for r in rows if r["kind"] == kind and r["steps"] == steps]
        if len(values) == len(seeds) and sum(values) / len(values) >= target:
            return steps
    return None


def plot(rows: list[dict], tasks: list[str], kinds: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.2), sharex=True, squeeze=False)
    axes = axes[0]
    for ax, task in zip(axes, tasks):
        for kind in kinds:
            steps = sorted({r["steps"] for r in rows if r["kind"] == kind})
            values = [[r[task] for r in rows if r["kind"] == kind and r["steps"] == s] for s in steps]
            if not steps:
                continue
            mean = [sum(v) / len(v) for v in values]
            line, = ax.plot(steps, mean, marker="o", label=kind)
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], alpha=0.15,
                            color=line.get_color())
        ax.set_title(task)
        ax.set_xlabel("training steps")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean verifier reward (held-out)")
    axes[-1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size: 1 seed, 1 iteration, tiny sets")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20, help="training steps per iteration")
    parser.add_argument("--prompts", type=int, default=32, help="train prompts per task per iteration")
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--eval-n", type=int, default=2, help="samples per held-out prompt")
    parser.add_argument("--eval-limit", type=int, default=0, help="held-out prompts per task (0: all)")
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--model", default=None, help="starting policy (default: the shipped tiny policy)")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters, merged after each iteration")
    parser.add_argument("--tasks", default="sql,instructions,tools")
    parser.add_argument("--kinds", default=",".join(KINDS), help="advantage kinds to compare")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    if args.quick:
        args.iterations, args.steps, args.prompts, args.n, args.seeds = 1, 4, 4, 2, "0"
        args.eval_n, args.eval_limit = 1, 8
    seeds = [int(s) for s in args.seeds.split(",")]

    from pipeline.annotate import AnnotateConfig, load_prompt_set

    test_records = load_prompt_set(AnnotateConfig(tasks=tuple(args.tasks.split(",")), split="test",
                                                  limit=args.eval_limit or None))[0]
    tasks = sorted({r.task for r in test_records})
    start = time.perf_counter()
    base = evaluate(args.model, test_records, args.eval_n, args.eval_seed, args.max_new_tokens)
    rows = [{"kind": kind, "seed": seed, "iteration": 0, "steps": 0, "annotate_s": 0.0, **base}
            for kind in kinds for seed in seeds]
    print(json.dumps({"starting policy": base}), flush=True)
    with tempfile.TemporaryDirectory(prefix="tokencredit-loop-") as tmp:
        for kind in kinds:
            for seed in seeds:
                rows += one_run(kind, seed, args, Path(tmp), test_records)
    minutes = (time.perf_counter() - start) / 60

    final = {kind: sum(r["all"] for r in rows if r["kind"] == kind and r["iteration"] == args.iterations)
             / len(seeds) for kind in kinds}
    reach = {kind: steps_to_reach(rows, kind, final["gdpo"], seeds) for kind in kinds}
    print(f"final mean reward (all tasks): {json.dumps({k: round(v, 4) for k, v in final.items()})}")
    print(f"steps to reach GDPO's final {final['gdpo']:.4f}: {reach}; {minutes:.1f} min")
    if args.quick:
        return

    name = "closed_loop" if args.model is None else f"closed_loop_{args.model}"
    with (ROOT / "bench" / f"{name}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, tasks, kinds, ROOT / "bench" / f"{name}.png")
    per_task = "; ".join(f"{kind}: " + ", ".join(
        f"{t} {sum(r[t] for r in rows if r['kind'] == kind and r['iteration'] == args.iterations) / len(seeds):.3f}"
        for t in tasks) for kind in kinds)
    faster = reach["mrtpo"] is not None and reach["mrtpo"] < reach["gdpo"]
    start_name = "the shipped tiny policy" if args.model is None else f"{args.model}{' (LoRA)' if args.lora else ''}"
    upsert_result(
        "Closed loop: annotate -> train (closed_loop.py)" + ("" if args.model is None else f", {args.model}"),
        f"From {start_name}: per iteration, annotate the train-split prompts with the current policy, "
        "then offline clipped PG steps on the chosen advantage; held-out (test-split) mean verifier reward at "
        f"temperature 1.0 after each iteration. Plot: `bench/{name}.png`; points: `bench/{name}.csv`.",
        "full",
        f"{len(seeds)} seeds x {args.iterations} iterations x {args.steps} steps (batch {args.batch_size}, "
        f"lr {args.lr}); tasks {args.tasks}; max_new_tokens {args.max_new_tokens}; "
        f"{args.prompts} train prompts per task x {args.n} samples per iteration; held-out {len(test_records)} "
        f"prompts x {args.eval_n} samples; {minutes:.0f} min",
        f"starting policy {base['all']:.3f}; final (seed mean, all tasks) "
        + ", ".join(f"{k} {v:.3f}" for k, v in final.items())
        + f"; per task: {per_task}; steps to reach GDPO's final: "
        + ", ".join(f"{k} {v if v is not None else 'never'}" for k, v in reach.items()),
        f"MRTPO reaches GDPO's final reward in fewer steps: {'yes' if faster else 'no'}",
    )


if __name__ == "__main__":
    main()
