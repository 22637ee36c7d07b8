"""Localization on the model's own samples (issue 19): does cutting at a credit's top penalty repair more?

    python -m bench repair [--quick] [-- [--model smollm2-135m-instruct] [--prompts FILE] [--tasks instructions]]

One prompt set is annotated once per `--locate` option (replay, verifier, both; the replay run also computes
P2T), with the same sampling seed, so every option credits the same responses. For each failed (response,
reward), the response is cut just before the token each credit penalizes most (`tokencredit.pipeline.credit.penalty.penalty_cut`;
P2T: the response's lowest token reward), and the rest resampled `n` times; against that, a cut at a token
drawn uniformly from the response (GDPO's uniform credit) and a resample of the whole response, with as many
resamples. A resample repairs when it fixes the reward without lowering another (`tokencredit.pipeline.repair.is_repair`).
Every cut of a pair draws its resamples from the same seeds (common random numbers), so two credits that cut
at the same token get the same resamples, computed once, and the comparison between cuts is paired.
The annotated runs and the resamples' outcomes stay in `--work` (default `bench/.repair/`), so a stopped run
resumes.

`--runs DIR` takes runs written by `bench/own_runs.py` (DIR/replay, DIR/verifier, DIR/both: one sample credited
per locate) instead of annotating; `--values DIR` (`tokencredit values DIR/both`, as bench_localization_own.py
writes it) adds the decisive cut (issue 26): the start of the segment where the pair's value curve falls most.
The pairs are then those the values folder measured, every cut on the same pairs with the same seeds.

Per (locate, reward family): `pairs`, `repair_rate` (repairs per resample at the credit's cut),
`random_cut_rate`, `full_resample_rate`, and the tokens each resampled, so fixes per resampled token compare;
`cut` says which cut the row's `repair_rate` is: `blamed` (a credit's top penalty: locate replay, verifier,
both, p2t), `decisive` (locate `decisive`), `random` (locate `uniform`) or `whole` (locate `whole`),
`fixes_per_token` its repairs per resampled token, and `vs_random_ci`, `vs_whole_ci` 95% bootstrap intervals
(over pairs) of its fixes per resampled token divided by the random cut's and the whole resample's.
`--quick` runs the shipped tiny policy on a few demo prompts, into a temporary results folder.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import tempfile
from pathlib import Path

from common import ROOT, Harness  # noqa: F401  (also sets torch threads)
from registry import Target, benchmark

KINDS = ("replay", "verifier", "both", "p2t")
CUT_OF = {**{kind: "blamed" for kind in KINDS}, "decisive": "decisive", "random": "random", "full": "whole"}
LOCATE_OF = {"random": "uniform", "full": "whole"}


def annotate(args, locate: str, out) -> str:
    from tokencredit.pipeline.annotate import AnnotateConfig, run_annotation
    from tokencredit.pipeline.config import CreditConfig, SamplingConfig

    kinds = ("gdpo", "mrtpo", "p2t") if locate == "replay" and with_p2t(args) else ("gdpo", "mrtpo")
    config = AnnotateConfig(prompts=args.prompts, tasks=tuple(args.tasks.split(",")), split=args.split,
                            limit=args.limit, model=args.model,
                            sampling=SamplingConfig(n=args.n, max_new_tokens=args.max_new_tokens,
                                                    temperature=args.temperature, seed=args.seed),
                            credit=CreditConfig(kinds=kinds, locate=locate))
    path = str(out / locate)
    run_annotation(config, path, progress=not args.quick)
    return path


def with_p2t(args) -> bool:
    """With --runs: whether they hold P2T (their own credit kinds). Else: P2T needs a reward model sharing the policy's tokenizer: the shipped tiny pair has one; SmolLM2 has none
    (and none may be downloaded), so its P2T row is left out."""
    if args.runs:
        from tokencredit.pipeline.dataset.writer import run_files

        return "p2t" in run_files(str(Path(args.runs) / "replay")).manifest["config"]["credit"]["kinds"]
    return args.model is None


def p2t_cuts(run: str, targets) -> list[int]:
    """The lowest P2T token reward of each target's response (P2T has one token reward for all rewards)."""
    from tokencredit.pipeline.dataset.query import connect

    lowest = dict(connect(run).execute(
        "SELECT response_id, list_position(p2t_reward, list_min(p2t_reward)) - 1 FROM responses "
        "WHERE p2t_reward IS NOT NULL").fetchall())
    return [int(lowest.get(t.response_id) or 0) for t in targets]


def measure_cuts(sampler, tokenizer, targets, cuts: dict[str, list[int]], records, sampling, n: int,
                 seed: int, cache: Path | None = None, chunk: int = 96) -> dict[str, list[dict]]:
    """Per cut kind and target: repairs and resampled tokens. Each distinct (target, cut) is resampled once,
    with the target's seeds whatever the cut (common random numbers).

    Results are appended to `cache` (JSON lines) a chunk of cuts at a time, so a stopped run resumes there."""
    from tokencredit.pipeline.repair import is_repair, resample, verify_texts

    distinct = sorted({(i, c[i]) for c in cuts.values() for i in range(len(targets))}, key=lambda d: (d[1], d))
    done = _read_cache(cache)
    todo = [d for d in distinct if _cache_key(targets, d) not in done]
    print(f"resampling {len(distinct)} distinct cuts of {len(targets)} pairs x {n} "
          f"({len(distinct) - len(todo)} already in the cache)", flush=True)
    for start in range(0, len(todo), chunk):
        part = todo[start:start + chunk]
        rows = [targets[i] for i, _ in part]
        suffixes = resample(sampler, rows, [c for _, c in part], sampling, n, seed, batch_size=32)
        texts = [[tokenizer.decode(list(t.token_ids[:c]) + s, skip_special_tokens=True) for s in row]
                 for t, (_, c), row in zip(rows, part, suffixes)]
        scores = verify_texts(rows, texts, records, (), 5.0)
        new = {_cache_key(targets, d): {"repairs": sum(s is not None and is_repair(t.rewards, s, t.k) for s in sc),
                                        "tokens": sum(map(len, row))}
               for d, t, sc, row in zip(part, rows, scores, suffixes)}
        done.update(new)
        if cache is not None:
            with cache.open("a") as f:
                f.writelines(json.dumps({"key": key, **value}) + "\n" for key, value in new.items())
        print(f"resampled {len(distinct) - len(todo) + start + len(part)}/{len(distinct)} cuts", flush=True)
    return {kind: [done[_cache_key(targets, (i, c[i]))] for i in range(len(targets))] for kind, c in cuts.items()}


def _cache_key(targets, distinct: tuple[int, int]) -> str:
    i, cut = distinct
    return f"{targets[i].key}@{cut}"


def _read_cache(cache: Path | None) -> dict[str, dict]:
    if cache is None or not cache.exists():
        return {}
    done = {}
    for line in cache.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill: resampled again
            continue
        done[row.pop("key")] = row
    return done


def family(target) -> str:
    from tokencredit.verifiers import stored_reward

    return f"{target.task}/{stored_reward(target.task, target.reward_names[target.k])[0]}"


def rows_for(model: str, kind: str, targets, located, random_cut, full, n: int) -> list[dict]:
    groups: dict[str, list[int]] = {"all": list(range(len(targets)))}
    for i, t in enumerate(targets):
        groups.setdefault(family(t), []).append(i)
    rows = []
    for name, members in sorted(groups.items()):
        def total(results, key):
            return sum(results[i][key] for i in members)
        resamples = n * len(members)
        rows.append({"model": model, "locate": LOCATE_OF.get(kind, kind), "cut": CUT_OF[kind],
                     "reward_family": name, "pairs": len(members),
                     "repair_rate": total(located, "repairs") / resamples,
                     "random_cut_rate": total(random_cut, "repairs") / resamples,
                     "full_resample_rate": total(full, "repairs") / resamples,
                     "tokens_resampled": total(located, "tokens"),
                     "random_tokens_resampled": total(random_cut, "tokens"),
                     "full_tokens_resampled": total(full, "tokens"),
                     "fixes_per_token": total(located, "repairs") / max(total(located, "tokens"), 1),
                     "vs_random_ci": ratio_interval(located, random_cut, members),
                     "vs_whole_ci": ratio_interval(located, full, members)})
    return rows


def ratio_interval(located, other, members: list[int], rounds: int = 2000, seed: int = 0) -> list[float] | None:
    """95% percentile bootstrap interval, over pairs, of the cut's fixes per resampled token divided by the
    other cut's (both cuts resample the same pairs, so a draw takes a pair's results for both)."""
    import numpy as np

    def fixes_per_token(results, draw):
        repairs = np.array([results[i]["repairs"] for i in members])[draw].sum(1)
        return repairs / np.maximum(np.array([results[i]["tokens"] for i in members])[draw].sum(1), 1)

    draw = np.random.default_rng(seed).integers(len(members), size=(rounds, len(members)))
    mine, theirs = fixes_per_token(located, draw), fixes_per_token(other, draw)
    ratios = mine[theirs > 0] / theirs[theirs > 0]
    if len(ratios) < rounds // 2:
        return None
    return [float(q) for q in np.quantile(ratios, [0.025, 0.975])]


def run_pairs(args, out) -> list[dict]:
    from tokencredit.pipeline.dataset.export import run_records
    from tokencredit.pipeline.repair import failed_targets
    from tokencredit.pipeline.sample.transformers_backend import load_sampler

    from tokencredit.pipeline.repair import decisive_targets

    if args.runs:
        runs = {locate: str(Path(args.runs) / locate) for locate in ("replay", "verifier", "both")}
        _settings_from(args, runs["replay"])
    else:
        runs = {locate: annotate(args, locate, out) for locate in ("replay", "verifier", "both")}
    records, _, _ = run_records(runs["replay"])
    by_kind = {k: failed_targets(runs[k]) for k in ("replay", "verifier", "both")}
    if args.values:
        measured = decisive_targets(by_kind["both"], args.values)
        keys = {t.key for t in measured}
        by_kind = {k: [t for t in v if t.key in keys] for k, v in by_kind.items()}
        by_kind["decisive"] = measured
    sampler, tokenizer = load_sampler(args.model)
    keys = [t.key for t in by_kind["replay"]]
    assert all([t.key for t in v] == keys for v in by_kind.values()), "the runs credit different responses"
    targets = by_kind["replay"]
    sampling = dataclasses.replace(_sampling(runs["replay"]))
    blamed = ("replay", "verifier", "both", "decisive") if args.values else ("replay", "verifier", "both")
    rng = random.Random(args.seed)
    cuts = {"random": [rng.randrange(len(t.token_ids)) for t in targets], "full": [0] * len(targets),
            **{kind: [t.cut for t in by_kind[kind]] for kind in blamed},
            **({"p2t": p2t_cuts(runs["replay"], targets)} if with_p2t(args) else {})}
    if not with_p2t(args):
        print(f"P2T left out: no reward model shares {args.model}'s tokenizer", flush=True)
    results = measure_cuts(sampler, tokenizer, targets, cuts, records, sampling, args.resamples, args.seed,
                           cache=None if args.quick else _cache_path(args, out))
    return [row for kind in (*KINDS, "decisive", "random", "full") if kind in cuts
            for row in rows_for(args.model or "tiny", kind, targets, results[kind], results["random"], results["full"],
                                args.resamples)]


def _cache_path(args, out: Path) -> Path:
    """The resample cache of these settings: another sample, seed or resample count starts a new file."""
    import hashlib

    settings = json.dumps([sample_of(args), args.model, args.resamples, args.seed], sort_keys=True)
    out.mkdir(parents=True, exist_ok=True)
    return out / f"resamples-{hashlib.sha256(settings.encode()).hexdigest()[:12]}.jsonl"


def _settings_from(args, run: str) -> None:
    """Set args' model, prompts and sampling settings to those the run was annotated with (for --runs)."""
    from tokencredit.pipeline.dataset.writer import run_files

    config = run_files(run).manifest["config"]
    args.model, args.prompts, args.split, args.limit = config.get("model"), config["prompts"], config["split"], \
        config["limit"]
    args.tasks = ",".join(config["tasks"])
    args.n, args.temperature, args.max_new_tokens = (config["sampling"][key] for key in
                                                     ("n", "temperature", "max_new_tokens"))


def _sampling(run: str):
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.dataset.writer import run_files

    settings = run_files(run).manifest["config"]["sampling"]
    return SamplingConfig(**{**settings, "stop": tuple(settings.get("stop") or ())})


def per_token(rate: float, resamples: int, tokens: int) -> float:
    return rate * resamples / tokens if tokens else 0.0


def report(table: list[dict], args) -> None:
    for r in table:
        if r["reward_family"] != "all":
            continue
        res = args.resamples * r["pairs"]
        print(f"{r['model']} {r['locate']:>8}: {r['pairs']} pairs; repair rate {r['repair_rate']:.3f} "
              f"(random cut {r['random_cut_rate']:.3f}, full {r['full_resample_rate']:.3f}); fixes per 1k resampled "
              f"tokens {1000 * per_token(r['repair_rate'], res, r['tokens_resampled']):.2f} "
              f"(random {1000 * per_token(r['random_cut_rate'], res, r['random_tokens_resampled']):.2f}, "
              f"full {1000 * per_token(r['full_resample_rate'], res, r['full_tokens_resampled']):.2f})")


@benchmark("repair", measures="Failed (response, reward) pairs of the model's own samples, cut at each credit's top "
           "penalty (MRTPO replay, verifier spans, both, P2T; with `-- --values`, the decisive cut) against a uniformly "
           "random cut and a whole-response resample, same resamples: fixes per resampled token.",
           results=("repair.json",), targets=(Target("both_pairs", ">=", 200), Target("both_over_random_per_token", ">=", 1.5),
                                              Target("both_over_whole_per_token", ">=", 1.0)))
def run(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench repair --")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="registry name or folder")
    parser.add_argument("--prompts", default="demo", help="prompt file (default: the demo set)")
    parser.add_argument("--tasks", default="instructions", help="comma list of tasks")
    parser.add_argument("--split", default=None, help="only the prompts of this split (default: all)")
    parser.add_argument("--limit", type=int, default=None, help="prompts per task (default: all)")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (pool and resamples)")
    parser.add_argument("--work", default=str(ROOT / "bench" / ".repair"), help="folder of the annotated runs")
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--resamples", type=int, default=4, help="resamples per failed pair and cut")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", default=None, help="runs of bench/own_runs.py (DIR/replay, verifier, both) in "
                        "place of annotating")
    parser.add_argument("--values", default=None, help="values folder of the both run: adds the decisive cut")
    args = parser.parse_args(h.argv)
    args.quick = h.quick
    if h.quick:  # the tiny policy on a few demo prompts
        args.model, args.prompts, args.tasks, args.limit, args.n, args.max_new_tokens, args.resamples = \
            None, "demo", "instructions,tools", 1, 4, 16, 2
    with tempfile.TemporaryDirectory() as tmp:
        table = run_pairs(args, Path(tmp) if h.quick else Path(args.work))
    report(table, args)
    out = h.results("repair.json")
    old = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps(merge_rows(old, table, sample_of(args)), indent=1) + "\n")
    h.repeats = args.resamples
    return figures_of(table, args)


def sample_of(args) -> str:
    """What the rows measured: the pairs' source, named so that measurements of other samples are kept beside."""
    if args.runs:
        return f"runs {Path(args.runs).name}" + (f", values {Path(args.values).name}" if args.values else "")
    return f"{args.prompts} {args.tasks} split {args.split or 'all'} limit {args.limit or 'all'} n {args.n} " \
           f"temperature {args.temperature}"


# The rows measured before rows named their sample: sample_of's name for the settings they ran with.
FIRST_SAMPLE = "bench/closed_loop_prompts/prompts.jsonl instructions split train limit 24 n 8 temperature 0.7"


def merge_rows(old: list[dict], new: list[dict], sample: str) -> list[dict]:
    """The file's rows of other samples (given `cut` and `fixes_per_token` where they predate them), then this one's."""
    kept = []
    for row in old:
        # an older row does not say its resamples per cut, so its fixes per token are not recomputed here
        row = {"sample": FIRST_SAMPLE, "cut": CUT_OF.get(row["locate"], "blamed"), "fixes_per_token": None, **row}
        if row["sample"] != sample:
            kept.append(row)
    return kept + [{**row, "sample": sample} for row in new]


def _interval(ci: list[float] | None) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "[no interval]"


def _relative(path: str) -> str:
    """A prompt file as the repository names it (a registry name such as "demo" as it is)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


def figures_of(table: list[dict], args) -> dict:
    """Fixes per resampled token of the `both` cut and of the decisive cut against the random cut and the whole
    resample (pooled over reward families), with their pairs."""
    figures = {}
    for name, row in (("both", next((r for r in table if r["locate"] == "both" and r["reward_family"] == "all"), None)),
                      ("decisive", next((r for r in table if r["cut"] == "decisive" and r["reward_family"] == "all"),
                                        None))):
        if row is None:
            continue
        res = args.resamples * row["pairs"]
        mine = per_token(row["repair_rate"], res, row["tokens_resampled"])
        figures |= {f"{name}_pairs": row["pairs"], f"{name}_repair_rate": row["repair_rate"],
                    f"{name}_over_random_per_token": mine / max(per_token(row["random_cut_rate"], res,
                                                                          row["random_tokens_resampled"]), 1e-12),
                    f"{name}_over_whole_per_token": mine / max(per_token(row["full_resample_rate"], res,
                                                                         row["full_tokens_resampled"]), 1e-12)}
    return figures | {"p2t_left_out": not with_p2t(args)}
