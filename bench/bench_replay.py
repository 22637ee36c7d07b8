"""Replay overhead of MRTPO on the tiny policy and the demo prompts.

    python bench/bench_replay.py [--quick] [--profile]

(a) replay time (build P_all / P_\\k, `replay_distances`, with gating from the real verifier scores)
    over the time of sampling the same responses; also with every pair replayed (no gating);
(b) `replay_distances` over one plain teacher-forced forward `model(ids, attention_mask)` of the
    same sequences in the same batch size (the ceiling; both normalized per replayed token), every
    pair replayed; target within 1.25x;
(c) `run_annotation` with credit ("gdpo", "mrtpo") over ("gdpo",), same prompts; target within 1.15x.
Timings are medians of interleaved repeats. `--profile` (or a missed target (b)) prints a cProfile
of one replay.

    python bench/bench_replay.py --model PATH [--max-new-tokens 256] [--quick]

runs (c) only, with a local policy at realistic lengths (SmolLM2-135M-Instruct: target within 1.10x),
and records `mrtpo_over_gdpo` in bench/results/speed.json.
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import shutil
import tempfile

import pyarrow.parquet as pq
import torch

from common import THREADS, interleaved_times, model_paths, update_figures, upsert_result, verdict

TARGET_FORWARD = 1.25
TARGET_ANNOTATION = 1.15
TARGET_MODEL_ANNOTATION = 1.10


def replay_items(tokenizer, verified, records, gate: bool):
    """ReplayItems of the ok responses; gate=False replays every (response, reward) pair."""
    from tokencredit.pipeline.credit.advantages import group_has_variance
    from tokencredit.pipeline.credit.assign import reward_tensors
    from tokencredit.pipeline.credit.replay import build_replay_item

    ok = [v for v in verified if v.status == "ok"]
    rewards, mask, group = reward_tensors(ok)
    ungated = group_has_variance(rewards, mask, group) if gate else mask
    return [build_replay_item(tokenizer, records[v.sample.group_id].prompt, [(r.name, r.feedback) for r in v.rewards],
                              v.sample.token_ids, ungated[i, :len(v.rewards)].tolist()) for i, v in enumerate(ok)]


def replayed_sequences(items) -> list[list[int]]:
    """Every prompt + response sequence `replay_distances` forwards (P_all once, each ungated P_\\k)."""
    seqs = []
    for it in items:
        drops = [p for p in it.drop_prompt_ids if p is not None and p != it.all_prompt_ids]
        if drops and it.response_ids:
            seqs += [p + it.response_ids for p in [it.all_prompt_ids, *drops]]
    return seqs


@torch.inference_mode()
def plain_forward(model, seqs: list[list[int]], batch_size: int) -> None:
    """model(ids, attention_mask).logits over length-sorted, right-padded batches."""
    seqs = sorted(seqs, key=len)
    for start in range(0, len(seqs), batch_size):
        batch = seqs[start:start + batch_size]
        L = max(map(len, batch))
        ids = torch.zeros(len(batch), L, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, s in enumerate(batch):
            ids[b, :len(s)], mask[b, :len(s)] = torch.tensor(s), 1
        model(input_ids=ids, attention_mask=mask).logits


def profile(fn, top: int = 18) -> str:
    prof = cProfile.Profile()
    prof.runcall(fn)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def annotation_ratio(policy_path, rm_path, limit: int, repeats: int,
                     max_new_tokens: int = 96) -> tuple[dict[str, float], dict]:
    """Median seconds of run_annotation with and without MRTPO, and the MRTPO run's manifest stats."""
    from tokencredit.pipeline.annotate import AnnotateConfig, load_models, run_annotation
    from tokencredit.pipeline.credit.assign import CreditConfig
    from tokencredit.pipeline.config import SamplingConfig

    base = AnnotateConfig(limit=limit, model=policy_path, reward_model=rm_path, cpu_threads=THREADS,
                          sampling=SamplingConfig(max_new_tokens=max_new_tokens))
    configs = {"gdpo+mrtpo": dataclasses.replace(base, credit=CreditConfig(kinds=("gdpo", "mrtpo"))),
               "gdpo": dataclasses.replace(base, credit=CreditConfig(kinds=("gdpo",)))}
    load_models(configs["gdpo"])  # cached per process: keep the one-off model load out of the timing
    manifests = {}

    def run(name: str) -> None:
        out = tempfile.mkdtemp(prefix="bench_replay_", dir="/tmp")
        try:
            manifests[name] = run_annotation(configs[name], out, progress=False)
            token_ids = pq.read_table(f"{out}/responses", columns=["token_ids"]).column("token_ids")
            manifests[name]["sampled_tokens"] = sum(len(t) for t in token_ids.to_pylist())
        finally:
            shutil.rmtree(out, ignore_errors=True)

    times = interleaved_times({name: (lambda name=name: run(name)) for name in configs}, repeats=repeats, warmup=0)
    return times, manifests["gdpo+mrtpo"]


def model_annotation_ratio(model_path: str, max_new_tokens: int, quick: bool) -> None:
    """(c) with a local policy: MRTPO + GDPO annotation over GDPO-only annotation."""
    from pathlib import Path

    limit, repeats = (1, 1) if quick else (2, 3)
    times, manifest = annotation_ratio(model_path, None, limit, repeats, max_new_tokens)
    ratio = times["gdpo+mrtpo"] / times["gdpo"]
    stats, name = manifest.get("stats", {}), Path(model_path).name
    # Where the ratio comes from: the replay forwards every replayed response again after P_all and after
    # each P_\k, as prefill, while GDPO's cost is decoding each sampled token once.
    sampled, replayed = manifest["sampled_tokens"], stats.get("tokens_replayed", 0)
    replay_s = times["gdpo+mrtpo"] - times["gdpo"]
    per_sampled = times["gdpo"] / max(sampled, 1) * 1e3
    per_replayed = replay_s / max(replayed, 1) * 1e3
    cost = (f"sampled tokens {sampled} at {per_sampled:.1f} ms each (GDPO annotation); replayed response tokens "
            f"{replayed} (over pairs) at {per_replayed:.1f} ms each; 1.10x would need "
            f"{0.1 * times['gdpo'] / max(replayed, 1) * 1e3:.1f} ms per replayed token")
    print(cost)
    print(f"{name}: annotation gdpo+mrtpo {times['gdpo+mrtpo']:.1f} s, gdpo {times['gdpo']:.1f} s: {ratio:.2f}x "
          f"(target <= {TARGET_MODEL_ANNOTATION}x: {verdict(ratio <= TARGET_MODEL_ANNOTATION)}); "
          f"{manifest['totals']['responses']} responses, replays done {stats.get('replays_done')}, "
          f"skipped {stats.get('replays_skipped')}")
    upsert_result(
        "MRTPO over GDPO annotation, local policy (bench_replay.py --model)",
        "`run_annotation` with credit (gdpo, mrtpo) over (gdpo,), same prompts and settings, a local policy at "
        "realistic lengths; medians of interleaved runs (the machine was shared with other jobs: interleaving "
        "puts their load on both sides alike).",
        "quick" if quick else "full",
        f"{name}; {3 * limit} demo prompts x 4 samples, max_new_tokens {max_new_tokens} "
        f"({manifest['totals']['credits']} credit rows); {repeats} reps, median",
        f"{ratio:.2f}x ({times['gdpo+mrtpo']:.1f} s vs {times['gdpo']:.1f} s; replays done "
        f"{stats.get('replays_done')}, skipped {stats.get('replays_skipped')}); {cost}",
        f"<= {TARGET_MODEL_ANNOTATION}x: {verdict(ratio <= TARGET_MODEL_ANNOTATION)}")
    if not quick:
        update_figures({"model": name, "mrtpo_over_gdpo": round(ratio, 3)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer prompts and repeats")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one replay")
    parser.add_argument("--model", help="local policy folder or pulled model name: run only the annotation ratio (c)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="response length limit with --model")
    args = parser.parse_args()
    if args.model:
        return model_annotation_ratio(args.model, args.max_new_tokens, args.quick)

    from tokencredit.pipeline.annotate import AnnotateConfig, load_prompt_set, verify_samples
    from tokencredit.pipeline.models.loading import load_policy
    from tokencredit.pipeline.credit.replay import ReplayStats, replay_distances
    from tokencredit.pipeline.config import SamplingConfig
    from tokencredit.pipeline.sample.transformers_backend import TransformersSampler

    policy_path, rm_path, note = model_paths()
    model, tokenizer = load_policy(policy_path)
    prompts, repeats, annotate_limit, annotate_repeats = (4, 2, 1, 1) if args.quick else (12, 3, 2, 3)
    batch_size, chunk_size = 16, 128
    sampling = SamplingConfig(n=4, max_new_tokens=96)
    records, _ = load_prompt_set(AnnotateConfig(limit=None))
    records = records[:: max(1, len(records) // prompts)][:prompts]  # spread over the tasks present
    by_id = {r.id: r for r in records}
    sampler = TransformersSampler(model, tokenizer, "bench", progress=False)
    samples = sampler.sample(records, sampling)
    verified = verify_samples(samples, by_id)
    gated_items = replay_items(tokenizer, verified, by_id, gate=True)
    all_items = replay_items(tokenizer, verified, by_id, gate=False)
    stats = {name: ReplayStats() for name in ("gated", "all")}
    replay_distances(model, gated_items, batch_size=batch_size, chunk_size=chunk_size, stats=stats["gated"])
    replay_distances(model, all_items, batch_size=batch_size, chunk_size=chunk_size, stats=stats["all"])
    tasks = sorted({r.task for r in records})
    mean_T = sum(len(s.token_ids) for s in samples) / len(samples)
    sizes = (f"{len(records)} demo prompts ({', '.join(tasks)}) x {sampling.n} samples, max_new_tokens "
             f"{sampling.max_new_tokens} (mean T {mean_T:.0f}), replay batch {batch_size}, chunk {chunk_size}; "
             f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M-param policy ({note}); "
             f"{repeats} reps, median; annotation: limit {annotate_limit} per task, {annotate_repeats} reps")
    print(f"sizes: {sizes}")
    for name, s in stats.items():
        print(f"  replay {name}: {s.replays_done} pairs replayed, {s.replays_skipped} gated, "
              f"{s.tokens_replayed} tokens replayed, {s.sequences_forwarded} sequences forwarded")

    # (a) replay (item building included, as in credit.assign_credit) over sampling
    t = interleaved_times({
        "sampling": lambda: sampler.sample(records, sampling),
        "replay_gated": lambda: replay_distances(model, replay_items(tokenizer, verified, by_id, True),
                                                 batch_size=batch_size, chunk_size=chunk_size),
        "replay_all": lambda: replay_distances(model, replay_items(tokenizer, verified, by_id, False),
                                               batch_size=batch_size, chunk_size=chunk_size),
    }, repeats=repeats)
    a_gated, a_all = t["replay_gated"] / t["sampling"], t["replay_all"] / t["sampling"]
    print(f"(a) sampling {t['sampling']:.2f} s; replay gated {t['replay_gated']:.2f} s = {a_gated:.2f}x, "
          f"every pair {t['replay_all']:.2f} s = {a_all:.2f}x of sampling")

    # (b) replay vs plain forwards of the same sequences, every pair replayed
    seqs = replayed_sequences(all_items)
    tb = interleaved_times({
        "replay": lambda: replay_distances(model, all_items, batch_size=batch_size, chunk_size=chunk_size),
        "forward": lambda: plain_forward(model, seqs, batch_size),
    }, repeats=repeats)
    tokens = stats["all"].tokens_replayed
    b_ratio = tb["replay"] / tb["forward"]
    print(f"(b) replay {tb['replay']:.2f} s ({tb['replay'] / tokens * 1e6:.1f} us per replayed token), plain "
          f"forward of the same {len(seqs)} sequences {tb['forward']:.2f} s ({tb['forward'] / tokens * 1e6:.1f} us): "
          f"{b_ratio:.2f}x (target <= {TARGET_FORWARD}x: {verdict(b_ratio <= TARGET_FORWARD)})")
    if args.profile or b_ratio > TARGET_FORWARD:
        print(profile(lambda: replay_distances(model, all_items, batch_size=batch_size, chunk_size=chunk_size)))

    # (c) the whole annotation stage with and without MRTPO
    tc, manifest = annotation_ratio(policy_path, rm_path, annotate_limit, annotate_repeats)
    c_ratio = tc["gdpo+mrtpo"] / tc["gdpo"]
    mstats = manifest.get("stats", {})
    print(f"(c) annotation gdpo+mrtpo {tc['gdpo+mrtpo']:.2f} s, gdpo {tc['gdpo']:.2f} s: {c_ratio:.2f}x "
          f"(target <= {TARGET_ANNOTATION}x: {verdict(c_ratio <= TARGET_ANNOTATION)}); "
          f"{manifest['totals']['responses']} responses, replays done {mstats.get('replays_done')}, "
          f"skipped {mstats.get('replays_skipped')}")

    upsert_result(
        "Replay overhead (bench_replay.py)",
        "(a) MRTPO replay over sampling the same responses (gated by the real scores / every pair); "
        "(b) `replay_distances` over plain `model(ids, attention_mask)` forwards of the same sequences, "
        "every pair; (c) `run_annotation` with credit (gdpo, mrtpo) over (gdpo,).",
        "quick" if args.quick else "full", sizes,
        f"(a) gated {a_gated:.2f}x ({stats['gated'].replays_done} pairs, {stats['gated'].replays_skipped} "
        f"gated), every pair {a_all:.2f}x of sampling {t['sampling']:.2f} s; (b) {b_ratio:.2f}x "
        f"({tb['replay'] / tokens * 1e6:.1f} vs {tb['forward'] / tokens * 1e6:.1f} us per replayed token); "
        f"(c) {c_ratio:.2f}x ({tc['gdpo+mrtpo']:.1f} s vs {tc['gdpo']:.1f} s; replays done "
        f"{mstats.get('replays_done')}, skipped {mstats.get('replays_skipped')})",
        f"(b) <= {TARGET_FORWARD}x: {verdict(b_ratio <= TARGET_FORWARD)}; "
        f"(c) <= {TARGET_ANNOTATION}x: {verdict(c_ratio <= TARGET_ANNOTATION)}"
        + (" but vacuous: every pair gated" if not mstats.get("replays_done") else ""),
    )


if __name__ == "__main__":
    main()
