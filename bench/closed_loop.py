"""Does token credit train better than sequence credit? The closed-loop experiments.

    python bench/closed_loop.py pilot     [--temperatures 0.5,0.7,1.0]   # pass rate per kind, train split
    python bench/closed_loop.py offline   [--seeds 0,1,2] [--steps S]      # one pool, three credits
    python bench/closed_loop.py iterated  [--seeds 0,1] [--rounds R]       # annotate -> train, repeated
    python bench/closed_loop.py dev       [--variants gdpo,mrtpo,...]      # one change per hypothesis
    python bench/closed_loop.py report                                     # json, plot, RESULTS.md
    python bench/closed_loop.py quick                                      # CI: both arms, a few steps, tiny
    python bench/closed_loop.py compare    # both experiments' offline arms by compare's statistics: compare.json
                                           # (and the powered design's rows, once bench/.closed_loop-powered has them)
    python bench/closed_loop.py plan       # compare --plan for bench/compare_designs/powered.toml

The experiments' offline arms are compare designs (bench/compare_designs/mrtpo_offline.toml, mc_tree.toml): a new
run is `tokencredit compare bench/compare_designs/NAME.toml --out DIR`, and `compare` re-analyses the stored per-prompt
rewards with compare's variance-components intervals (the crossed bootstrap below kept beside them as a column).

Design (the README and RESULTS.md follow the numbers whatever they are). The 2026-12-04 CPU run was not
pre-registered: the midpoint, `mrtpo_both`, the dev screen and the iterated arm's second seed were added after
held-out results (its rows' `note`); a pre-registered run commits its design file first and passes that commit
to `report --design-commit`, which every row records (`design_commit`).
- Policy: SmolLM2-135M-Instruct with LoRA (r 8, every linear layer), the same for every arm.
- Prompts: `bench/closed_loop_prompts/prompts.jsonl`, instruction requests under 2-4 constraints; kinds and
  the sampling temperature chosen on the pilot's train prompts; held-out prompts (their own topics) are never
  used to choose anything; a quarter of them ask only for kinds no train prompt asks for (unseen).
- Offline arm: one pool (train prompts x 8 responses) sampled once and annotated once with gdpo,mrtpo;
  then, from the same base policy, the same steps, learning rate, batch order and seed per arm: PG on GDPO's
  advantages, PG on MRTPO's, and rejection sampling (SFT on the responses that pass every reward).
  `--methods` adds MRTPO at beta 1 (`mrtpobeta1`) and MRTPO located by the verifier's spans (`mrtpo_both`);
  `--midpoint S` also scores step S of the methods run (a method's steps to its baseline's final are read
  only where the baseline was scored at the same steps: run the midpoint for every method).
- Iterated arm: rounds of sample -> annotate -> train from the current policy, GDPO against MRTPO; per round
  scored greedily on every k-th held-out prompt, the last round (`--final-eval`) on all of them, both decodings.
- Hypotheses (`dev`): one change each (beta, learning rate, the verifier's spans), trained once on the pool
  and scored on the last `--dev-prompts` train prompts, which the pool does not use: never on held-out ones.
- Evaluation, paired: every policy on the same held-out prompts with the same sampling seeds, greedy and
  sampled; a prompt's reward is the mean of its constraint scores. Every method against GDPO and rejection
  sampling (and a variant against the method it varies: `comparisons`), paired by seed and prompt, with a 95%
  crossed bootstrap interval: each replicate resamples the trained seeds and the prompts together, since
  the trained models are a sample too (`ci_low_seeds`, `ci_high_seeds`, `per_seed_diff`; the prompts-only
  interval over seed means beside it, `ci_low_prompts`, `ci_high_prompts`); unseen kinds apart. The smallest
  difference the design detects (80% power, two-sided 5%) is 2.8 crossed standard errors (`mde_seeds`); the
  gain ratio (gain over the start / the baseline's gain) has its crossed interval too. Steps to the
  baseline's final reward only where both were scored at the same checkpoints.

Every stage writes its result as it finishes under `bench/.closed_loop/` (a pool, checkpoints and one
JSON file per evaluated policy), and a re-run skips what is there, so a stopped run resumes. Without that
folder, `report` analyses the committed per-prompt rewards (`bench/results/closed_loop_per_prompt.json`) and
keeps the pool's figures from `closed_loop_details.json`.

Sizes. The 2-core CPU run (bench/RESULTS.md) used a pool of 64 train prompts x 8, 16 steps of batch 8 per
offline arm (midpoint 11), and iterated rounds of 8 prompts x 4, 4 steps, scored greedily on every 4th
held-out prompt, the last round on all 256; the hypotheses on 64 dev prompts:
    python bench/closed_loop.py offline --train-prompts 64 --steps 16 --batch-size 8 --lr 3e-4 \
        --methods gdpo,mrtpo,rs,mrtpo_both
    python bench/closed_loop.py offline --train-prompts 64 --steps 16 --batch-size 8 --lr 3e-4 \
        --methods mrtpo --midpoint 11
    python bench/closed_loop.py iterated --seeds 0,1 --round-prompts 8 --n 4 --round-steps 4 --batch-size 8 \
        --lr 3e-4 --greedy-only --round-eval-stride 4 --final-eval
    python bench/closed_loop.py dev --train-prompts 64 --steps 16 --batch-size 8 --lr 3e-4
The full-size run, for a GPU:
    python bench/closed_loop.py offline --device cuda --train-prompts 0 --steps 128 --eval-every 32 --batch-size 16
    python bench/closed_loop.py iterated --device cuda --seeds 0,1 --rounds 6 --round-prompts 64 --n 8 \
        --round-steps 16 --batch-size 16
    python bench/closed_loop.py report
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from tokencredit.pipeline.compare import analysis

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "bench" / "closed_loop_prompts"
SMOLLM2 = "smollm2-135m-instruct"
# Each experiment keeps its own state and results: mc_tree's (tree-sampled groups and the mc credit,
# pre-registered in bench/closed_loop_design.md) under the plain names, mrtpo_offline's (MRTPO against GDPO, not
# pre-registered) under `_mrtpo_offline`.
EXPERIMENTS = ("mc_tree", "mrtpo_offline")


def use_experiment(name: str) -> None:
    """Point STATE and the result files at one experiment's."""
    global STATE, RESULTS_JSON, PER_PROMPT_JSON, DETAILS_JSON, PLOT
    suffix = "" if name == "mc_tree" else f"_{name}"
    STATE = ROOT / "bench" / f".closed_loop{suffix.replace('_', '-')}"
    RESULTS_JSON = ROOT / "bench" / "results" / f"closed_loop{suffix}.json"
    PER_PROMPT_JSON = ROOT / "bench" / "results" / f"closed_loop{suffix}_per_prompt.json"
    DETAILS_JSON = ROOT / "bench" / "results" / f"closed_loop{suffix}_details.json"
    PLOT = ROOT / "bench" / f"closed_loop{suffix}.png"


use_experiment("mc_tree")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def load_records(path: Path, split: str | None = None):
    from tokencredit import verifiers

    records, rejected = verifiers.load_tasks(path)
    if rejected:
        raise SystemExit(f"{path}: {len(rejected)} records rejected, first: {rejected[0]}")
    return [r for r in records if split is None or r.split == split]


# --- evaluation -------------------------------------------------------------------------------------


def score_samples(samples, by_id) -> dict[str, dict]:
    """Per prompt: mean reward of its samples and the pass rate (score 1) of each constraint kind."""
    from tokencredit import verifiers

    per: dict[str, dict] = {}
    for s in samples:
        scores = verifiers.verify(by_id[s.group_id], s.response)
        row = per.setdefault(s.group_id, {"rewards": [], "kinds": {}})
        row["rewards"].append(sum(x.score for x in scores) / len(scores))
        for x, c in zip(scores, by_id[s.group_id].spec.constraints):
            row["kinds"].setdefault(c.kind, []).append(float(x.score >= 1.0))
    return {pid: {"reward": statistics.fmean(v["rewards"]),
                  "kinds": {k: statistics.fmean(p) for k, p in v["kinds"].items()}} for pid, v in per.items()}


def sample_and_score(policy, records, *, n: int, temperature: float, seed: int, max_new_tokens: int,
                     batch_size: int = 64) -> tuple[dict[str, dict], float, int]:
    """(per-prompt scores, seconds, tokens) of `n` samples per record; `policy` is (model, tokenizer, name)."""
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.sample.transformers_backend import TransformersSampler

    model, tokenizer, name = policy
    sampler = TransformersSampler(model, tokenizer, name, progress=False)
    start = time.perf_counter()
    samples = sampler.sample(records, SamplingConfig(n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                                                     seed=seed, batch_size=batch_size))
    seconds = time.perf_counter() - start
    return score_samples(samples, {r.id: r for r in records}), seconds, sum(len(s.token_ids) for s in samples)


def evaluate(label: str, policy, records, args) -> dict:
    """Greedy and sampled scores of one policy, (model, tokenizer), on the held-out records; written to
    STATE/eval/<label>.json."""
    path = STATE / "eval" / f"{label}.json"
    policy = (*policy, label)
    out = {"label": label}
    greedy, s_greedy, t_greedy = sample_and_score(policy, records, n=1, temperature=0.0, seed=args.eval_seed,
                                                  max_new_tokens=args.max_new_tokens, batch_size=args.eval_batch)
    out.update(greedy=greedy, seconds=round(s_greedy, 1), tokens=t_greedy)
    if not args.greedy_only:
        sampled, seconds, tokens = sample_and_score(policy, records, n=args.eval_n, temperature=args.temperature,
                                                    seed=args.eval_seed, max_new_tokens=args.max_new_tokens,
                                                    batch_size=args.eval_batch)
        out.update(sampled=sampled, seconds=round(out["seconds"] + seconds, 1), tokens=out["tokens"] + tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    sampled = f", sampled {mean_reward(out['sampled']):.4f}" if "sampled" in out else ""
    log(f"eval {label}: greedy {mean_reward(greedy):.4f}{sampled} ({out['seconds']} s, {out['tokens']} tokens)")
    return out


def mean_reward(per_prompt: dict[str, dict], ids=None) -> float:
    keys = [k for k in per_prompt if ids is None or k in ids]
    return statistics.fmean(per_prompt[k]["reward"] for k in keys)


# --- the pilot: pass rates per kind and temperature -------------------------------------------------


def cmd_pilot(args) -> None:
    from tokencredit.pipeline.models.loading import load_policy

    records = load_records(PROMPTS / "pilot.jsonl")[: args.pilot_prompts]
    model, tokenizer = load_policy(args.model, device=args.device)
    rows = []
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        scores, seconds, tokens = sample_and_score((model, tokenizer, args.model), records, n=args.pilot_n,
                                                   temperature=temperature, seed=7, max_new_tokens=args.max_new_tokens)
        kinds: dict[str, list[float]] = {}
        for row in scores.values():
            for kind, rate in row["kinds"].items():
                kinds.setdefault(kind, []).append(rate)
        rows.append({"temperature": temperature, "prompts": len(records), "n": args.pilot_n,
                     "mean_reward": mean_reward(scores), "seconds": round(seconds, 1), "tokens": tokens,
                     "ms_per_token": round(1000 * seconds / tokens, 2),
                     "pass_rate": {k: round(statistics.fmean(v), 3) for k, v in sorted(kinds.items())},
                     "occurrences": {k: len(v) for k, v in sorted(kinds.items())}})
        log(json.dumps(rows[-1]))
        (STATE / "pilot.json").write_text(json.dumps(rows, indent=1))


# --- training and policies ------------------------------------------------------------------------


def annotate_pool(out: Path, records_path: Path, model: str | None, args, *, prompts: int | None, n: int,
                  seed: int, locate: str = "replay", kinds: tuple[str, ...] = ("gdpo", "mrtpo"),
                  tree: tuple[int, ...] | None = None) -> float:
    """Sample `n` responses per train prompt with `model` (or a tree of `tree` branching: its leaves) and
    annotate them with the credit `kinds`; seconds taken (0 when the run is already complete: run_annotation
    resumes shard by shard)."""
    import torch

    from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
    from tokencredit.pipeline.credit.assign import CreditConfig
    from tokencredit.pipeline.config import SamplingConfig

    if complete(out):  # a finished pool is kept as it is, whatever code wrote it (its manifest says which)
        return 0.0
    config = AnnotateConfig(prompts=str(records_path), split="train", limit=prompts, model=model, shard_size=16,
                            device=args.device,
                            cpu_threads=torch.get_num_threads(),
                            sampling=SamplingConfig(n=None if tree else n, max_new_tokens=args.max_new_tokens,
                                                    temperature=args.temperature, seed=seed, batch_size=64,
                                                    tree=tree, **branch_option(tree, args)),
                            # the replay alone, as the recorded run (before --locate existed) credited
                            credit=CreditConfig(kinds=kinds, locate=locate))
    start = time.perf_counter()
    run_annotation(config, str(out), progress=True)
    return time.perf_counter() - start


def branch_option(tree, args) -> dict:
    """The tree's branch point where one was chosen on the command line (else the sampler's default)."""
    return {"branch": args.branch} if tree is not None and args.branch else {}


def complete(run: Path) -> bool:
    manifest = run / "manifest.json"
    return manifest.is_file() and json.loads(manifest.read_text()).get("complete", False)


def train_arm(method: str, data: Path, base: str | None, out: Path, seed: int, steps: int, args, *,
              lr: float | None = None, save_every: int | None = None) -> float:
    """LoRA training of one arm on a pool; checkpoints every `save_every` (default `args.eval_every`) steps;
    seconds taken."""
    from tokencredit.pipeline.train.trainer import TrainConfig, train

    objective, advantage = ("rs", None) if method == "rs" else ("pg", ADVANTAGES.get(method, method))
    start = time.perf_counter()
    train(TrainConfig(data=str(data), out=str(out), advantage=advantage, objective=objective, model=base,
                      steps=steps, batch_size=args.batch_size, lr=lr or args.lr, seed=seed, lora=True,
                      device=args.device, save_every=save_every or min(args.eval_every or steps, steps)))
    return time.perf_counter() - start


def lora_policy(base: str | None, adapter: Path, device: str = "cpu"):
    """(model, tokenizer) of `base` with the LoRA adapter in `adapter` merged in."""
    from peft import PeftModel

    from tokencredit.pipeline.models.loading import load_policy

    model, tokenizer = load_policy(base, device=device)
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().eval(), tokenizer


def save_policy(policy, out: Path) -> str:
    model, tokenizer = policy
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    return str(out)


def evaluate_policy(label: str, load, records, args) -> dict:
    """evaluate() with a loader: the policy is built only when its evaluation is not cached yet."""
    path = STATE / "eval" / f"{label}.json"
    return json.loads(path.read_text()) if path.is_file() else evaluate(label, load(), records, args)


# --- the offline arm: one pool, three credits -----------------------------------------------------


OFFLINE_METHODS = ("gdpo", "mrtpo", "rs")
ITERATED_METHODS = ("gdpo", "mrtpo")
# Issue 25's arms: GDPO's uniform credit and the Monte-Carlo credit on tree-sampled groups (one tree pool, the
# same train prompts), beside the flat pool's GDPO, MRTPO and rejection sampling.
TREE_METHODS = ("gdpo_tree", "mc")
# Methods beyond the advantage columns: MRTPO at beta 1 from the beta-0.5 pool (the token advantage is linear in
# beta, A(b) = A_gdpo + (b / 0.5) (A_mrtpo(0.5) - A_gdpo), so no new replay is needed), and MRTPO located by
# the verifier's spans where it has them (`--locate both`, its own pool: the same responses, credited anew).
ADVANTAGES = {"mrtpobeta1": "mrtpo:2,gdpo:-1", "mrtpo_both": "mrtpo", "gdpo_tree": "gdpo", "mc": "mc"}
# method -> (pool folder, locate, credit kinds, tree?); others: the flat pool credited with gdpo,mrtpo (replay)
POOLS = {"mrtpo_both": ("pool-both", "both", ("gdpo", "mrtpo"), False),
         "gdpo_tree": ("pool-tree", "replay", ("gdpo", "mc"), True),
         "mc": ("pool-tree", "replay", ("gdpo", "mc"), True)}
FLAT_POOL = ("pool", "replay", ("gdpo", "mrtpo"), False)
# The hypotheses, one change each against MRTPO (or GDPO, for the learning rate), screened on train prompts
# outside the pool (`dev`): name -> (method, learning-rate factor).
DEV_VARIANTS = {"gdpo": ("gdpo", 1.0), "mrtpo": ("mrtpo", 1.0), "mrtpobeta1": ("mrtpobeta1", 1.0),
                "gdpolr2": ("gdpo", 2.0), "mrtpolr2": ("mrtpo", 2.0), "mrtpo_both": ("mrtpo_both", 1.0)}


def method_pool(method: str, args) -> Path:
    """The annotated pool a method trains on (sampled with the same seed: the same responses)."""
    folder, locate, kinds, tree = POOLS.get(method, FLAT_POOL)
    pool = STATE / folder
    seconds = annotate_pool(pool, PROMPTS / "prompts.jsonl", args.model, args, prompts=args.train_prompts or None,
                            n=args.n, seed=args.pool_seed, locate=locate, kinds=kinds,
                            tree=args.tree if tree else None)
    if seconds:
        log(f"{folder}: {seconds:.0f} s")
    return pool


def cmd_offline(args) -> None:
    from tokencredit.pipeline.models.loading import load_policy

    prompts = PROMPTS / "prompts.jsonl"
    held_out = load_records(prompts, "test")[: args.eval_prompts or None]
    base = lambda: load_policy(args.model, device=args.device)  # noqa: E731
    evaluate_policy("start", base, held_out, args)
    every = args.eval_every or args.steps
    checkpoints = sorted({*range(every, args.steps + 1, every), args.steps})
    accepted = passing(method_pool("rs", args))
    log(f"pool: {accepted} responses pass every reward (the rejection-sampling arm's data)")
    for seed in [int(x) for x in args.seeds.split(",")]:
        for method in args.methods.split(","):
            out = STATE / "offline" / f"{method}-{seed}"
            if method == "rs" and not accepted:  # nothing accepted: rejection sampling leaves the policy as is
                for step in checkpoints:
                    evaluate_policy(f"offline-rs-{seed}-{step}", base, held_out, args)
                continue
            if not (out / "final").is_dir():
                seconds = train_arm(method, method_pool(method, args), args.model, out, seed, args.steps, args)
                log(f"train offline {method} seed {seed}: {seconds:.0f} s")
            for step in checkpoints:
                adapter = out / ("final" if step == args.steps else f"checkpoint-{step}")
                trained = lambda: lora_policy(args.model, adapter, args.device)  # noqa: E731
                evaluate_policy(f"offline-{method}-{seed}-{step}", trained, held_out, args)
            if args.midpoint:
                adapter = midpoint_checkpoint(method, seed, out, args)
                evaluate_policy(f"offline-{method}-{seed}-{args.midpoint}",
                                lambda: lora_policy(args.model, adapter, args.device), held_out, args)


def midpoint_checkpoint(method: str, seed: int, arm: Path, args) -> Path:
    """The adapter after `args.midpoint` steps of an arm trained before without that checkpoint: the arm is
    trained again (same data, seed and batch order) saving it, and its final adapter is compared with the
    stored one (`same_final.json`: the largest weight difference), so the checkpoint is that run's."""
    out = arm.with_name(f"{arm.name}-mid{args.midpoint}")
    if not (out / f"checkpoint-{args.midpoint}").is_dir():
        train_arm(method, method_pool(method, args), args.model, out, seed, args.steps, args,
                  save_every=args.midpoint)
        diff = adapter_difference(arm / "final", out / "final")
        (out / "same_final.json").write_text(json.dumps({"max_abs_difference": diff}))
        log(f"offline {method} seed {seed} trained again to save step {args.midpoint}: final adapter differs from "
            f"the stored one by at most {diff:.3g}")
    return out / f"checkpoint-{args.midpoint}"


def adapter_difference(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(str(a / "adapter_model.safetensors")), load_file(str(b / "adapter_model.safetensors"))
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def cmd_dev(args) -> None:
    """One change per hypothesis, screened on train prompts outside the pool (the held-out ones are never
    used to choose): each variant of DEV_VARIANTS trained once (seed 0) and scored on `--dev-prompts`."""
    from tokencredit.pipeline.models.loading import load_policy

    train = load_records(PROMPTS / "prompts.jsonl", "train")
    dev = train[-args.dev_prompts:]
    if len(train) - args.dev_prompts < (args.train_prompts or len(train)):
        raise SystemExit("--dev-prompts overlaps the pool's train prompts")
    evaluate_policy("devstart", lambda: load_policy(args.model, device=args.device), dev, args)
    for name in args.variants.split(","):
        method, factor = DEV_VARIANTS[name]
        out = STATE / "dev" / name
        if not (out / "final").is_dir():
            seconds = train_arm(method, method_pool(method, args), args.model, out, 0, args.steps, args,
                                lr=args.lr * factor, save_every=args.steps)
            log(f"train dev {name}: {seconds:.0f} s")
        evaluate_policy(f"dev-{name}-0-{args.steps}", lambda: lora_policy(args.model, out / "final", args.device),
                        dev, args)


def dev_rows(evals: dict[str, dict]) -> list[dict]:
    """Per screened variant: its dev reward (greedy and sampled) and its difference from MRTPO and GDPO with
    95% bootstrap intervals over the dev prompts."""
    runs = {label.split("-")[1]: prompt_rewards(r, "both") for label, r in evals.items() if label.startswith("dev-")}
    if "devstart" not in evals or not runs:
        return []
    start = prompt_rewards(evals["devstart"], "both")
    rows = []
    for name, rewards in sorted(runs.items()):
        ids = sorted(rewards)
        row = {"variant": name, "prompts": len(ids), "start": statistics.fmean(start[i] for i in ids),
               "reward": statistics.fmean(rewards.values())}
        for base in ("gdpo", "mrtpo"):
            if base in runs and base != name:
                vs = paired(rewards, runs[base], ids)
                row[f"vs_{base}"] = [round(vs["diff"], 4), round(vs["ci_low"], 4), round(vs["ci_high"], 4)]
        rows.append(row)
    return rows


def passing(pool: Path) -> int:
    from tokencredit.pipeline.dataset.query import connect

    return connect(str(pool)).sql("SELECT count(*) FROM training WHERE passed_all").fetchall()[0][0]


# --- the iterated arm: annotate -> train from the current policy, repeated ------------------------


def round_prompts(prompts: Path, round_: int, count: int) -> Path:
    """A file of the `count` train prompts of one round: round r takes the r-th slice of the train prompts
    (wrapping around), so the rounds see other prompts, the same ones for every method and seed."""
    train = [line for line in prompts.read_text().splitlines() if json.loads(line)["split"] == "train"]
    start = (round_ - 1) * count
    chosen = [train[(start + i) % len(train)] for i in range(count)]
    path = STATE / "iterated" / f"prompts-round-{round_}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(chosen) + "\n")
    return path


def cmd_iterated(args) -> None:
    """Rounds of sample -> annotate -> train from each method's current policy; the methods take turns
    within a round, so a stopped run has both methods at the same round."""
    from tokencredit.pipeline.models.loading import load_policy

    prompts = PROMPTS / "prompts.jsonl"
    held_out = load_records(prompts, "test")[: args.eval_prompts or None][:: args.round_eval_stride]
    evaluate_policy("start", lambda: load_policy(args.model, device=args.device), held_out, args)
    methods = args.iterated_methods.split(",")
    for seed in [int(x) for x in args.seeds.split(",")]:
        current = {method: latest_policy(method, seed) for method in methods}
        for round_ in range(1, args.rounds + 1):
            for method in methods:
                done, policy = current[method]
                if round_ > done:
                    policy = iterate_round(method, seed, round_, policy or args.model, prompts, args)
                    current[method] = (round_, policy)
                if round_ >= done:  # the rounds before the latest kept policy were evaluated when they ran
                    evaluate_policy(f"iterated-{method}-{seed}-{round_ * args.round_steps}",
                                    lambda: load_policy(policy, device=args.device), held_out, args)
        if args.final_eval:  # the last round's policies on every held-out prompt (mrtpo_offline's: sampled too)
            every_prompt = load_records(prompts, "test")[: args.eval_prompts or None]
            sampled_too = args.experiment == "mrtpo_offline"
            both = argparse.Namespace(**{**vars(args), "greedy_only": not sampled_too and args.greedy_only})
            for method, (_, policy) in current.items():
                evaluate_policy(f"iteratedfinal-{method}-{seed}-{args.rounds * args.round_steps}",
                                lambda: load_policy(policy, device=args.device), every_prompt, both)


def latest_policy(method: str, seed: int) -> tuple[int, str | None]:
    """(round, folder) of the newest merged policy of a (method, seed), (0, None) before the first round."""
    work = STATE / "iterated" / f"{method}-{seed}"
    rounds = [int(p.name.split("-")[1]) for p in work.glob("policy-*") if p.name.split("-")[1].isdigit()]
    return (max(rounds), str(work / f"policy-{max(rounds)}")) if rounds else (0, None)


def iterate_round(method: str, seed: int, round_: int, policy: str | None, prompts: Path, args) -> str:
    """One round from `policy`: annotate this round's train prompts, train, merge; the merged policy's folder."""
    from tokencredit.pipeline.models.loading import load_policy

    work = STATE / "iterated" / f"{method}-{seed}"
    data, ckpt = work / f"data-{round_}", work / f"ckpt-{round_}"
    kinds = ("gdpo", "mrtpo") if method.startswith("mrtpo") else ("gdpo", "mc") if method in TREE_METHODS else ("gdpo",)
    seconds = annotate_pool(data, round_prompts(prompts, round_, args.round_prompts), policy, args, prompts=None,
                            n=args.n, seed=10_000 * seed + round_, kinds=kinds,
                            tree=args.tree if method in TREE_METHODS else None)
    if method == "rs" and not passing(data):  # nothing accepted: rejection sampling leaves the policy as is
        log(f"iterated rs seed {seed} round {round_}: no response passes every reward; the policy stays")
        return save_policy(load_policy(policy, device=args.device), work / f"policy-{round_}")
    seconds += train_arm(method, data, policy, ckpt, seed, args.round_steps, args)
    merged = save_policy(lora_policy(policy, ckpt / "final", args.device), work / f"policy-{round_}")
    log(f"iterated {method} seed {seed} round {round_}: {seconds:.0f} s")
    shutil.rmtree(work / f"policy-{round_ - 1}", ignore_errors=True)  # a merged SmolLM2 is 0.5 GB: keep one
    return merged


# --- the report: paired differences, bootstrap intervals, the plot, the diagnosis ------------------


def prompt_rewards(result: dict, decoding: str) -> dict[str, float]:
    """Per held-out prompt: the greedy reward, the sampled one, or ('both') their mean (greedy alone where
    the policy was evaluated greedily only)."""
    if decoding == "both" and "sampled" not in result:
        decoding = "greedy"
    if decoding != "both":
        return {k: v["reward"] for k, v in result[decoding].items()}
    return {k: (v["reward"] + result["sampled"][k]["reward"]) / 2 for k, v in result["greedy"].items()}


def paired(a: dict[str, float], b: dict[str, float], ids: list[str], draws: int = 10_000, seed: int = 0) -> dict:
    """Mean of a - b over `ids`, its 95% bootstrap interval over prompts, and the smallest difference the
    design detects with 80% power at two-sided 5% (2.8 standard errors of the paired mean). Prompts only:
    a and b are fixed (one seed, or seed means), so the variation between trained seeds is not in it."""
    import numpy as np

    diff = np.array([a[i] - b[i] for i in ids])
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(draws, len(diff)))].mean(axis=1)
    se = diff.std(ddof=1) / np.sqrt(len(diff))
    return {"diff": float(diff.mean()), "ci_low": float(np.quantile(means, 0.025)),
            "ci_high": float(np.quantile(means, 0.975)), "mde": float(2.8 * se), "prompts": len(diff)}


# The crossed seeds x prompts bootstrap of the older rows is compare's column (`ci_low_crossed`, ...): one function.
crossed_means = analysis.crossed_means


def crossed_difference(a, b, start, draws: int = 10_000, seed: int = 0) -> dict:
    """A method against its baseline, both [S, P] (seed s of one trained with seed s's batch order as the
    other's, the same P held-out prompts), from the base policy's rewards `start` [P]: the mean difference
    with its 95% crossed interval (`crossed_means`) and the detectable difference from it (2.8 crossed
    standard errors: 80% power, two-sided 5%), each seed's difference, and the gain ratio (gain over
    `start` / the baseline's gain) with its crossed interval."""
    import numpy as np

    a, b, start = np.asarray(a, float), np.asarray(b, float), np.asarray(start, float)
    diff, gain, base_gain = crossed_means(np.stack([a - b, a - start, b - start]), draws, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = gain / base_gain
        per_seed_ratio = (a - start).mean(axis=1) / (b - start).mean(axis=1)
    low, high = np.quantile(diff, [0.025, 0.975])
    ratio_low, ratio_high = np.quantile(ratios, [0.025, 0.975])
    return {"diff": float((a - b).mean()), "ci_low_seeds": float(low), "ci_high_seeds": float(high),
            "mde_seeds": float(2.8 * diff.std()), "per_seed_diff": [float(x) for x in (a - b).mean(axis=1)],
            "gain": float((a - start).mean()), "baseline_gain": float((b - start).mean()),
            "gain_ratio": float((a - start).mean() / (b - start).mean()),
            "gain_ratio_ci_low_seeds": float(ratio_low), "gain_ratio_ci_high_seeds": float(ratio_high),
            "per_seed_gain_ratio": [float(x) for x in per_seed_ratio],
            "per_seed_gain": [float(x) for x in (a - start).mean(axis=1)],
            "per_seed_baseline_gain": [float(x) for x in (b - start).mean(axis=1)],
            # a ratio's interval means little where the baseline's gain is itself near 0: how often it is not > 0
            "baseline_gain_not_positive_share": float((base_gain <= 0).mean())}


def load_evals() -> dict[str, dict]:
    """Every scored policy by label: the run's own files (bench/.closed_loop/eval) where they are, else the
    committed per-prompt rewards (`closed_loop_per_prompt.json`: rewards only, no pass rates per kind)."""
    files = sorted((STATE / "eval").glob("*.json"))
    if files:
        return {p.stem: json.loads(p.read_text()) for p in files}
    stored = json.loads(PER_PROMPT_JSON.read_text())
    return {label: {decoding: {pid: {"reward": r} for pid, r in rewards.items()}
                    for decoding, rewards in result.items()} for label, result in stored.items()}


def curves(evals: dict[str, dict], arm: str, decoding: str) -> dict[str, dict[int, dict[int, dict]]]:
    """method -> steps -> seed -> evaluation, from labels `<arm>-<method>-<seed>-<steps>`."""
    out: dict[str, dict[int, dict[int, dict]]] = {}
    for label, result in evals.items():
        parts = label.split("-")
        if parts[0] == arm:
            out.setdefault(parts[1], {}).setdefault(int(parts[3]), {})[int(parts[2])] = result
    return out


def scored_steps(curve: dict[int, dict[int, dict]]) -> list[int]:
    """The checkpoints of a method scored for every one of its seeds."""
    seeds = max(len(results) for results in curve.values())
    return sorted(steps for steps, results in curve.items() if len(results) == seeds)


def steps_to_reach(curve: dict[int, dict[int, dict]], baseline: dict[int, dict[int, dict]], target: float,
                   decoding: str) -> tuple[int | None, str | None]:
    """(the first checkpoint whose seed-mean reward reaches `target`, None) where the method and its baseline
    were scored at the same checkpoints (more than one), else (None, why not)."""
    mine, theirs = scored_steps(curve), scored_steps(baseline)
    if mine != theirs:
        return None, f"not scored at the same checkpoints: method at steps {mine}, baseline at {theirs}"
    if len(mine) < 2:
        return None, f"scored at step {mine[0]} only: the final difference is all there is"
    for steps in mine:
        if statistics.fmean(mean_reward_of(r, decoding) for r in curve[steps].values()) >= target - 1e-12:
            return steps, None
    return None, f"not reached by step {mine[-1]}"


def mean_reward_of(result: dict, decoding: str, ids=None) -> float:
    rewards = prompt_rewards(result, decoding)
    return statistics.fmean(v for k, v in rewards.items() if ids is None or k in ids)


# What a row says when no design file was committed before held-out scoring (`--design-commit`).
UNREGISTERED_NOTE = (
    "not pre-registered: no design file was committed before held-out scoring. In the 2026-12-04 CPU run the "
    "offline gdpo, mrtpo and rs (3 seeds) and the iterated arm's first seed were scored first (commit 46041f7); "
    "MRTPO's midpoint (step 11), mrtpo_both, the dev screen and the iterated arm's second seed with its last "
    "round on every held-out prompt were added after those held-out results (commits 2e4f169, 6d29738)")

# Every method is compared with each of these present in its arm (a baseline only with those after it), and a
# variant also with the method it varies: the rows come from the methods scored, with no code per method.
BASELINES = ("gdpo", "rs")
PARENTS = {"mrtpo_both": "mrtpo", "mrtpobeta1": "mrtpo", "mc": "gdpo_tree"}


def comparisons(methods) -> list[tuple[str, str]]:
    """(method, baseline) pairs of an arm's methods, each difference once."""
    pairs = []
    for method in sorted(methods):
        for base in (*BASELINES, PARENTS.get(method)):
            later = method in BASELINES and base in BASELINES and BASELINES.index(method) < BASELINES.index(base)
            if base in methods and base != method and not later:
                pairs.append((method, base))
    return pairs


def rewards_matrix(curve_at: dict[int, dict], seeds: list[int], ids: list[str], decoding: str) -> list[list[float]]:
    rewards = [prompt_rewards(curve_at[s], decoding) for s in seeds]
    return [[r[i] for i in ids] for r in rewards]


def arm_rows(evals: dict[str, dict], arm: str, decoding: str, model: str, experiment: dict) -> list[dict]:
    """The closed_loop.json rows of one arm: per (method, baseline) of `comparisons`, the final seed-mean
    rewards and their difference, crossed (seeds and prompts) and prompts-only, on the held-out prompts the
    arm was scored on (an arm scored greedily only has greedy rows alone). `experiment`: the keys every row
    carries (sampled tokens, design commit, note)."""
    import numpy as np

    by_method = curves(evals, arm, decoding)
    greedy_only = any("sampled" not in r for c in by_method.values() for at in c.values() for r in at.values())
    if greedy_only and decoding != "greedy":
        return []
    rows = []
    for method, base in comparisons(by_method):
        final_steps = max(by_method[base])
        if final_steps not in by_method[method]:
            continue
        seeds = sorted(set(by_method[method][final_steps]) & set(by_method[base][final_steps]))
        ids = sorted(prompt_rewards(by_method[base][final_steps][seeds[0]], decoding))
        start_all = prompt_rewards(evals["start"], decoding)
        start = np.array([start_all[i] for i in ids])
        a = np.array(rewards_matrix(by_method[method][final_steps], seeds, ids, decoding))
        b = np.array(rewards_matrix(by_method[base][final_steps], seeds, ids, decoding))
        crossed = crossed_difference(a, b, start)
        prompts_only = paired(dict(zip(ids, a.mean(axis=0))), dict(zip(ids, b.mean(axis=0))), ids)
        unseen = [j for j, i in enumerate(ids) if i.startswith("unseen-")]
        unseen_crossed = crossed_difference(a[:, unseen], b[:, unseen], start[unseen]) if unseen else None
        steps, why_not = steps_to_reach(by_method[method], by_method[base], float(b.mean()), decoding)
        rows.append({
            "model": model, "arm": arm, "method": method, "baseline": base, "decoding": decoding,
            "seeds": len(seeds), "seed_ids": seeds, "steps": final_steps, "eval_prompts": len(ids),
            "start_reward": float(start.mean()), "final_reward": float(a.mean()),
            "baseline_final_reward": float(b.mean()),
            **crossed,
            "ci_low_prompts": prompts_only["ci_low"], "ci_high_prompts": prompts_only["ci_high"],
            "mde_prompts": prompts_only["mde"],
            "unseen_prompts": len(unseen),
            "unseen_final_reward": float(a[:, unseen].mean()) if unseen else None,
            "unseen_diff": unseen_crossed["diff"] if unseen else None,
            "unseen_ci_low_seeds": unseen_crossed["ci_low_seeds"] if unseen else None,
            "unseen_ci_high_seeds": unseen_crossed["ci_high_seeds"] if unseen else None,
            "steps_scored": scored_steps(by_method[method]),
            "baseline_steps_scored": scored_steps(by_method[base]),
            "steps_to_baseline_final": steps, "steps_to_baseline_final_null_reason": why_not,
            **experiment})
    return rows


def sampled_tokens(arm: str, settings: dict, method: str = "gdpo") -> dict:
    """Tokens sampled per train prompt for a method's training data: counted on its pool where the pool is
    kept (offline: `STATE/pool`, or the tree pool), else null with why."""
    pool = STATE / POOLS.get(method, FLAT_POOL)[0]
    if arm == "offline" and complete(pool):
        prompts, tokens = pool_tokens(pool)
        return {"sampled_tokens": tokens, "sampled_tokens_note": f"counted on the pool ({prompts} prompts)"}
    bound = (f"{settings['n']} responses per train prompt of at most {settings['max_new_tokens']} tokens"
             if arm == "offline" else "per round, n responses of at most max_new_tokens tokens")
    return {"sampled_tokens": None,
            "sampled_tokens_note": f"not measurable: the pools (bench/.closed_loop) were not kept and their "
                                   f"response lengths were not recorded; {bound}"}


def experiment_keys(arm: str, settings: dict) -> dict:
    """The keys every row of an arm carries: sampled tokens, the design's commit and what it means."""
    commit = settings.get("design_commit")
    note = (f"pre-registered: the design file was committed at {commit}, before any held-out scoring" if commit
            else UNREGISTERED_NOTE)
    return {**sampled_tokens(arm, settings), "design_commit": commit, "note": note}


def diagnose(pool: Path, records_path: Path) -> dict:
    """Where each credit puts a failed constraint's penalty, on a pool: per kind whose verifier says where the
    violation is (`tokencredit.verifiers.instruction_spans`), the share of the reward's negative advantage mass on the
    violating tokens (GDPO: their share of the tokens, which is also the chance that a uniformly drawn token
    lies there) and how often the reward's most penalized token under the pool's MRTPO lies there."""
    from tokencredit.pipeline.dataset.query import connect
    from tokencredit.verifiers.instruction_spans import spans_for

    by_id = {r.id: r for r in load_records(records_path)}
    rows = connect(str(pool)).sql(
        "SELECT c.response_id, r.group_id, r.response, c.constraint_index, c.position, c.char_start, c.char_end, "
        "c.reward_adv, c.advantage FROM credits c JOIN responses r USING (response_id) "
        "WHERE c.reward_adv < 0 ORDER BY c.response_id, c.constraint_index, c.position").fetchall()
    pairs: dict[tuple, list] = {}
    for row in rows:
        pairs.setdefault((row[0], row[3]), []).append(row)
    out: dict[str, dict[str, list[float]]] = {}
    for (_, index), tokens in pairs.items():
        record = by_id[tokens[0][1]]
        constraint = record.spec.constraints[index]
        spans = spans_for(constraint.kind, tokens[0][2], constraint.args)  # binary scores: a < 0 one failed
        if not spans:
            continue
        inside = [any(t[5] < ce and t[6] > cs for cs, ce in spans) for t in tokens]
        if not any(inside):
            continue
        mass = [-min(t[8], 0.0) for t in tokens]
        stats = out.setdefault(constraint.kind, {"gdpo_share": [], "mrtpo_share": [], "mrtpo_top1": []})
        stats["gdpo_share"].append(sum(inside) / len(inside))
        stats["mrtpo_share"].append(sum(m for m, i in zip(mass, inside) if i) / max(sum(mass), 1e-12))
        stats["mrtpo_top1"].append(float(inside[max(range(len(mass)), key=mass.__getitem__)]))
    return {kind: {"pairs": len(v["gdpo_share"]), **{k: round(statistics.fmean(x), 3) for k, x in v.items()}}
            for kind, v in sorted(out.items())}


def mc_landing(pool: Path, records_path: Path) -> dict:
    """Where `mc` puts a failed constraint's penalty on a tree pool: over the failed (leaf,
    constraint) pairs with negative mc mass, the share of that mass on the root segment and on the leaf's own
    segment, split by where the verifier's span starts (in the root segment, in the leaf segment, or no span);
    per split the pair count and the mean share of the tokens the root segment holds (the share a uniform
    credit would put there)."""
    from tokencredit.pipeline.dataset.query import connect
    from tokencredit.verifiers.instruction_spans import spans_for

    by_id = {r.id: r for r in load_records(records_path)}
    db = connect(str(pool))
    roots = dict(db.sql("SELECT response_id, \"end\" FROM leaf_segments WHERE depth = 0").fetchall())
    rows = db.sql(
        "SELECT c.response_id, r.group_id, r.response, c.constraint_index, c.position, c.char_start, c.mc "
        "FROM credits c JOIN responses r USING (response_id) "
        "WHERE c.mc IS NOT NULL AND r.rewards[c.constraint_index + 1] < 1 "
        "ORDER BY c.response_id, c.constraint_index, c.position").fetchall()
    pairs: dict[tuple, list] = {}
    for row in rows:
        pairs.setdefault((row[0], row[3]), []).append(row)
    out: dict[str, dict[str, list[float]]] = {}
    for (response_id, index), tokens in pairs.items():
        mass = [-min(t[6], 0.0) for t in tokens]
        if sum(mass) <= 0:
            continue
        branch = roots.get(response_id, 0)
        constraint = by_id[tokens[0][1]].spec.constraints[index]
        spans = spans_for(constraint.kind, tokens[0][2], constraint.args)
        first = next((t[4] for t in tokens if spans and any(t[5] < ce and t[5] >= cs for cs, ce in spans)), None)
        where = "no span" if first is None else "span in root" if first < branch else "span in leaf"
        stats = out.setdefault(where, {"root_share": [], "root_tokens_share": []})
        stats["root_share"].append(sum(m for t, m in zip(tokens, mass) if t[4] < branch) / sum(mass))
        stats["root_tokens_share"].append(min(branch, len(tokens)) / len(tokens))
    return {where: {"pairs": len(v["root_share"]), **{k: round(statistics.fmean(x), 3) for k, x in v.items()}}
            for where, v in sorted(out.items())}


def pool_tokens(pool: Path) -> tuple[int, float]:
    """(prompts, tokens sampled per prompt) of a pool: a flat pool's response tokens; a tree pool's node tokens,
    each shared root counted once."""
    from tokencredit.pipeline.dataset.query import connect

    db = connect(str(pool))
    prompts = db.sql("SELECT count(DISTINCT group_id) FROM responses").fetchall()[0][0]
    if db.sql("SELECT count(*) FROM nodes").fetchall()[0][0]:
        tokens = db.sql("SELECT sum(\"end\" - start) FROM (SELECT DISTINCT node_id, start, \"end\" "
                        "FROM leaf_segments)").fetchall()[0][0]
    else:
        tokens = db.sql("SELECT sum(len(token_ids)) FROM responses").fetchall()[0][0]
    return prompts, tokens / prompts


def pool_stats(pool: Path) -> dict:
    """How far MRTPO's token advantages move from GDPO's on the pool: the share of failed (response, reward)
    pairs whose replay fell under the noise floor (uniform weights), the share of response tokens whose
    advantage changes sign, and the mean |A_mrtpo - A_gdpo| over the mean |A_gdpo|."""
    from tokencredit.pipeline.dataset.query import connect

    db = connect(str(pool))
    floored = db.sql("SELECT avg(floored::INT) FROM (SELECT response_id, reward, bool_or(floored) AS floored "
                     "FROM credits WHERE reward_adv < 0 GROUP BY ALL)").fetchall()[0][0]
    moved = db.sql(
        "SELECT avg((sign(m) != sign(g))::INT), avg(abs(m - g)) / avg(abs(g)) FROM ("
        "SELECT unnest(adv_mrtpo) AS m, unnest(adv_gdpo) AS g FROM training)").fetchall()[0]
    return {"floored_failed_pairs": round(floored or 0.0, 3), "sign_changed_tokens": round(moved[0], 3),
            "relative_change": round(moved[1], 3)}


def kind_rates(results: list[dict], ids=None) -> dict[str, float]:
    """Pass rate per constraint kind over the held-out prompts (greedy and sampled), seed mean."""
    per: dict[str, list[float]] = {}
    for result in results:
        for decoding in ("greedy", "sampled"):
            for pid, row in result.get(decoding, {}).items():
                for kind, rate in row["kinds"].items():
                    per.setdefault(kind, []).append(rate)
    return {k: round(statistics.fmean(v), 3) for k, v in sorted(per.items())}


def plot(evals: dict[str, dict], path: Path, decoding: str = "both") -> None:
    """Held-out reward per arm: the base policy at step 0, each method's seed mean (seed min-max bars) at
    the steps it was scored, and lines only between consecutive scored steps of one method; nothing is
    drawn where nothing was measured (markers offset sideways a little, for legibility)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [arm for arm in ("offline", "iterated") if curves(evals, arm, decoding)]
    fig, axes = plt.subplots(1, len(arms), figsize=(5.5 * len(arms), 3.6), squeeze=False)
    for ax, arm in zip(axes[0], arms):
        by_method = curves(evals, arm, decoding)
        first = next(iter(next(iter(next(iter(by_method.values())).values())).values()))
        shown = decoding if "sampled" in first else "greedy"  # an arm scored greedily only: its start too
        ax.plot([0], [mean_reward_of(evals["start"], shown, ids=set(first["greedy"]))], "ks", label="start")
        for k, (method, curve) in enumerate(sorted(by_method.items())):
            steps = sorted(curve)
            x = [s + 0.25 * (k - (len(by_method) - 1) / 2) for s in steps]
            values = [[mean_reward_of(r, shown) for r in curve[s].values()] for s in steps]
            means = [statistics.fmean(v) for v in values]
            bars = [[m - min(v) for m, v in zip(means, values)], [max(v) - m for m, v in zip(means, values)]]
            ax.errorbar(x, means, yerr=bars, fmt="o-" if len(steps) > 1 else "o", capsize=3, lw=1,
                        label=f"{method} ({len(values[-1])} seeds)")
        ax.set_title(f"{arm} arm, {shown}, {len(first['greedy'])} held-out prompts: measured points only",
                     fontsize=10)
        ax.set_xlabel("training steps (scored checkpoints)")
        ax.set_xticks(sorted({0, *(s for c in by_method.values() for s in c)}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("held-out mean reward (seed min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report_rows(evals: dict[str, dict], settings: dict) -> list[dict]:
    """Every row of closed_loop.json: the offline arm and the iterated arm's per-round curve (every k-th
    held-out prompt), then the iterated arm's last round scored on every held-out prompt."""
    model = settings["model"]
    rows = []
    for arm, evaluation in (("offline", None), ("iterated", "per round, every k-th held-out prompt"),
                            ("iteratedfinal", "last round, every held-out prompt")):
        for decoding in ("both", "greedy", "sampled"):
            for row in arm_rows(evals, arm, decoding, model, experiment_keys(arm, settings)):
                row = {**row, **sampled_tokens(arm, settings, row["method"]),
                       "baseline_sampled_tokens": sampled_tokens(arm, settings, row["baseline"])["sampled_tokens"]}
                rows.append({**row, "arm": "iterated", "evaluation": evaluation} if evaluation else row)
    return rows


def report_inputs(args) -> tuple[dict[str, dict], dict, dict]:
    """(evaluations, settings, what the run's state gave the details file): from the run's state where it
    is, else from the committed results, whose settings, pool figures (diagnosis, pass rates per kind, the
    pool's statistics) and hypotheses are kept as they were measured."""
    evals = load_evals()
    from_state = (STATE / "eval").is_dir() and any((STATE / "eval").glob("*.json"))
    if from_state or not DETAILS_JSON.is_file():
        return evals, {**vars(args), "measured_from": "state"}, {}
    stored = json.loads(DETAILS_JSON.read_text())
    settings = {**stored["settings"], "design_commit": args.design_commit, "measured_from": "committed results"}
    return evals, settings, {k: stored[k] for k in ("diagnosis", "pool", "pass_rates", "hypotheses") if k in stored}


def cmd_report(args) -> list[dict]:
    evals, settings, kept = report_inputs(args)
    rows = report_rows(evals, settings)
    hypotheses = kept.get("hypotheses") or dev_rows(evals)  # stored ones: from unrounded rewards
    for row in hypotheses:
        log(f"dev: {json.dumps(row)}")
    for row in rows:
        log(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()
                        if k not in ("note", "sampled_tokens_note")}))
    pool = STATE / "pool"
    diagnosis = kept.get("diagnosis") or {
        method: diagnose(STATE / folder, PROMPTS / "prompts.jsonl")
        for method, folder in (("mrtpo", "pool"), ("mrtpo_both", "pool-both")) if complete(STATE / folder)}
    pool_figures = kept.get("pool") or (pool_stats(pool) if complete(pool) else {})
    if complete(STATE / "pool-tree"):
        pool_figures = {**pool_figures, "mc_landing": mc_landing(STATE / "pool-tree", PROMPTS / "prompts.jsonl")}
    rates = kept.get("pass_rates") or pass_rates(evals)
    log(f"pool: {json.dumps(pool_figures)}; diagnosis: {json.dumps(diagnosis)}")
    log(f"pass rates per kind: {json.dumps(rates)}")
    if args.quick:
        return rows
    RESULTS_JSON.write_text(json.dumps(rows, indent=1) + "\n")
    if settings["measured_from"] == "state":
        PER_PROMPT_JSON.write_text(json.dumps(
            {label: {decoding: {k: round(v["reward"], 4) for k, v in result[decoding].items()}
                     for decoding in ("greedy", "sampled") if decoding in result}
             for label, result in evals.items()}, sort_keys=True) + "\n")
    DETAILS_JSON.write_text(json.dumps(
        {"diagnosis": diagnosis, "pool": pool_figures, "pass_rates": rates, "hypotheses": hypotheses,
         "settings": settings}, indent=1) + "\n")
    plot(evals, PLOT)
    if args.experiment == "mrtpo_offline":
        write_results_md(rows, evals, diagnosis, hypotheses, settings)
    else:
        write_results_md_mc_tree(rows, evals, settings)
    return rows


# --- compare: the two older designs, re-analysed by `tokencredit compare`'s statistics ----------------


# Each older design as a compare design (bench/compare_designs/), the per-prompt rewards it stored, the file that
# held the design at its commit (mc_tree: pre-registered; mrtpo_offline: the script's docstring, not pre-registered,
# its commit not a registration) and the arms added after held-out results (exploratory). A file's earlier names
# follow it: the git history of each is where a policy's time of scoring is read (`first_scored`).
MRTPO_OFFLINE_PER_PROMPT = ("closed_loop_mrtpo_offline_per_prompt.json", "closed_loop_issue18_per_prompt.json")
OLDER_DESIGNS = {
    "mc_tree": {"toml": "mc_tree.toml", "per_prompt": ("closed_loop_per_prompt.json", *MRTPO_OFFLINE_PER_PROMPT),
                "design_file": ("0d643ae", "bench/closed_loop_design.md"), "registered": True, "exploratory": []},
    "mrtpo_offline": {"toml": "mrtpo_offline.toml", "per_prompt": MRTPO_OFFLINE_PER_PROMPT,
                      "design_file": ("46041f7", "bench/closed_loop.py"), "registered": False,
                      "exploratory": ["mrtpo_both"]},
}
DESIGN_NAMES = {"mc_tree": "the Monte-Carlo credit experiment", "mrtpo_offline": "the MRTPO experiment",
                "powered": "the powered design"}
COMPARE_JSON = ROOT / "bench" / "results" / "compare.json"
COMPARE_DETAILS_JSON = ROOT / "bench" / "results" / "compare_details.json"


def git(*args: str) -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def first_scored(files: tuple[str, ...]) -> dict[str, tuple[str, dict]]:
    """label -> (the UTC time of the first commit whose per-prompt file holds it, its rewards there): a policy's
    time of scoring as the history records it (a label whose rewards another experiment's file committed first,
    identical, takes that file's time: it is the same scoring)."""
    from datetime import datetime, timezone

    found: dict[str, tuple[str, dict]] = {}
    for name in files:
        path = f"bench/results/{name}"
        for line in git("log", "--reverse", "--format=%H %cI", "--", path).splitlines():
            commit, when = line.split()
            when = datetime.fromisoformat(when).astimezone(timezone.utc).isoformat(timespec="seconds")
            listed = git("ls-tree", "--name-only", commit, "--", path).strip()
            if not listed:  # a commit that renamed the file away from this name
                continue
            for label, result in json.loads(git("show", f"{commit}:{path}")).items():
                if label not in found or (when < found[label][0] and result == found[label][1]):
                    found[label] = (when, result)
    return found


def older_scores(experiment: dict, steps: int, history: bool = True) -> dict[str, dict]:
    """compare's scores (ARM-SEED -> arm, seed, scored_at, decodes) from the stored per-prompt rewards: the
    offline arm's final policies (labels offline-ARM-SEED-STEPS); decode 'sampled' is compare's 'sampled-1'.
    `scored_at` from the git history (`first_scored`), or None without it."""
    stored = json.loads((ROOT / "bench" / "results" / experiment["per_prompt"][0]).read_text())
    times = first_scored(experiment["per_prompt"]) if history else {}
    scores = {}
    for label, result in stored.items():
        parts = label.split("-")
        if parts[0] != "offline" or int(parts[3]) != steps:
            continue
        decodes = {("greedy" if d == "greedy" else "sampled-1"): {pid: {"reward": r, "scores": {}}
                                                                  for pid, r in rewards.items()}
                   for d, rewards in result.items()}
        scores[f"{parts[1]}-{parts[2]}"] = {"arm": parts[1], "seed": int(parts[2]),
                                            "scored_at": times[label][0] if history else None, "decodes": decodes}
    return scores


def older_registration(name: str) -> dict:
    """The registration an older design would have had: the sha256 of the file that held the design at its
    commit, and the commit only where it was committed before any scoring; the arms added later."""
    import hashlib
    from datetime import datetime, timezone

    experiment = OLDER_DESIGNS[name]
    commit, path = experiment["design_file"]
    full, when = git("show", "-s", "--format=%H %cI", commit).split()
    when = datetime.fromisoformat(when).astimezone(timezone.utc).isoformat(timespec="seconds")
    return {"design_hash": hashlib.sha256(git("show", f"{commit}:{path}").encode()).hexdigest(),
            "design_commit": full if experiment["registered"] else None,
            "design_commit_time": when if experiment["registered"] else None,
            "amendments": [{"arms": experiment["exploratory"]}]}


def older_rows(name: str, registration: dict | None = None) -> list[dict]:
    """compare's rows of one older design, re-analysed from its stored per-prompt rewards. With `registration`
    given, no git history is read (no policy has a scoring time: scored_before_commit names each)."""
    from tokencredit.pipeline.compare.design import load_design
    from tokencredit.pipeline.compare.report import rows_for

    experiment = OLDER_DESIGNS[name]
    design = load_design(ROOT / "bench" / "compare_designs" / experiment["toml"])
    history = registration is None
    registration = registration or older_registration(name)
    scores = older_scores(experiment, design.training["steps"], history)
    return rows_for(scores, registration, design.comparisons, design.primary, design.targets.get("mde"))


def cmd_compare(args) -> list[dict]:
    """bench/results/compare.json (compare's row keys, exactly) and compare_details.json (every column, the
    crossed bootstrap's among them) of the older designs and, once complete, the powered design (with its figure,
    docs/experiments/compare_powered.png), and their RESULTS.md section."""
    from tokencredit.pipeline.compare.report import KEYS, plot, verdict

    rows, details = [], []
    for name in OLDER_DESIGNS:
        for row in older_rows(name):
            details.append({"design": name, **row})
            rows.append({k: row[k] for k in KEYS})
            log(f"{name} {row['method']} - {row['baseline']}: {row['diff']:+.4f} [{row['ci_low']:+.4f}, "
                f"{row['ci_high']:+.4f}] detectable {row['mde']:.4f} (crossed bootstrap [{row['ci_low_crossed']:+.4f}, "
                f"{row['ci_high_crossed']:+.4f}], {row['mde_crossed']:.4f}); {verdict(row)}")
    powered = powered_rows()
    for row in powered:
        details.append({"design": "powered", **row})
        rows.append({k: row[k] for k in KEYS})
    if powered:  # its rewards, the docs' figure (drawn from these rows) and the plan checked against them
        store_powered_per_prompt()
        plot(powered, ROOT / "docs" / "experiments" / "compare_powered.png")
        plan_from_powered(powered)
    COMPARE_JSON.write_text(json.dumps(rows, indent=1) + "\n")
    COMPARE_DETAILS_JSON.write_text(json.dumps(details, indent=1) + "\n")
    write_results_md_compare(details)
    return rows


POWERED_RUN = ROOT / "bench" / ".closed_loop-powered"  # `tokencredit compare` of POWERED, run in .venv-vllm


POWERED_PER_PROMPT = ROOT / "bench" / "results" / "compare_powered_per_prompt.json"


def store_powered_per_prompt() -> None:
    """The powered run's registration and each policy's held-out rewards (per decode, in the order of `prompts`),
    committed so that its rows are re-analysed from them (`powered_scores`) without the run's folder."""
    policies, prompts = {}, None
    for path in sorted((POWERED_RUN / "scores").glob("*.json")):
        score = json.loads(path.read_text())
        prompts = prompts or sorted(score["decodes"]["greedy"])
        policies[score["label"]] = {"arm": score["arm"], "seed": score["seed"], "scored_at": score["scored_at"],
                                    "decodes": {d: [cells[pid]["reward"] for pid in prompts]
                                                for d, cells in score["decodes"].items()}}
    registration = json.loads((POWERED_RUN / "registration.json").read_text())
    POWERED_PER_PROMPT.write_text(json.dumps({"registration": registration, "prompts": prompts,
                                              "policies": policies}, separators=(",", ":")) + "\n")


def powered_scores() -> tuple[dict, dict[str, dict]]:
    """The powered run's registration and compare's scores (LABEL -> arm, seed, scored_at, decodes), from the
    committed per-prompt rewards."""
    stored = json.loads(POWERED_PER_PROMPT.read_text())
    scores = {label: {**policy, "decodes": {d: {pid: {"reward": r, "scores": {}} for pid, r in
                                                zip(stored["prompts"], rewards)}
                                            for d, rewards in policy["decodes"].items()}}
              for label, policy in stored["policies"].items()}
    return stored["registration"], scores


def powered_rows() -> list[dict]:
    """The powered design's difference rows as its compare folder holds them after `tokencredit compare`; none
    before it has written them, and none while a row has fewer seeds than the design (`--report-only` on the
    seeds scored so far writes such rows: they are not the registered result)."""
    from tokencredit.pipeline.compare.design import load_design

    path = POWERED_RUN / "compare.json"
    if not path.is_file():
        return []
    rows, seeds = json.loads(path.read_text())["rows"], len(load_design(POWERED).seeds)
    short = [f"{r['method']} - {r['baseline']}" for r in rows if len(r["seeds"]) < seeds]
    if short:
        log(f"powered: not added, {len(short)} rows have fewer than its {seeds} seeds ({short[0]}, ...)")
        return []
    return rows


POWERED = ROOT / "bench" / "compare_designs" / "powered.toml"
PLAN_JSON = ROOT / "bench" / "results" / "compare_plan.json"


def measured_costs() -> dict:
    """The plan's costs on this 2-core CPU from committed measurements: tokens per response and decode tokens/s
    of SmolLM2 at temperature 0.5, batch 64 (closed_loop_pilot.json), and one training of 16 steps of batch 8
    from the trainer's measured seconds per response (train.json)."""
    from tokencredit.pipeline.compare.plan import shipped_response_costs

    shipped = shipped_response_costs(ROOT / "bench" / "results")
    return {"tokens_per_response": shipped["tokens_per_response"], "tokens_per_s": 1000 / shipped["ms_per_token"],
            "train_seconds": shipped["seconds_per_trained_response"] * 8 * 16,
            "source": "closed_loop_pilot.json (SmolLM2, T 0.5, batch 64, 2-core CPU) and train.json (trainer step)"}


def engine_hours(chosen: dict, costs, arms: int) -> dict:
    """The chosen design's hours on each engine measured side by side on a quiet CPU (engine.json, full mode:
    128 responses of up to 96 tokens, 2 threads, start excluded), with the same trainings."""
    engine = json.loads((ROOT / "bench" / "results" / "engine.json").read_text())
    if engine.get("mode") != "full":
        return {}
    trainings = chosen["seeds"] * arms
    out = {}
    for name in ("sample_transformers", "sample_vllm_float32", "sample_vllm_bfloat16"):
        m = engine["measurements"].get(name)
        if m:
            seconds = chosen["tokens"] / m["tokens_per_s"] + trainings * costs.train_seconds
            out[name.removeprefix("sample_")] = {"tokens_per_s": m["tokens_per_s"], "hours": seconds / 3600,
                                                 "load_avg": m["load_avg"], "source": "engine.json"}
    return out


def cmd_plan(args) -> dict:
    """compare --plan for the powered design (bench/compare_designs/powered.toml) from the Monte-Carlo credit
    experiment's components (compare_details.json), the MRTPO experiment's measured decode term, and the costs
    measured on this CPU; bench/results/compare_plan.json."""
    import tempfile

    from tokencredit.pipeline.compare.design import load_design
    from tokencredit.pipeline.compare.plan import Costs, plan, plan_lines

    text = POWERED.read_text()
    seeds_line = next(line for line in text.splitlines() if line.startswith("seeds = "))
    with tempfile.NamedTemporaryFile("w", suffix=".toml", dir=POWERED.parent) as tmp:  # seeds are what is planned
        tmp.write(text.replace(seeds_line, "seeds = [100, 101]"))
        tmp.flush()
        design = load_design(tmp.name)
    details = json.loads(COMPARE_DETAILS_JSON.read_text())
    pilot = {(r["method"], r["baseline"]): r for r in details if r["design"] == "mc_tree"}
    decode = next(r for r in details if (r["design"], r["method"], r["baseline"]) == ("mrtpo_offline", "mrtpo", "gdpo"))
    costs = Costs(**measured_costs())
    target = float(design.targets["mde"])
    fixed = {"prompts": design.prompts["heldout_limit"], "decodes": len(design.decodes)}
    out = {"target_mde": target, "arms": len(design.arms), "costs": vars(costs), "var_decode": decode["var_decode"]}
    for key, components in (("measured_decode_term", [{**pilot[p], "var_decode": decode["var_decode"]}
                                                      for p in design.primary]),
                            ("no_decode_gain", [pilot[p] for p in design.primary])):
        cheapest = plan(components, target, len(design.arms), costs, max_prompts=4096)
        at_design = plan(components, target, len(design.arms), costs, fixed=fixed, seeds=range(2, 61))
        for line in plan_lines(cheapest)[1:3] + [f"at {fixed}:"] + plan_lines(at_design)[1:2]:
            log(f"{key}: {line}")
        out[key] = {"cheapest": cheapest["cheapest"], "at_design": at_design["cheapest"]}
    chosen = out["measured_decode_term"]["at_design"]
    out["engines"] = engine_hours(chosen, costs, out["arms"])
    for name, row in out["engines"].items():
        log(f"at the design's size on {name}: {row['hours']:.1f} h ({row['tokens_per_s']:.1f} tokens/s)")
    out.update(seeds=chosen["seeds"], prompts=chosen["prompts"], decodes=chosen["decodes"],
               tokens=chosen["tokens"], hours=chosen["hours"], worst_mde=chosen["worst_mde"],
               mde=chosen["mde"])
    PLAN_JSON.write_text(json.dumps(out, indent=1) + "\n")
    from common import upsert_result

    alt = out["no_decode_gain"]["at_design"]
    upsert_result(
        "compare --plan: the powered closed-loop design (closed_loop.py plan)",
        "`bench/compare_designs/powered.toml` (committed before any scoring) sized with compare's plan from the "
        "Monte-Carlo credit experiment's variance components (compare_details.json) and the MRTPO experiment's "
        "measured decode term; costs measured on this CPU (closed_loop_pilot.json, train.json). Its run's rows are "
        "the powered rows of the compare section; the plan checked against them, and the next design planned from "
        "them: `from_powered` in `bench/results/compare_plan.json` (closed_loop.py compare).",
        "plan", f"{out['arms']} arms; {chosen['prompts']} held-out prompts x {chosen['decodes']} decodes; target "
                f"detectable {target}; {costs.tokens_per_response:.1f} tokens per response at "
                f"{costs.tokens_per_s:.1f} tokens/s, {costs.train_seconds:.0f} s per training",
        f"{chosen['seeds']} seeds: detectable " + ", ".join(f"{k} {v:.4f}" for k, v in chosen["mde"].items())
        + f"; {chosen['tokens']:,} tokens, {chosen['hours']:.1f} h on this CPU (without the decode term: "
          f"{alt['seeds']} seeds, {alt['hours']:.1f} h)" + "".join(
              f"; on {name} at its quiet speed ({row['tokens_per_s']:.0f} tokens/s, engine.json) {row['hours']:.1f} h"
              for name, row in out["engines"].items()),
        "run: on the vLLM CPU engine (the design amended to it before any scoring), "
        + (f"{out['engines']['vllm_float32']['hours']:.1f} h at its quiet speed, " if "vllm_float32" in out["engines"]
           else "") + "longer than a session: `tokencredit compare` resumes it session after session")
    return out


def plan_from_powered(rows: list[dict]) -> dict:
    """The plan checked against its run, and the next one: for each primary difference the detectable difference
    the plan expected at the design's size and the one measured, the seed components of the pilot and of the
    run, and compare's plan from the run's own components and measured costs (the cheapest design that would reach
    the target, held-out prompts up to 4096, and the cheapest at this design's prompts and decodes), and what the
    pilot's plan would have asked with each seed component at its upper bound (plan.cautious); the
    `from_powered` key of compare_plan.json."""
    from tokencredit.pipeline.compare.plan import measured_costs as folder_costs
    from tokencredit.pipeline.compare.plan import cautious, plan

    out = json.loads(PLAN_JSON.read_text())
    details = json.loads(COMPARE_DETAILS_JSON.read_text())
    pilot = {(r["method"], r["baseline"]): r for r in details if r["design"] == "mc_tree"}
    primary = [r for r in rows if r["primary"]]
    costs = folder_costs(POWERED_RUN)
    fixed = {"prompts": rows[0]["prompts"], "decodes": len(rows[0]["decodes"])}
    checked = {f"{r['method']} - {r['baseline']}": {
        "planned_mde": out["mde"][f"{r['method']} - {r['baseline']}"], "measured_mde": r["mde"],
        "pilot_var_seed": pilot[(r["method"], r["baseline"])]["var_seed"], "var_seed": r["var_seed"], "df": r["df"]}
        for r in primary}
    bounded = cautious([{**pilot[(r["method"], r["baseline"])], "var_decode": out["var_decode"]} for r in primary])
    out["from_powered"] = {
        "costs": vars(costs), "checked": checked,
        "cautious_pilot_at_design": plan(bounded, out["target_mde"], out["arms"], costs, fixed=fixed,
                                         seeds=range(2, 61))["cheapest"],
        "cheapest": plan(primary, out["target_mde"], out["arms"], costs, max_prompts=4096)["cheapest"],
        "at_design": plan(primary, out["target_mde"], out["arms"], costs, fixed=fixed, seeds=range(2, 61))["cheapest"]}
    PLAN_JSON.write_text(json.dumps(out, indent=1) + "\n")
    for name, c in checked.items():
        log(f"powered {name}: detectable planned {c['planned_mde']:.4f}, measured {c['measured_mde']:.4f}; seed "
            f"component pilot {c['pilot_var_seed']:.2g}, run {c['var_seed']:.2g} (df {c['df']:.1f})")
    for key in ("cautious_pilot_at_design", "cheapest", "at_design"):  # hours at the powered run's costs
        o = out["from_powered"][key]
        log(f"{key}: {o['seeds']} seeds x {o['prompts']} prompts x "
            f"{o['decodes']} decodes, worst detectable {o['worst_mde']:.4f}, {o['hours']:.1f} h")
    return out["from_powered"]


def write_results_md_compare(details: list[dict]) -> None:
    from common import upsert_result

    from tokencredit.pipeline.compare.report import verdict

    def line(r: dict) -> str:
        early = f"; scored before the design's commit: {', '.join(r['scored_before_commit'])}" if (
            r["design_commit"] and r["scored_before_commit"]) else ""
        return (f"{r['design']} {r['method']} - {r['baseline']} {r['diff']:+.3f} [{r['ci_low']:+.3f}, "
                f"{r['ci_high']:+.3f}], detectable {r['mde']:.3f} (crossed bootstrap [{r['ci_low_crossed']:+.3f}, "
                f"{r['ci_high_crossed']:+.3f}], {r['mde_crossed']:.3f}); components seed {r['var_seed']:.2g} / "
                f"prompt {r['var_prompt']:.2g} / cell {r['var_cell']:.2g}; {len(r['seeds'])} seeds x {r['prompts']} "
                f"prompts x {len(r['decodes'])} decodes; {verdict(r)}"
                + (" (exploratory)" if r["exploratory"] else "") + early)

    sizes = {r["design"]: f"{DESIGN_NAMES[r['design']]}: {len(r['seeds'])} seeds x {r['prompts']} held-out prompts x "
                          f"({', '.join(r['decodes'])})" for r in details}
    upsert_result(
        "compare: the closed-loop experiments re-analysed (closed_loop.py compare)",
        "The offline arms of the MRTPO experiment and of the Monte-Carlo credit experiment (bench/compare_designs/) "
        "re-analysed from their stored per-prompt rewards with `tokencredit compare`'s statistics, and the powered "
        "design's rows once its run has scored every seed: each difference's variance components (seed, prompt, "
        "cell) and a Student-t interval from them (Satterthwaite's degrees of freedom), the detectable difference "
        "at 80% power / 5%, and the crossed bootstrap the older rows used beside it. Rows: "
        "`bench/results/compare.json` (every column: `compare_details.json`).",
        "full", "; ".join(sizes.values()),
        " | ".join(line(r) for r in details),
        "; ".join(f"{r['design']} {r['method']} - {r['baseline']}: {verdict(r)}"
                  + ("" if r.get("met") is None else f", detectability target {'met' if r['met'] else 'missed'}")
                  for r in details if r["primary"]))


def pass_rates(evals: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Pass rate per constraint kind of the start and of each arm's methods at their last step."""
    rates = {"start": kind_rates([evals["start"]])}
    for arm in ("offline", "iterated"):
        for method, curve in curves(evals, arm, "both").items():
            rates[f"{arm}-{method}"] = kind_rates(list(curve[max(curve)].values()))
    return rates


def interval(row: dict, key: str = "") -> str:
    return (f"{row[key + 'diff'] if key else row['diff']:+.3f} "
            f"[{row[key + 'ci_low_seeds']:+.3f}, {row[key + 'ci_high_seeds']:+.3f}]")


# Issue 25's targets (bench/closed_loop_design.md): mc against flat GDPO and against rejection sampling, offline.
PRIMARY = (("mc", "gdpo"), ("mc", "rs"))
DESIGN_SEEDS = {"offline": 5, "iterated": 3}  # the design's seeds per arm: a row with fewer is incomplete


def write_results_md_mc_tree(rows: list[dict], evals: dict[str, dict], settings: dict) -> None:
    """RESULTS.md's section of the Monte-Carlo credit experiment: every comparison row, then the primary targets'
    verdicts (a target missing its rows, or with fewer seeds than the design's, is 'not measured')."""
    from common import upsert_result

    shown = [r for r in rows if r["decoding"] == "greedy"]
    design_seeds = DESIGN_SEEDS

    def line(r: dict) -> str:
        tokens = f"{r['sampled_tokens']:.0f}" if r["sampled_tokens"] else "n/a"
        where = r["arm"] + (" last round" if r.get("evaluation", "").startswith("last") else
                            " per round" if r.get("evaluation") else "")
        return (f"{where}: {r['method']} - {r['baseline']} {interval(r)} (per seed "
                f"{', '.join(f'{x:+.3f}' for x in r['per_seed_diff'])}; detectable {r['mde_seeds']:.3f}; "
                f"{r['seeds']} of {design_seeds['offline' if r['arm'] == 'offline' else 'iterated']} seeds; "
                f"sampled tokens per train prompt {tokens})")

    def verdict(method: str, base: str) -> str:
        found = [r for r in shown if r["arm"] == "offline" and (r["method"], r["baseline"]) == (method, base)]
        if not found or found[0]["seeds"] < design_seeds["offline"]:
            return f"{method} - {base} above 0 with detectable <= 0.03: not measured (" + (
                f"{found[0]['seeds']} of {design_seeds['offline']} seeds)" if found else "no rows)")
        r = found[0]
        return (f"{method} - {base} {interval(r)} above 0: {verdict_of(r['ci_low_seeds'] > 0)}; detectable "
                f"{r['mde_seeds']:.3f} <= 0.03: {verdict_of(r['mde_seeds'] <= 0.03)}")

    upsert_result(
        "Closed loop, SmolLM2: Monte-Carlo credit from tree-sampled groups (closed_loop.py --experiment mc_tree)",
        "The pre-registered experiment of `bench/closed_loop_design.md` (its commit is in every row's "
        "`design_commit`). Held-out mean reward, greedy; every difference with a 95% crossed bootstrap interval "
        "(trained seeds and held-out prompts resampled together), each seed's difference and the detectable "
        f"difference (2.8 crossed standard errors). Rows: `bench/results/{RESULTS_JSON.name}`; plot: "
        f"`bench/{PLOT.name}`; per held-out prompt: `bench/results/{PER_PROMPT_JSON.name}`.",
        "full",
        f"temperature {settings['temperature']}; max_new_tokens {settings['max_new_tokens']}; pools "
        f"{settings['train_prompts'] or 256} train prompts x {settings['n']} flat, tree {settings['tree']}; LoRA r 8, "
        f"lr {settings['lr']}, batch {settings['batch_size']}, {settings['steps']} steps; held-out "
        f"{len(evals['start']['greedy']) if 'start' in evals else 0} prompts; design {settings.get('design_commit')}",
        " | ".join(line(r) for r in shown) or "no policy scored yet",
        "pre-registered: " + "; ".join(verdict(m, b) for m, b in PRIMARY),
    )


def write_results_md(rows: list[dict], evals: dict[str, dict], diagnosis: dict, hypotheses: list[dict],
                     settings: dict) -> None:
    from common import upsert_result

    def arm_rows_shown(arm: str, evaluation: str | None = None) -> list[dict]:
        mine = [r for r in rows if r["arm"] == arm and (evaluation is None or r.get("evaluation") == evaluation)]
        return [r for r in mine if r["decoding"] == "both"] or [r for r in mine if r["decoding"] == "greedy"]

    def arm_line(title: str, shown: list[dict]) -> str:
        if not shown:
            return f"{title}: not run"
        first = shown[0]
        parts = [f"{r['method']} - {r['baseline']} {interval(r)} (prompts only [{r['ci_low_prompts']:+.3f}, "
                 f"{r['ci_high_prompts']:+.3f}]; per seed {', '.join(f'{x:+.3f}' for x in r['per_seed_diff'])}; "
                 f"detectable {r['mde_seeds']:.3f}; gain {r['gain']:+.3f} / {r['baseline_gain']:+.3f} = "
                 f"{r['gain_ratio']:.2f} [{r['gain_ratio_ci_low_seeds']:.2f}, {r['gain_ratio_ci_high_seeds']:.2f}]"
                 f"; steps to {r['baseline']}'s final: "
                 f"{r['steps_to_baseline_final'] or r['steps_to_baseline_final_null_reason']})" for r in shown]
        return (f"{title} ({first['seeds']} seeds, {first['steps']} steps, {first['eval_prompts']} prompts, "
                f"{first['decoding']}; start {first['start_reward']:.3f}): " + "; ".join(parts))

    offline = arm_rows_shown("offline")
    final = arm_rows_shown("iterated", "last round, every held-out prompt")
    per_round = arm_rows_shown("iterated", "per round, every k-th held-out prompt")
    mass = " / ".join(f"{method}: " + "; ".join(
        f"{k} {v['mrtpo_share']:.2f} vs {v['gdpo_share']:.2f} (top-1 {v['mrtpo_top1']:.2f}, {v['pairs']} pairs)"
        for k, v in kinds.items()) for method, kinds in diagnosis.items())
    mrtpo_gdpo = [r for r in offline + final if (r["method"], r["baseline"]) == ("mrtpo", "gdpo")]
    above = [f"{'offline' if r in offline else 'iterated'} {interval(r)}" for r in mrtpo_gdpo]
    ratios = [f"{r['gain_ratio']:.2f} [{r['gain_ratio_ci_low_seeds']:.2f}, {r['gain_ratio_ci_high_seeds']:.2f}]"
              for r in mrtpo_gdpo]
    steps = [str(r["steps_to_baseline_final"] or r["steps_to_baseline_final_null_reason"]) for r in mrtpo_gdpo]
    design = (f"design committed at {settings['design_commit']}" if settings.get("design_commit")
              else "not pre-registered (midpoint, mrtpo_both, the dev screen and the second iterated seed were "
                   "added after held-out results)")
    upsert_result(
        "Closed loop, SmolLM2: does token credit train better? (closed_loop.py)",
        "SmolLM2-135M-Instruct with LoRA on the instruction prompts of `bench/closed_loop_prompts/` (kinds and "
        "temperature chosen on the pilot's train prompts: `bench/results/closed_loop_pilot.json`). Held-out mean "
        "reward (greedy and one sample per prompt, averaged per prompt; same seeds for every policy). Every "
        "difference with a 95% crossed bootstrap interval (trained seeds and held-out prompts resampled together), "
        "the prompts-only interval beside it, each seed's difference, and the detectable difference, 2.8 crossed "
        "standard errors; gain ratio = gain over the start / the baseline's gain. Rows: "
        f"`bench/results/{RESULTS_JSON.name}`; plot: `bench/{PLOT.name}`; pass rates per kind and the diagnosis: "
        f"`bench/results/{DETAILS_JSON.name}`; every policy's reward per held-out prompt: "
        f"`bench/results/{PER_PROMPT_JSON.name}`.",
        "full",
        f"temperature {settings['temperature']}; max_new_tokens {settings['max_new_tokens']}; pool "
        f"{settings['train_prompts'] or 256} train prompts x {settings['n']}; LoRA r 8, lr {settings['lr']}, batch "
        f"{settings['batch_size']}; held-out {len(evals['start']['greedy'])} prompts; {design}; analysed from "
        f"{settings['measured_from']}",
        f"{arm_line('offline', offline)} | {arm_line('iterated, last round', final)} | "
        f"{arm_line('iterated, per round', per_round)} | negative mass of a failed constraint on its violating "
        f"tokens, MRTPO vs GDPO: {mass} | hypotheses on {hypotheses[0]['prompts'] if hypotheses else 0} dev "
        "(train) prompts, 1 seed, vs MRTPO [95% over prompts]: " + "; ".join(
            f"{h['variant']} {h['reward']:.3f}" + (" ({:+.3f} [{:+.3f}, {:+.3f}])".format(*h["vs_mrtpo"])
                                                   if "vs_mrtpo" in h else "") for h in hypotheses),
        "seeds and prompts crossed: 95% interval of MRTPO - GDPO above 0 in one arm: "
        f"{verdict_of(any(r['ci_low_seeds'] > 0 for r in mrtpo_gdpo))} ({'; '.join(above)}); MRTPO's gain >= 1.3x "
        f"GDPO's: {verdict_of(any(r['gain_ratio_ci_low_seeds'] >= 1.3 for r in mrtpo_gdpo))} ({'; '.join(ratios)}); "
        f"GDPO's final in <= 0.7x the steps: not measured ({'; '.join(steps)}); detectable difference <= 0.03: "
        + "; ".join(f"{'offline' if r in offline else 'iterated'} {r['mde_seeds']:.3f} "
                    f"{verdict_of(r['mde_seeds'] <= 0.03)}" for r in mrtpo_gdpo),
    )


def verdict_of(shown: bool) -> str:
    return "met" if shown else "NOT met"


def cmd_quick(args) -> list[dict]:
    """Both arms on the tiny policy, a few steps, nothing kept (CI)."""
    global STATE
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tokencredit-loop-") as tmp:
        STATE = Path(tmp)
        args.model, args.quick, args.seeds, args.max_new_tokens = None, True, "0", 16
        args.train_prompts, args.n, args.eval_prompts, args.steps, args.eval_every = 4, 2, 4, 2, 1
        args.rounds, args.round_prompts, args.round_steps, args.batch_size = 2, 2, 1, 4
        args.methods, args.midpoint, args.tree = ",".join([*OFFLINE_METHODS, *ADVANTAGES]), 1, (2, 2)
        cmd_offline(args)
        args.greedy_only, args.round_eval_stride, args.final_eval = True, 2, True  # as the CPU run
        args.iterated_methods = "gdpo,mrtpo,mc,rs"
        cmd_iterated(args)
        args.dev_prompts, args.variants = 2, "gdpo,mrtpo,mrtpobeta1,mrtpo_both"
        cmd_dev(args)
        rows = cmd_report(args)
        hypotheses = dev_rows(load_evals())
    pairs = {(r["arm"], r["method"], r["baseline"]) for r in rows}
    expected = ({("offline", *pair) for pair in comparisons([*OFFLINE_METHODS, *ADVANTAGES])}
                | {("iterated", *pair) for pair in comparisons(args.iterated_methods.split(","))})
    if pairs != expected or len(hypotheses) != 4:
        raise SystemExit(f"quick run: rows for {sorted(pairs)}, expected {sorted(expected)}; "
                         f"{len(hypotheses)} dev variants, expected 4")
    print(f"quick run: {len(rows)} rows, (arm, method, baseline) {sorted(pairs)}; dev variants "
          f"{[h['variant'] for h in hypotheses]}")
    return rows


def main() -> None:
    import common  # noqa: F401 - sets the torch thread count (BENCH_THREADS) before torch runs anything

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command",
                        choices=["pilot", "offline", "iterated", "dev", "report", "quick", "compare", "plan"])
    parser.add_argument("--model", default=SMOLLM2)
    parser.add_argument("--device", default="cpu", help="torch device (cuda: the full-size run on a GPU)")
    parser.add_argument("--temperatures", default="0.5,0.7,1.0")
    parser.add_argument("--pilot-prompts", type=int, default=96)
    parser.add_argument("--pilot-n", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.5, help="sampling temperature (pool, eval)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--eval-n", type=int, default=1, help="sampled responses per held-out prompt")
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--eval-batch", type=int, default=64)
    parser.add_argument("--eval-prompts", type=int, default=0, help="held-out prompts (0: all)")
    parser.add_argument("--train-prompts", type=int, default=0, help="pool prompts (0: all train prompts)")
    parser.add_argument("--n", type=int, default=8, help="responses per train prompt")
    parser.add_argument("--pool-seed", type=int, default=2026)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=32, help="offline training steps")
    parser.add_argument("--eval-every", type=int, default=16, help="offline: evaluate every this many steps")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--round-prompts", type=int, default=32)
    parser.add_argument("--round-steps", type=int, default=8)
    parser.add_argument("--round-eval-stride", type=int, default=1,
                        help="iterated: evaluate every k-th held-out prompt (seen and unseen alike)")
    parser.add_argument("--greedy-only", action="store_true", help="evaluate greedy decoding only")
    parser.add_argument("--methods", default=",".join(OFFLINE_METHODS),
                        help=f"offline arms (also {', '.join(ADVANTAGES)})")
    parser.add_argument("--midpoint", type=int, default=0,
                        help="offline: also evaluate this step (training again to save it where it was not)")
    parser.add_argument("--final-eval", action="store_true",
                        help="iterated: score the last round's policies on every held-out prompt, greedy and sampled")
    parser.add_argument("--dev-prompts", type=int, default=64, help="dev: train prompts after the pool's, from the end")
    parser.add_argument("--design-commit", default=None,
                        help="report: the commit of the experiment's design file, committed before any held-out "
                             "scoring (none: not pre-registered)")
    parser.add_argument("--variants", default=",".join(DEV_VARIANTS), help="dev: the variants to screen")
    parser.add_argument("--iterated-methods", default=",".join(ITERATED_METHODS),
                        help=f"iterated arms (any of gdpo, mrtpo, rs, {', '.join(TREE_METHODS)})")
    parser.add_argument("--tree", type=lambda text: tuple(int(x) for x in text.split(",")), default=(4, 2),
                        help="the tree pools' branching R,L (gdpo_tree and mc)")
    parser.add_argument("--branch", default=None, help="the tree pools' branch point (default: the sampler's)")
    parser.add_argument("--experiment", choices=EXPERIMENTS, default=EXPERIMENTS[0],
                        help="whose state and result files (mrtpo_offline: the earlier MRTPO experiment)")
    args = parser.parse_args()
    args.quick = False
    use_experiment(args.experiment)
    STATE.mkdir(parents=True, exist_ok=True)
    {"pilot": cmd_pilot, "offline": cmd_offline, "iterated": cmd_iterated, "dev": cmd_dev, "report": cmd_report,
     "quick": cmd_quick, "compare": cmd_compare,
     "plan": cmd_plan}[args.command](args)


if __name__ == "__main__":
    main()
