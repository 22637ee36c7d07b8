"""The closed-loop experiment (bench/closed_loop.py): its prompt set, its statistics and its quick mode."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import closed_loop  # noqa: E402

from tokencredit import verifiers  # noqa: E402

_spec = importlib.util.spec_from_file_location("closed_loop_prompts",
                                               ROOT / "bench" / "closed_loop_prompts" / "build.py")
prompt_set = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prompt_set)


def test_the_prompt_set_is_the_builders_and_keeps_unseen_kinds_out_of_training():
    built = prompt_set.build("final")
    stored = [json.loads(line) for line in (ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl").open()]
    assert built == stored  # deterministic, and the committed file is what the builder writes
    records, rejected = verifiers.load_tasks(ROOT / "bench" / "closed_loop_prompts" / "prompts.jsonl")
    assert not rejected and len(records) == 512
    train = [r for r in records if r.split == "train"]
    held_out = [r for r in records if r.split == "test"]
    assert len(train) == 256 and len(held_out) == 256
    train_kinds = {c.kind for r in train for c in r.spec.constraints}
    unseen = [r for r in held_out if r.id.startswith("unseen-")]
    assert len(unseen) == 64 and train_kinds == set(prompt_set.SEEN)
    assert all({c.kind for c in r.spec.constraints} <= set(prompt_set.UNSEEN) for r in unseen)
    assert all(2 <= len(r.spec.constraints) <= 4 for r in train + held_out if not r.id.startswith("unseen-"))
    assert not {r.prompt for r in train} & {r.prompt for r in held_out}


def test_paired_difference_interval_and_detectable_effect_match_scipy():
    rng = np.random.default_rng(1)
    ids = [f"p{i}" for i in range(200)]
    a = {i: float(x) for i, x in zip(ids, rng.uniform(0, 1, 200))}
    b = {i: a[i] - float(d) for i, d in zip(ids, rng.normal(0.05, 0.2, 200))}
    out = closed_loop.paired(a, b, ids, draws=20_000)
    diff = np.array([a[i] - b[i] for i in ids])
    assert out["diff"] == pytest.approx(diff.mean())
    reference = stats.bootstrap((diff,), np.mean, method="percentile", n_resamples=20_000, random_state=0)
    assert out["ci_low"] == pytest.approx(reference.confidence_interval.low, abs=0.004)
    assert out["ci_high"] == pytest.approx(reference.confidence_interval.high, abs=0.004)
    assert out["mde"] == pytest.approx(2.8 * diff.std(ddof=1) / np.sqrt(200))
    same = closed_loop.paired(a, a, ids)
    assert same["diff"] == same["ci_low"] == same["ci_high"] == same["mde"] == 0


def _seeds_by_prompts(seed_effects, n_prompts=300, noise=0.15, rng_seed=2):
    """[S, P] paired differences: prompt effects shared by every seed, one offset per seed, cell noise."""
    rng = np.random.default_rng(rng_seed)
    prompts = rng.normal(0.02, 0.1, n_prompts)
    return np.array(seed_effects)[:, None] + prompts[None, :] + rng.normal(0, noise, (len(seed_effects), n_prompts))


def test_crossed_bootstrap_with_one_seed_is_the_prompts_only_bootstrap():
    cells = _seeds_by_prompts([0.01])
    ids = [f"p{i}" for i in range(cells.shape[1])]
    prompts_only = closed_loop.paired(dict(zip(ids, cells[0])), dict.fromkeys(ids, 0.0), ids, draws=5_000, seed=3)
    crossed = closed_loop.crossed_means(cells, draws=5_000, seed=3)
    assert np.quantile(crossed, 0.025) == pytest.approx(prompts_only["ci_low"], abs=1e-12)
    assert np.quantile(crossed, 0.975) == pytest.approx(prompts_only["ci_high"], abs=1e-12)


def test_crossed_bootstrap_is_deterministic_and_draws_seeds_and_prompts_together():
    cells = _seeds_by_prompts([0.0, 0.05, -0.03, 0.08])
    first, again = closed_loop.crossed_means(cells, 2_000, seed=7), closed_loop.crossed_means(cells, 2_000, seed=7)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, closed_loop.crossed_means(cells, 2_000, seed=8))
    # every leading array gets the same draws: the replicate of a sum is the sum of the replicates
    both = closed_loop.crossed_means(np.stack([cells, 2 * cells + 1]), 2_000, seed=7)
    assert np.allclose(both[0], first) and np.allclose(both[1], 2 * first + 1)


def test_crossed_interval_is_wider_when_seeds_disagree_and_its_variance_is_the_exact_one():
    agreeing = _seeds_by_prompts([0.02, 0.02, 0.02])
    disagreeing = _seeds_by_prompts([-0.03, 0.02, 0.07])  # the same prompts and noise, seeds apart
    width = {name: np.ptp(np.quantile(closed_loop.crossed_means(c, 20_000), [0.025, 0.975]))
             for name, c in (("agree", agreeing), ("disagree", disagreeing))}
    assert width["disagree"] > 2 * width["agree"]
    # Resampling S seeds and P prompts independently, the replicates' variance is exactly
    # mean(seed effect^2)/S + mean(prompt effect^2)/P + mean(interaction^2)/(S P) (two-way decomposition)
    for cells in (agreeing, disagreeing):
        n_seeds, n_prompts = cells.shape
        seed_effect = cells.mean(axis=1) - cells.mean()
        prompt_effect = cells.mean(axis=0) - cells.mean()
        interaction = cells - cells.mean() - seed_effect[:, None] - prompt_effect[None, :]
        exact = ((seed_effect ** 2).mean() / n_seeds + (prompt_effect ** 2).mean() / n_prompts
                 + (interaction ** 2).mean() / (n_seeds * n_prompts))
        assert closed_loop.crossed_means(cells, 40_000, seed=1).var() == pytest.approx(exact, rel=0.05)


def test_crossed_difference_per_seed_and_gain_ratio():
    start = np.full(300, 0.4)
    baseline = 0.45 + _seeds_by_prompts([0.0, 0.01, -0.01], rng_seed=4)
    method = baseline + _seeds_by_prompts([0.02, 0.0, 0.04], rng_seed=5)
    out = closed_loop.crossed_difference(method, baseline, start, draws=4_000)
    assert out["per_seed_diff"] == pytest.approx(list((method - baseline).mean(axis=1)))
    assert out["diff"] == pytest.approx(np.mean(out["per_seed_diff"]))
    assert out["ci_low_seeds"] < out["diff"] < out["ci_high_seeds"]
    assert out["gain_ratio"] == pytest.approx((method - start).mean() / (baseline - start).mean())
    assert out["gain_ratio_ci_low_seeds"] < out["gain_ratio"] < out["gain_ratio_ci_high_seeds"]
    replicates = closed_loop.crossed_means(method - baseline, 4_000)
    assert out["mde_seeds"] == pytest.approx(2.8 * replicates.std())


def test_every_method_is_compared_with_gdpo_rs_and_the_method_it_varies_once():
    assert closed_loop.comparisons(["gdpo", "mrtpo", "rs", "mrtpo_both"]) == [
        ("mrtpo", "gdpo"), ("mrtpo", "rs"), ("mrtpo_both", "gdpo"), ("mrtpo_both", "rs"),
        ("mrtpo_both", "mrtpo"), ("rs", "gdpo")]
    assert set(closed_loop.comparisons(["gdpo", "gdpo_tree", "mc", "rs"])) == {
        ("gdpo_tree", "gdpo"), ("gdpo_tree", "rs"), ("mc", "gdpo"), ("mc", "rs"), ("mc", "gdpo_tree"), ("rs", "gdpo")}
    assert closed_loop.comparisons(["gdpo", "mrtpo"]) == [("mrtpo", "gdpo")]


def _evals(scored: dict[str, list[int]], seeds=(0, 1, 2), n_prompts=40, arm="offline"):
    """Evaluations as closed_loop.py stores them: a start and, per method, seeds x scored steps."""
    rng = np.random.default_rng(0)
    ids = [f"p{i}" for i in range(n_prompts - 8)] + [f"unseen-{i}" for i in range(8)]

    def result(level):
        return {d: {i: {"reward": float(np.clip(level + rng.normal(0, 0.1), 0, 1))} for i in ids}
                for d in ("greedy", "sampled")}

    evals = {"start": result(0.4)}
    for k, (method, steps) in enumerate(scored.items()):
        for seed in seeds:
            for step in steps:
                evals[f"{arm}-{method}-{seed}-{step}"] = result(0.4 + 0.01 * k + 0.002 * step)
    return evals


def test_rows_say_steps_to_the_baselines_final_only_where_both_were_scored_at_the_same_checkpoints():
    settings = {"n": 8, "max_new_tokens": 96, "design_commit": None}
    keys = closed_loop.experiment_keys("offline", settings)
    rows = closed_loop.arm_rows(_evals({"gdpo": [16], "mrtpo": [8, 16], "rs": [16]}), "offline", "both",
                                "m", keys)
    by_pair = {(r["method"], r["baseline"]): r for r in rows}
    assert set(by_pair) == {("mrtpo", "gdpo"), ("mrtpo", "rs"), ("rs", "gdpo")}
    assert by_pair["mrtpo", "gdpo"]["steps_to_baseline_final"] is None
    assert "same checkpoints" in by_pair["mrtpo", "gdpo"]["steps_to_baseline_final_null_reason"]
    assert by_pair["rs", "gdpo"]["steps_to_baseline_final_null_reason"].startswith("scored at step 16 only")

    def curve(rewards_by_step):  # two seeds, one prompt, greedy only
        return {step: {seed: {"greedy": {"p": {"reward": r + 0.01 * seed}}} for seed in (0, 1)}
                for step, r in rewards_by_step.items()}

    method, baseline = curve({8: 0.50, 16: 0.60}), curve({8: 0.30, 16: 0.505})
    assert closed_loop.steps_to_reach(method, baseline, 0.505, "greedy") == (8, None)
    assert closed_loop.steps_to_reach(method, baseline, 0.7, "greedy") == (None, "not reached by step 16")
    for row in rows:
        assert len(row["per_seed_diff"]) == row["seeds"] == 3 and row["eval_prompts"] == 40
        assert row["ci_low_seeds"] <= row["diff"] <= row["ci_high_seeds"]
        assert row["unseen_prompts"] == 8 and row["design_commit"] is None and "pre-registered" in row["note"]
        assert row["sampled_tokens"] is None and row["sampled_tokens_note"]


@pytest.mark.slow
def test_quick_mode_runs_both_arms_and_keeps_nothing(tmp_path):
    before = sorted(p.name for p in (ROOT / "bench" / "results").iterdir())
    done = subprocess.run([sys.executable, "bench/closed_loop.py", "quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "quick run: 52 rows" in done.stdout and "dev variants" in done.stdout
    assert "('iterated', 'mrtpo', 'gdpo')" in done.stdout and "('offline', 'rs', 'gdpo')" in done.stdout
    # the Monte-Carlo credit experiment's arms: the tree pool's GDPO and mc, and mc's iterated arm against GDPO and
    # rejection sampling
    assert "('offline', 'mc', 'gdpo_tree')" in done.stdout and "('iterated', 'mc', 'rs')" in done.stdout
    assert '"mc_landing"' in done.stdout
    assert sorted(p.name for p in (ROOT / "bench" / "results").iterdir()) == before


def test_the_powered_prompt_set_is_the_builders_and_fresh():
    built = prompt_set.build_powered()
    stored = [json.loads(line) for line in (ROOT / "bench" / "closed_loop_prompts" / "powered.jsonl").open()]
    assert built == stored
    final = prompt_set.build("final")
    held_out = [r for r in built if r["split"] == "test"]
    assert [r for r in built if r["split"] == "train"] == [r for r in final if r["split"] == "train"]
    assert len(held_out) == 1024 and sum(r["id"].startswith("unseen-") for r in held_out) == 256
    assert len({r["prompt"] for r in held_out}) == 1024
    assert not {r["prompt"] for r in held_out} & {r["prompt"] for r in final}  # none the older runs scored


def test_compare_rows_of_every_design_are_reproduced_from_their_stored_rewards():
    from tokencredit.pipeline.compare.design import file_sha256, load_design
    from tokencredit.pipeline.compare.report import KEYS, rows_for

    stored = json.loads((ROOT / "bench" / "results" / "compare.json").read_text())
    by_hash: dict[str, list] = {}
    for row in stored:
        by_hash.setdefault(row["design_hash"], []).append(row)
    powered = by_hash.pop(file_sha256(closed_loop.POWERED))
    assert len(by_hash) == 2
    for rows in by_hash.values():
        first = rows[0]
        name = "mc_tree" if first["design_commit"] else "mrtpo_offline"  # the MRTPO experiment was not pre-registered
        registration = {"design_hash": first["design_hash"], "design_commit": first["design_commit"],
                        "design_commit_time": None,
                        "amendments": [{"arms": closed_loop.OLDER_DESIGNS[name]["exploratory"]}]}
        again = [{k: r[k] for k in KEYS} for r in closed_loop.older_rows(name, registration)]
        assert json.loads(json.dumps(again)) == rows
    # the powered design's, from its committed per-prompt rewards: registered before any policy was scored
    registration, scores = closed_loop.powered_scores()
    design = load_design(closed_loop.POWERED)
    assert registration["design_hash"] == file_sha256(closed_loop.POWERED)
    assert len(scores) == len(design.arms) * len(design.seeds) + 1  # and the start policy
    again = [{k: r[k] for k in KEYS} for r in rows_for(scores, registration, design.comparisons, design.primary,
                                                         design.targets.get("mde"))]
    assert json.loads(json.dumps(again)) == powered
    assert all(r["design_commit"] and not r["exploratory"] for r in powered)
    assert min(p["scored_at"] for p in scores.values()) > registration["registered_at"]


def test_the_powered_rows_join_compare_json_only_with_every_seed_of_the_design(tmp_path, monkeypatch):
    monkeypatch.setattr(closed_loop, "POWERED_RUN", tmp_path)
    assert closed_loop.powered_rows() == []  # not written yet
    from tokencredit.pipeline.compare.design import file_sha256, load_design

    seeds = load_design(closed_loop.POWERED).seeds
    row = {"method": "mc", "baseline": "gdpo", "diff": 0.01}
    (tmp_path / "compare.json").write_text(json.dumps({"rows": [{**row, "seeds": seeds[:2]}]}))
    assert closed_loop.powered_rows() == []  # `--report-only` on the seeds scored so far
    (tmp_path / "compare.json").write_text(json.dumps({"rows": [{**row, "seeds": seeds}]}))
    assert closed_loop.powered_rows() == [{**row, "seeds": seeds}]
