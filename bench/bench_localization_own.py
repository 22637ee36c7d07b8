"""Localization on the model's own samples: does each credit's most penalized token lie where the value
curve falls most?

    python -m bench localization_own [--quick] [-- [--limit 64] [--pairs 200] [--k 16] [--cuts 8]]
    python -m bench localization_own -- --pool tree [--tree-run RUN] [--pairs 200] [--k 16]
    python -m bench localization_own -- --backend vllm ...   # sampled on the CPU engine

SmolLM2 samples the closed-loop train prompts once (temperature 0.5, max_new_tokens 96) and the same verified
responses are credited gdpo,mrtpo under each `--locate` (bench/own_runs.py). `tokencredit values` measures the
value curves of `--pairs` failed (response, reward) pairs of the `both` run (K continuations per cut) and their
decisive segments [start, end): the consecutive cuts between which V_k falls most (pairs whose value never falls,
flat from the first cut, have none and are left out). Per credit present in the runs
(mrtpo per locate; p2t where responses.p2t_reward is stored; mc where credits.mc is; GDPO's uniform credit, which
is chance) and per constraint kind:

- top_in_decisive: the share of pairs whose most penalized token (the most negative token advantage of reward k)
  lies in the decisive segment, ties broken uniformly at random (in expectation: a pair whose credit is uniform, as
  MRTPO's is where neither the verifier nor the replay locates, scores (end - start) / T, chance; `repair` instead
  cuts at the earliest of ties); GDPO's uniform credit scores chance on every pair;
- mass_in_decisive: the mean share of the pair's negative advantage mass that lies in the segment;
- chance: the mean of (end - start) / T, what a token drawn uniformly scores;
- ci_low, ci_high: a 95% percentile bootstrap interval of top_in_decisive over pairs;
- position_baseline: top_in_decisive when each pair takes the other pairs' top positions (relative, mapped onto
  its length): a credit with the same positions that knows nothing of the pair. The decisive segment is early
  in most pairs, so position alone beats chance; `first_token` (a rule blaming each response's first token) is
  the plainest such credit;
- starts_first_quarter, starts_at_first_token: how many of the row's pairs have their decisive segment start in
  the response's first quarter, and at its first token;
- prior_first_token, prior_linear: the position priors on the same pairs, the first-token rule (1 where the decisive
  segment starts at token 0) and a linearly decreasing weight (the chance that a token drawn with weight T - t
  lies in the segment); minus_prior_first, minus_prior_first_ci_low, minus_prior_first_ci_high: the credit's
  top_in_decisive less the first-token rule's, with a paired 95% bootstrap interval over pairs. The target is
  judged against the stronger of chance and the two priors; stronger_null, stronger_null_value and met say which
  null that is and whether the target (2x it, its interval excluding it) is met.

`mc` needs tree-sampled groups, so `--pool tree` measures it on a run of its own (`--tree-run`, e.g. a compare run's
`DIR/pools/tree`, else WORK/tree sampled with `--tree R,L`): its failed pairs are other responses,
scored beside chance and the first-token rule on the same pairs. Rows carry `pool` (`flat` or `tree`); a run
replaces its own pool's rows and keeps the other's.

`kind` is `all`, a constraint kind, or `rm_heldout`: the pairs whose prompt P2T's reward model held out (with
`--reward-model`, a folder of `tokencredit rm train`, which may have trained on the other pairs' responses).

Nothing is tuned on these pairs (every option is the product's default), so there is no dev split: every pair is
a test pair. Rows go to bench/results/localization_own.json as they are (a run smaller than the target, 200 pairs
x K 16, is labelled so in RESULTS.md), and each pair's segment and per-credit scores, of which every row is a mean,
to bench/results/localization_own_pairs.json (`pair_records`). The runs and the values folder stay in `--work`, so
a stopped run resumes; `--values DIR` scores a values folder as it stands (a stopped `tokencredit values` run: its
complete shards, a random sample of its pairs since the shards take the responses in a shuffled order).
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from common import ROOT, Harness  # noqa: F401  (also sets torch threads)
from registry import Target, benchmark
from own_runs import LOCATES, add_arguments, make_runs, make_tree_run

TARGET_PAIRS, TARGET_K = 200, 16


def decisive_pairs(values: str) -> list[dict]:
    """The failed pairs whose value falls somewhere (a curve flat at 0 from the first cut has no decisive point:
    the prompt decided the failure)."""
    from tokencredit.pipeline.values import connect_values

    con = connect_values(values)
    return [dict(zip(("response_id", "reward", "constraint_index", "start", "end", "length"), row))
            for row in con.execute("SELECT response_id, reward, constraint_index, start, \"end\", length FROM decisive "
                                   "WHERE failed AND reward <> 'mean' AND change < 0 ORDER BY ALL").fetchall()]


def token_credits(run: str) -> dict[str, dict[tuple, list[float]]]:
    """Per credit present in the run: (response, reward, constraint_index) -> its token advantages of that reward
    (p2t: the response's token rewards, one list for all its rewards)."""
    from tokencredit.pipeline.dataset.query import connect

    con = connect(run)
    columns = {c for (c,) in con.execute("SELECT column_name FROM (DESCRIBE credits)").fetchall()}
    out = {"mrtpo": {(r, w, i): adv for r, w, i, adv in con.execute(
        "SELECT response_id, reward, constraint_index, list(advantage ORDER BY position) FROM credits "
        "WHERE relevance_source IS NOT NULL AND relevance_source <> 'rollout' GROUP BY ALL").fetchall()}}
    if "mc" in columns:
        out["mc"] = {(r, w, i): adv for r, w, i, adv in con.execute(
            "SELECT response_id, reward, constraint_index, list(mc ORDER BY position) FROM credits "
            "WHERE mc IS NOT NULL GROUP BY ALL").fetchall()}
    p2t = dict(con.execute("SELECT response_id, p2t_reward FROM responses WHERE p2t_reward IS NOT NULL").fetchall())
    if p2t:
        out["p2t"] = {"*": p2t}
    return {name: credit for name, credit in out.items() if credit}


def top_and_mass(advantage: list[float], start: int, end: int) -> tuple[float, float, list[float]]:
    """(the chance that the most negative token lies in [start, end), ties broken uniformly: the share of the tied
    tokens in it, so a uniform credit scores chance; the share of the negative mass in it, spread evenly by a credit
    with no negative mass; the tied tokens' relative positions (t + 0.5) / T)."""
    lowest = min(advantage)
    tied = [t for t, a in enumerate(advantage) if a == lowest]
    top = sum(start <= t < end for t in tied) / len(tied)
    negative = [max(-a, 0.0) for a in advantage]
    total = sum(negative)
    mass = sum(negative[start:end]) / total if total > 0 else (end - start) / len(advantage)
    return top, mass, [(t + 0.5) / len(advantage) for t in tied]


def scores_of(pairs: list[dict], credit: dict | None) -> list[tuple[float, float, list[float] | None]] | None:
    """(top_in, mass_in, relative top positions) per pair for one credit (None: the uniform credit's expectation)."""
    out = []
    for p in pairs:
        if credit is None:
            share = (p["end"] - p["start"]) / p["length"]
            out.append((share, share, None))
            continue
        adv = credit["*"].get(p["response_id"]) if "*" in credit else credit.get(
            (p["response_id"], p["reward"], p["constraint_index"]))
        if adv is None:
            return None
        out.append(top_and_mass(list(adv), p["start"], p["end"]))
    return out


def position_baseline(pairs: list[dict], tops: list[list[float]]) -> float:
    """top_in_decisive when each pair takes every other pair's top positions in turn (relative positions mapped
    onto its own length): what a credit scores that puts its top where this one does on average but knows nothing
    of the pair. The decisive segment is early more often than not, so this can lie well above chance."""
    if len(pairs) < 2:
        return float("nan")
    total = 0.0
    for i, p in enumerate(pairs):
        for j, donor in enumerate(tops):
            if j != i:
                hits = sum(p["start"] <= min(p["length"] - 1, int(r * p["length"])) < p["end"] for r in donor)
                total += hits / len(donor)
    return total / (len(pairs) * (len(pairs) - 1))


def priors_of(pair: dict) -> tuple[float, float]:
    """The position priors' scores on one pair, what a credit that knows only position gets: (the first-token rule:
    1 when the decisive segment starts at token 0; the linear prior: the chance that a token drawn with weight
    T - t, linearly decreasing, lies in [start, end))."""
    start, end, length = pair["start"], pair["end"], pair["length"]
    weight = sum(length - t for t in range(start, end))
    return float(start == 0), weight / (length * (length + 1) / 2)


def prior_keys(pairs: list[dict], members: list[int], top: list[float], rounds: int, seed: int) -> dict:
    """The credit against the position priors on the same pairs: prior_first_token and prior_linear (their mean
    scores), minus_prior_first (the credit's top_in_decisive less the first-token rule's) with a paired bootstrap
    interval (the pairs resampled once for both, i.e. the per-pair differences resampled)."""
    priors = [priors_of(pairs[i]) for i in members]
    diffs = [t - first for t, (first, _) in zip(top, priors)]
    low, high = bootstrap(diffs, rounds, seed)
    return {"prior_first_token": sum(f for f, _ in priors) / len(priors),
            "prior_linear": sum(lin for _, lin in priors) / len(priors),
            "minus_prior_first": sum(diffs) / len(diffs),
            "minus_prior_first_ci_low": low, "minus_prior_first_ci_high": high}


def stronger_null(row: dict) -> tuple[str, float]:
    """The stronger of the nulls a row is judged against: uniform chance, the first-token rule, the linear prior."""
    nulls = {"chance": row["chance"], "first_token": row.get("prior_first_token"), "linear": row.get("prior_linear")}
    return max(((name, value) for name, value in nulls.items() if value is not None), key=lambda item: item[1])


def met_against_stronger_null(row: dict) -> bool:
    """The target (top token in the decisive segment at least 2x the null, its interval excluding the null), judged
    against the stronger null; against the first-token rule the interval is the paired one of the difference."""
    name, value = stronger_null(row)
    if name == "first_token":
        excluded = row.get("minus_prior_first_ci_low") is not None and row["minus_prior_first_ci_low"] > 0
    else:
        excluded = row["ci_low"] > value
    return row["top_in_decisive"] >= 2 * value and excluded


def verdict_keys(row: dict) -> dict:
    """The row's verdict as keys the docs render: the stronger null's name and value, and whether the target is met
    against it."""
    name, value = stronger_null(row)
    return {"stronger_null": name, "stronger_null_value": value, "met": met_against_stronger_null(row)}


def first_token_credit(pairs: list[dict]) -> dict:
    """A rule that blames each response's first token: the position-only credit to beat."""
    return {"*": {p["response_id"]: [-1.0] + [0.0] * (p["length"] - 1) for p in pairs}}


def bootstrap(values: list[float], rounds: int, seed: int) -> tuple[float, float]:
    """95% percentile interval of the mean over resampled pairs."""
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(values, k=len(values))) / len(values) for _ in range(rounds))
    return means[int(0.025 * rounds)], means[min(rounds - 1, int(0.975 * rounds))]


def rm_heldout(run: str, pairs: list[dict]) -> list[int] | None:
    """Indices of the pairs whose prompt P2T's reward model never trained on (`groups_heldout` of the rm train
    folder the run names), None when the run has no such reward model: a reward model trained on these
    prompts' labels has seen their responses, so its rows are also given on the pairs it held out."""
    from tokencredit.pipeline.dataset.query import connect
    from tokencredit.pipeline.dataset.writer import run_files

    folder = run_files(run).manifest["config"].get("reward_model")
    report = Path(folder) / "rm_train.json" if folder else None
    if report is None or not report.is_file():
        return None
    held = set(json.loads(report.read_text())["groups_heldout"])
    group = dict(connect(run).execute("SELECT response_id, group_id FROM responses").fetchall())
    return [i for i, p in enumerate(pairs) if group[p["response_id"]] in held]


def rows_for(model: str, pairs: list[dict], credits: dict[tuple[str, str], dict | None], k: int,
             rounds: int, seed: int, subsets: dict[str, list[int]] | None = None) -> list[dict]:
    """Rows per credit and kind: every pair ("all"), each constraint kind, and each of `subsets` (name -> pair
    indices) that is not empty."""
    kinds = {"all": list(range(len(pairs))), **{name: idx for name, idx in (subsets or {}).items() if idx}}
    for i, p in enumerate(pairs):
        kinds.setdefault(p["reward"], []).append(i)
    rows = []
    for (credit, locate), tokens in credits.items():
        scored = scores_of(pairs, tokens)
        if scored is None:
            print(f"{credit}/{locate}: some pairs have no token credit; left out", flush=True)
            continue
        for kind, members in sorted(kinds.items()):
            top = [scored[i][0] for i in members]
            low, high = bootstrap(top, rounds, seed)
            chance = sum((pairs[i]["end"] - pairs[i]["start"]) / pairs[i]["length"] for i in members) / len(members)
            row = {"model": model, "credit": credit, "locate": locate, "kind": kind, "pairs": len(members),
                   "k": k, "top_in_decisive": sum(top) / len(members),
                   "mass_in_decisive": sum(scored[i][1] for i in members) / len(members),
                   "chance": chance, "ci_low": low, "ci_high": high,
                   "starts_first_quarter": sum(4 * pairs[i]["start"] < pairs[i]["length"] for i in members),
                   "starts_at_first_token": sum(pairs[i]["start"] == 0 for i in members),
                   "position_baseline": chance if tokens is None else position_baseline(
                       [pairs[i] for i in members], [scored[i][2] for i in members]),
                   **prior_keys(pairs, members, top, rounds, seed)}
            rows.append({**row, **verdict_keys(row)})
    return rows


def pair_records(pool: str, pairs: list[dict], credits: dict[tuple[str, str], dict | None]) -> list[dict]:
    """Per pair: its decisive segment and, per credit (CREDIT/LOCATE), the share of its top tokens in the segment
    (`top_in`) and of its negative mass (`mass_in`). Every row is a mean of these over its pairs, so a key added
    later (another prior, another interval) is computed from the file instead of from a rerun."""
    scored = {f"{credit}/{locate}": scores_of(pairs, tokens) for (credit, locate), tokens in credits.items()}
    return [{"pool": pool, **pair, "credits": {name: {"top_in": s[i][0], "mass_in": s[i][1]}
                                               for name, s in scored.items() if s is not None}}
            for i, pair in enumerate(pairs)]


def measured_pairs(args, run: str, name: str) -> list[dict]:
    """The decisive pairs of `run`'s value curves: `args.values` as it stands (a stopped `tokencredit values` run:
    its complete shards), else a values run of `args.pairs` failed pairs into WORK (resumed if stopped). Sets
    args.pairs to the failed pairs there are when fewer, and args.k to the K measured."""
    from tokencredit.pipeline.values import ValuesConfig, connect_values, run_pairs, run_values

    failed = sum(score < 1 for row in run_pairs(run)[0] for score in row[8])
    if failed < args.pairs:
        print(f"{run} has {failed} failed pairs, fewer than --pairs {args.pairs}: measuring them all", flush=True)
        args.pairs = failed
    values = args.values or str(Path(args.work) / f"{name}values-k{args.k}-c{args.cuts}-p{args.pairs}")
    if not args.values:
        started = time.perf_counter()
        summary = run_values(run, values, ValuesConfig(k=args.k, cuts=args.cuts, pairs=args.pairs, seed=args.seed,
                                                       shard_size=2), progress=True, backend=args.backend)
        print(f"values: {summary['pairs']} pairs, {summary['continuations']} continuations, "
              f"{summary['continuation_tokens']} tokens, {time.perf_counter() - started:.0f} s this call", flush=True)
    measured = connect_values(values).execute("SELECT DISTINCT k FROM \"values\" WHERE k > 0").fetchall()
    args.k = min(k for (k,) in measured)
    return decisive_pairs(values)


def measure_tree(args) -> tuple[list[dict], list[dict]]:
    """Rows of the tree run (`--tree-run`, else WORK/tree sampled with `--tree`, which then becomes args.tree_run):
    `mc` beside chance and the first-token rule, on its own failed pairs (other responses than the flat runs');
    and the pairs' records (`pair_records`)."""
    args.out = args.work
    run = args.tree_run = args.tree_run or make_tree_run(args)
    mc = token_credits(run).get("mc")
    if mc is None:
        raise SystemExit(f"--tree-run {run}: the run has no mc credit (tree-sampled groups credited gdpo,mc)")
    pairs = measured_pairs(args, run, "tree-")
    credits = {("mc", "-"): mc, ("gdpo", "uniform"): None, ("first_token", "-"): first_token_credit(pairs)}
    rows = rows_for(args.model, pairs, credits, args.k, args.bootstrap, args.seed)
    return [{**row, "pool": "tree", "backend": args.backend} for row in rows], pair_records("tree", pairs, credits)


def measure(args) -> tuple[list[dict], list[dict]]:
    """Rows of the flat runs (one per --locate, the same responses): every credit they hold on their failed
    pairs; and the pairs' records (`pair_records`)."""
    args.out = args.work
    runs = make_runs(args)
    pairs = measured_pairs(args, runs["both"], "")
    credits: dict[tuple[str, str], dict | None] = {}
    for locate in LOCATES:
        for name, tokens in token_credits(runs[locate]).items():
            if name == "mrtpo" or (name, "-") not in credits:
                credits[(name, locate if name == "mrtpo" else "-")] = tokens
    credits[("gdpo", "uniform")] = None
    credits[("first_token", "-")] = first_token_credit(pairs)
    held = rm_heldout(runs["replay"], pairs) if ("p2t", "-") in credits else None
    rows = rows_for(args.model, pairs, credits, args.k, args.bootstrap, args.seed,
                    {"rm_heldout": held} if held is not None else None)
    return [{**row, "pool": "flat", "backend": args.backend} for row in rows], pair_records("flat", pairs, credits)


def report(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        if r["kind"] == "all" or (r["kind"] == "rm_heldout" and r["credit"] in ("p2t", "gdpo")):
            where = "" if r["kind"] == "all" else " on the reward model's held-out prompts"
            lines.append(f"{r['credit']}/{r['locate']}{where}: top in decisive {r['top_in_decisive']:.3f} "
                         f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}], mass {r['mass_in_decisive']:.3f}, chance "
                         f"{r['chance']:.3f}, its positions shuffled over pairs {r['position_baseline']:.3f}, "
                         f"first-token rule {r['prior_first_token']:.3f} (credit minus it "
                         f"{r['minus_prior_first']:+.3f} [{r['minus_prior_first_ci_low']:+.3f}, "
                         f"{r['minus_prior_first_ci_high']:+.3f}]), linear prior {r['prior_linear']:.3f} "
                         f"({r['pairs']} pairs, K {r['k']})")
    return lines


@benchmark("localization_own", measures="Failed (response, reward) pairs of SmolLM2's own samples of the "
           "closed-loop train prompts; the decisive segment is where the value curve (tokencredit values: K "
           "continuations per cut) falls most; per credit, the share of pairs whose top-penalized token lies in it, "
           "with a 95% bootstrap interval, against chance (GDPO's uniform credit), the first-token rule and the linear "
           "prior. `-- --pool tree`: mc credit on a tree-sampled run.", results=("localization_own.json",
           "localization_own_pairs.json"), targets=(Target("best_met", "==", True), Target("full_size", "==", True)))
def run(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench localization_own --")
    parser.add_argument("--work", default=str(ROOT / "bench" / ".own"), help="folder of the runs and values")
    add_arguments(parser)
    parser.add_argument("--pool", choices=("flat", "tree"), default="flat", help="flat: the runs per --locate "
                        "(mrtpo, p2t); tree: a tree-sampled run credited gdpo,mc (mc)")
    parser.add_argument("--tree-run", default=None, help="with --pool tree: an existing run of tree-sampled groups "
                        "with the mc credit (e.g. a compare run's DIR/pools/tree); else WORK/tree")
    parser.add_argument("--pairs", type=int, default=TARGET_PAIRS, help="failed pairs measured")
    parser.add_argument("--k", type=int, default=TARGET_K, help="continuations per cut")
    parser.add_argument("--cuts", type=int, default=8)
    parser.add_argument("--values", default=None, help="an existing values folder of the pool's run (tokencredit "
                        "values): its complete shards are measured as they stand, nothing is sampled")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap rounds")
    args = parser.parse_args(h.argv)
    pool = measure_tree if args.pool == "tree" else measure
    with tempfile.TemporaryDirectory() as tmp:
        if h.quick:  # the tiny policy on a few demo prompts
            args.model, args.prompts, args.limit, args.n, args.max_new_tokens, args.pairs, args.k, args.cuts, \
                args.tree, args.bootstrap, args.work = None, "demo", 1, 4, 16, 2, 2, 2, (2, 2), 50, tmp
        rows, records = pool(args)
    print("\n".join(report(rows)))
    for name, new in (("localization_own.json", rows), ("localization_own_pairs.json", records)):
        path = h.results(name)  # the other pool's rows stay
        kept = [r for r in json.loads(path.read_text()) if r.get("pool", "flat") != args.pool] \
            if path.exists() else []
        path.write_text(json.dumps(kept + new, indent=1) + "\n")
    h.repeats = args.bootstrap
    return (tree_figures if args.pool == "tree" else flat_figures)(rows) | {
        "pairs": rows[0]["pairs"] if rows else 0, "k": args.k, "cuts": args.cuts,
        "full_size": bool(rows) and rows[0]["pairs"] >= TARGET_PAIRS and args.k >= TARGET_K}


def flat_figures(rows: list[dict]) -> dict:
    """The best credit against the stronger null, and the first-token rule (kind `all`)."""
    candidates = [r for r in rows if r["kind"] == "all" and r["credit"] not in ("gdpo", "first_token")]
    if not candidates:
        return {}
    best = max(candidates, key=lambda r: r["top_in_decisive"])
    first = next(r for r in rows if r["kind"] == "all" and r["credit"] == "first_token")
    return {"best_credit": best["credit"], "best_locate": best["locate"], "best_top_in_decisive": best["top_in_decisive"],
            "chance": best["chance"], "stronger_null": best["stronger_null"],
            "stronger_null_value": best["stronger_null_value"], "best_met": best["met"],
            "best_position_baseline": best["position_baseline"], "first_token_top_in_decisive": first["top_in_decisive"],
            "starts_first_quarter": first["starts_first_quarter"], "starts_at_first_token": first["starts_at_first_token"]}


def tree_figures(rows: list[dict]) -> dict:
    """mc's figure on the tree-sampled pool (kind `all`), reported as it is."""
    return {f"{r['credit']}_top_in_decisive": r["top_in_decisive"] for r in rows if r["kind"] == "all"}
