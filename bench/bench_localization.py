"""Does the blamed reward's relevance peak on the one edited token? The localization benchmark (issue 10).

    python -m bench localization [--quick] [-- [--models tiny,smollm2-135m-instruct] [--locate replay,verifier,both]]

Cases are `bench/localization/cases.jsonl` (a task record, its reference response with exactly one edit,
the edit's character span and the reward it breaks; see that folder's README). For each model, ablation
(`drop`, `null`) and feedback style (`expected`, `expected+observed`), every case is replayed once in the
policy's frame: the relevance options all come from the same forwards (log p_t(y_t), log q_t(y_t), JS),
cached in `bench/localization/.cache/`. Per relevance option we then measure, for the blamed reward:

    top1 / top3      its largest relevance (any of its 3 largest) sits on an edited token
    chance_top1      a uniformly random token is an edited one: edited tokens / T
    edit_mass        share of its relevance on the edited tokens, against their share of the tokens
and, on SQL and tool cases (whose format passes), the format reward's share on the tags + eos.

A pair whose mean relevance is under the option's noise floor gets uniform weights and counts as a miss.
The floor is calibrated on the dev split: the 10th percentile of the mean relevance of a placebo pair (the
same prompt with and without one content-free feedback section), so a pair that moves the policy less than
9 in 10 content-free sections do is treated as noise. Options are chosen on dev (replay rows); the README
reports test.

`--locate` (the annotate option, method.md section 2) adds rows located by the verifier's spans (`verifier`:
1 on the tokens overlapping the failed reward's spans, no signal where it has none; `both`: the spans where
the reward has them, the replay elsewhere). They need no replay of their own: the replay rows come from the
cache. Every row has the key `locate`; rows stored before it existed are replay rows.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from common import ROOT, Harness  # noqa: F401  (also sets torch threads)
from registry import Target, benchmark

import torch

CASES = ROOT / "bench" / "localization"
CACHE = CASES / ".cache"
MODELS = ("tiny", "smollm2-135m-instruct")
ABLATIONS = ("drop", "null")
STYLES = ("expected", "expected+observed", "auto")
RELEVANCES = ("js", "logprob_drop", "logprob_abs", "logprob_signed")
LOCATES = ("replay", "verifier", "both")  # pipeline.config.LOCATES
TAGS = {"sql": ("<sql>", "</sql>"), "tools": ("<tool_call>", "</tool_call>")}
PLACEBO = ("note", "This check gives no details.")
FLOOR_QUANTILE = 0.10  # a pair that moves the policy less than 9 in 10 content-free sections do is noise


@dataclass(frozen=True)
class Case:
    id: str
    family: str
    kind: str
    split: str
    record: object  # TaskRecord
    response: str
    edit: tuple[int, int]
    reward: str
    reference: str  # the record's reference response, which the case edits once


def load_cases() -> list[Case]:
    from tokencredit import verifiers

    records, rejected = verifiers.load_tasks(CASES / "tasks.jsonl")
    if rejected:
        raise ValueError(f"bench/localization/tasks.jsonl: {len(rejected)} records rejected: {rejected[0].reason}")
    by_id = {r.id: r for r in records}
    rows = [json.loads(line) for line in (CASES / "cases.jsonl").read_text().splitlines() if line.strip()]
    return [Case(c["id"], c["family"], c["kind"], c["split"], by_id[c["record_id"]], c["response"],
                 tuple(c["edit_span"]), c["reward"], by_id[c["record_id"]].reference_response) for c in rows]


# --- replay (cached) --------------------------------------------------------------------------------


def _cache_file(model: str, ablation: str, style: str) -> Path:
    from tokencredit.pipeline.sample.prompts import TEMPLATE_VERSION

    return CACHE / f"{model}-{ablation}-{style.replace('+', '_')}-{TEMPLATE_VERSION}.jsonl"


def _item(tokenizer, case: Case, ablation: str, style: str, extra: tuple[str, str] | None = None):
    """(replay item, which sections point at the response) of a case, every reward replayed."""
    from tokencredit import verifiers
    from tokencredit.pipeline.credit.probe import response_ids
    from tokencredit.pipeline.sample.prompts import feedback_sections
    from tokencredit.pipeline.credit.replay import build_replay_item

    sections, points = feedback_sections(verifiers.verify(case.record, case.response), case.record.prompt, style)
    mask = [True] * len(sections)
    if extra is not None:  # the placebo: only the extra section is replayed
        sections, mask = sections + [extra], [False] * len(sections) + [True]
    item = build_replay_item(tokenizer, case.record.prompt, sections, response_ids(tokenizer, case.response), mask,
                             ablation)
    return item, points


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


def _input_hash(item) -> str:
    """What the model is asked: P_all, every P_\\k and the response ids."""
    return _digest([item.all_prompt_ids, item.drop_prompt_ids, item.response_ids])


def replay_cases(model: str, cases: list[Case], ablation: str, style: str, placebo: bool) -> dict[str, dict]:
    """case id -> replay record (scores, spans, log-probs, JS, pointing sections; the placebo pair on dev).

    A cached record is reused when the case and the exact model input are unchanged."""
    from tokencredit.pipeline.models.loading import load_policy, load_tokenizer
    from tokencredit.pipeline.credit.replay import replay
    from tokencredit.pipeline.sample.detokenize import token_spans

    tokenizer = load_tokenizer(None if model == "tiny" else model)
    path = _cache_file(model, ablation, style)
    cached = {}
    if path.exists():
        cached = {(r["key"], r["input"]): r for r in map(json.loads, path.read_text().splitlines())}
    items = {c.id: _item(tokenizer, c, ablation, style) for c in cases}
    done = {c.id: cached[(_key(c), _input_hash(items[c.id][0]))] for c in cases
            if (_key(c), _input_hash(items[c.id][0])) in cached}
    todo = [c for c in cases if c.id not in done or (placebo and c.split == "dev" and "placebo" not in done[c.id])]
    if not todo:
        return done
    policy, _ = load_policy(None if model == "tiny" else model)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        for n, case in enumerate(todo, 1):
            item, points = items[case.id]
            (replayed,) = replay(policy, [item], js=True)
            _, starts, ends = token_spans(tokenizer, item.response_ids)
            row = {"id": case.id, "key": _key(case), "input": _input_hash(item), "points": points,
                   "names": [r.name for r in verifiers_of(case)], "scores": [r.score for r in verifiers_of(case)],
                   "spans": list(zip(starts, ends)), "logprob_all": replayed.logprob_all.tolist(),
                   "logprob_drop": replayed.logprob_drop.tolist(), "js": replayed.js.tolist()}
            if placebo and case.split == "dev":
                row["placebo"] = _placebo(policy, tokenizer, case, ablation, style)
            out.write(json.dumps(row) + "\n")
            out.flush()
            done[case.id] = row
            print(f"  {model} {ablation} {style}: {n}/{len(todo)} {case.id}", flush=True)
    return done


def verifiers_of(case: Case):
    from tokencredit import verifiers

    return verifiers.verify(case.record, case.response)


def _key(case: Case) -> str:
    """Identity of a case's content: a changed prompt, response, edit or reward is replayed again."""
    return _digest([case.id, case.record.prompt, case.response, case.edit, case.reward])


def _placebo(policy, tokenizer, case: Case, ablation: str, style: str) -> dict:
    """Log-probs and JS with and without one extra, content-free feedback section: the noise level."""
    from tokencredit.pipeline.credit.replay import replay

    item, _ = _item(tokenizer, case, ablation, style, extra=PLACEBO)
    (out,) = replay(policy, [item], js=True)
    return {"logprob_all": out.logprob_all.tolist(), "logprob_drop": out.logprob_drop[-1].tolist(),
            "js": out.js[-1].tolist()}


# --- metrics ----------------------------------------------------------------------------------------


def relevance_rows(row: dict, kind: str) -> torch.Tensor:
    """[K, T] relevance of a cached replay, signs from the scores and pointing sections (as `tokencredit.pipeline.credit.probe`)."""
    from tokencredit.pipeline.credit.relevance import relevance, signs
    from tokencredit.pipeline.credit.replay import ReplayOutput

    replayed = ReplayOutput(torch.tensor(row["logprob_all"]), torch.tensor(row["logprob_drop"]), torch.tensor(row["js"]))
    advantage = torch.tensor([1.0 if s >= 1.0 else -1.0 for s in row["scores"]])
    return relevance(kind, replayed, signs(advantage, row["points"]))


def placebo_means(rows: list[dict], kind: str) -> list[float]:
    """Mean relevance of each dev case's placebo pair (both signs for the signed option)."""
    from tokencredit.pipeline.credit.relevance import relevance
    from tokencredit.pipeline.credit.replay import ReplayOutput

    means = []
    for row in rows:
        if "placebo" not in row:
            continue
        p = row["placebo"]
        out = ReplayOutput(torch.tensor(p["logprob_all"]), torch.tensor([p["logprob_drop"]]), torch.tensor([p["js"]]))
        signs = (1.0, -1.0) if kind == "logprob_signed" else (1.0,)
        means += [float(relevance(kind, out, torch.tensor([s])).mean()) for s in signs]
    return means


def calibrate_floor(rows: list[dict], kind: str) -> float:
    means = sorted(placebo_means(rows, kind))
    return means[min(len(means) - 1, int(FLOOR_QUANTILE * len(means)))] if means else 0.0


def covering(spans, start: int, end: int) -> list[int]:
    return [t for t, (s, e) in enumerate(spans) if s < end and e > start]


def tag_positions(spans, response: str, tags: tuple[str, ...]) -> list[int]:
    out = set()
    for tag in tags:
        i = response.find(tag)
        while i >= 0:
            out |= set(covering(spans, i, i + len(tag)))
            i = response.find(tag, i + 1)
    return sorted(out)


def edited_tokens(case: Case, row: dict, tokenizer) -> list[int]:
    """The edit's tokens: those overlapping its characters, and the first token at which the response
    departs from the reference (for a deletion, the token after the gap is not always the first to differ:
    `", "target` and `", "mode` share `", "`)."""
    ids = tokenizer(case.response, add_special_tokens=False)["input_ids"]
    ref = tokenizer(case.reference, add_special_tokens=False)["input_ids"]
    departure = next((t for t, (a, b) in enumerate(zip(ids, ref)) if a != b), min(len(ids), len(ref)))
    return sorted(set(covering(row["spans"], *case.edit)) | {departure})


def located(case: Case, row: dict, values: torch.Tensor, locate: str) -> tuple[torch.Tensor, list[bool]]:
    """(values [K, T] under `locate`, located [K]): a failed reward with spans gets 1 on the tokens that
    overlap them; `verifier` leaves the other rewards without signal, `both` keeps their replay values."""
    if locate == "replay":
        return values, [False] * values.shape[0]
    from tokencredit.pipeline.credit.located import span_relevance

    starts, ends = zip(*row["spans"]) if row["spans"] else ((), ())
    out = values.clone() if locate == "both" else torch.zeros_like(values)
    hits = [False] * values.shape[0]
    for k, reward in enumerate(verifiers_of(case)):
        d = span_relevance(reward.spans, starts, ends) if reward.spans and reward.score < 1 else None
        if d is not None and d.sum() > 0:
            out[k], hits[k] = d, True
    return out, hits


def case_metrics(case: Case, row: dict, kind: str, floor: float, tokenizer, locate: str = "replay") -> dict:
    from tokencredit.pipeline.credit.relevance import apply_floor

    values, floored = apply_floor(relevance_rows(row, kind), floor)
    values, hits = located(case, row, values, locate)
    floored = floored & ~torch.tensor(hits, dtype=torch.bool)  # the floor applies to replayed pairs only
    T = values.shape[1]
    edited = edited_tokens(case, row, tokenizer)
    k = row["names"].index(case.reward)
    blamed = values[k]
    signal = bool((blamed > 0).any())
    top = blamed.argsort(descending=True, stable=True)[:3].tolist() if signal else []
    out = {"top1": bool(top) and top[0] in edited, "top3": bool(set(top) & set(edited)),
           "chance_top1": len(edited) / T, "floored": bool(floored[k]),
           "edit_mass": float(blamed[edited].sum() / blamed.sum()) if signal else len(edited) / T,
           "edit_share": len(edited) / T}
    if case.family in TAGS and "format" in row["names"]:
        f = row["names"].index("format")
        frame = tag_positions(row["spans"], case.response, TAGS[case.family]) + [T - 1]  # + eos
        fmt = values[f]
        out["format_mass"] = float(fmt[frame].sum() / fmt.sum()) if bool((fmt > 0).any()) else len(frame) / T
        out["format_share"] = len(frame) / T
    return out


def summarize(per_case: list[dict]) -> dict:
    n = len(per_case)
    fmt = [m["format_mass"] for m in per_case if "format_mass" in m]
    share = [m["format_share"] for m in per_case if "format_share" in m]
    return {"cases": n, "top1": sum(m["top1"] for m in per_case) / n, "top3": sum(m["top3"] for m in per_case) / n,
            "chance_top1": statistics.mean(m["chance_top1"] for m in per_case),
            "edit_mass": statistics.mean(m["edit_mass"] for m in per_case),
            "edit_share": statistics.mean(m["edit_share"] for m in per_case),
            "floored": sum(m["floored"] for m in per_case) / n,
            "format_mass_median": statistics.median(fmt) if fmt else None,
            "format_share_median": statistics.median(share) if share else None}


def evaluate(cases: list[Case], rows: dict[str, dict], kind: str, floor: float, split: str, tokenizer,
             locate: str = "replay") -> dict:
    chosen = [c for c in cases if c.split == split]
    if not chosen:
        return {"cases": 0}
    metrics = {c.id: case_metrics(c, rows[c.id], kind, floor, tokenizer, locate) for c in chosen}
    result = summarize(list(metrics.values()))
    for attr in ("family", "kind"):
        groups = sorted({getattr(c, attr) for c in chosen})
        result[f"by_{attr}"] = {g: summarize([metrics[c.id] for c in chosen if getattr(c, attr) == g]) for g in groups}
    return result


# --- report -----------------------------------------------------------------------------------------


def run(models: list[str], quick: bool, ablations: tuple[str, ...] = ABLATIONS,
        locates: tuple[str, ...] = ("replay",)) -> list[dict]:
    cases = load_cases()
    if quick:
        cases = [c for i, c in enumerate(cases) if i % 8 == 0]
    table = []
    for model in models:
        from tokencredit.pipeline.models.loading import load_tokenizer

        tokenizer = load_tokenizer(None if model == "tiny" else model)
        for ablation in ablations:
            for style in STYLES:
                rows = replay_cases(model, cases, ablation, style, placebo=ablation == "drop")
                dev_rows = list(replay_cases(model, cases, "drop", style, placebo=True).values())
                for kind in RELEVANCES:
                    floor = calibrate_floor(dev_rows, kind)
                    for split, locate in itertools.product(("dev", "test"), locates):
                        if not any(c.split == split for c in cases):
                            continue
                        table.append({"model": "tiny" if model == "tiny" else model, "split": split,
                                      "locate": locate, "relevance": kind, "ablation": ablation, "style": style,
                                      "floor": floor, **evaluate(cases, rows, kind, floor, split, tokenizer, locate)})
    return table


@benchmark("localization", measures="Fresh cases of `bench/localization/` (one edit each), replayed in each policy's "
           "frame: the blamed reward's largest relevance on the edit (top-1, top-3) against a random token, per "
           "model, ablation, feedback style, relevance and locate; the figures are the test split's under the "
           "default credit settings.", results=("localization.json",),
           targets=(Target("smollm2_replay_top1", ">=", 0.5), Target("smollm2_replay_family_top1_min", ">=", 0.35),
                    Target("smollm2_replay_top3", ">=", 0.75), Target("smollm2_replay_format_mass_median", ">=", 0.5)))
def localization(h: Harness) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench localization --")
    parser.add_argument("--models", default="tiny" if h.quick else ",".join(MODELS))
    parser.add_argument("--ablations", default="drop" if h.quick else ",".join(ABLATIONS),
                        help="the ablations to replay (default: all)")
    parser.add_argument("--locate", default=",".join(LOCATES),
                        help="where the relevance comes from: replay, verifier, both (default: all three)")
    args = parser.parse_args(h.argv)
    locates = tuple(args.locate.split(","))
    if set(locates) - set(LOCATES):
        parser.error(f"--locate: choose from {', '.join(LOCATES)}")
    table = run(args.models.split(","), h.quick, tuple(args.ablations.split(",")), locates)
    path = h.results("localization.json")
    path.write_text(json.dumps(merged(table, path), indent=1) + "\n")
    return default_figures(table)


def merged(table: list[dict], path: Path) -> list[dict]:
    """The stored rows of the (model, ablation, locate) triples not computed this time, then this run's rows;
    a stored row without `locate` is a replay row (written before the option existed)."""
    done = {(r["model"], r["ablation"], r["locate"]) for r in table}
    kept = json.loads(path.read_text()) if path.is_file() else []
    kept = [{**r, "locate": r.get("locate", "replay")} for r in kept]
    return [r for r in kept if (r["model"], r["ablation"], r["locate"]) not in done] + table


def default_figures(table: list[dict]) -> dict:
    """Per model (smollm2 for SmolLM2) and locate, the test split under the default relevance, ablation and style:
    {MODEL_LOCATE_top1, _top3, _chance_top1, _family_top1_min, _format_mass_median}."""
    from tokencredit.pipeline.credit.assign import CreditConfig

    default = CreditConfig()
    figures = {}
    for r in table:
        if (r["split"] == "test" and r["relevance"] == default.relevance and r["ablation"] == default.ablation
                and r["style"] == default.feedback_style):
            key = f"{'smollm2' if r['model'].startswith('smollm2') else r['model']}_{r['locate']}"
            figures |= {f"{key}_top1": r["top1"], f"{key}_top3": r["top3"], f"{key}_chance_top1": r["chance_top1"],
                        f"{key}_family_top1_min": min(v["top1"] for v in r["by_family"].values()),
                        f"{key}_format_mass_median": r["format_mass_median"]}
    return figures
