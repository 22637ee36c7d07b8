"""compare's statistics (tokencredit.pipeline.compare.analysis) checked by simulation: data with known variance
components and a known effect, where the 95% interval must cover the effect 93-97% of the time."""
import numpy as np
import pytest

from tokencredit.pipeline.compare.analysis import components, crossed_means, difference, intervals, mde_for
from tokencredit.pipeline.compare.plan import SEED_BOUND, seed_component_bound

# (var_seed, var_prompt, var_cell) shaped like the re-analysed closed-loop differences (bench/results/compare.json):
# the cell term dominates, the seed term is small or 0 (two credits on one shared pool), the prompt term varies.
SHAPES = [(0.0005, 0.005, 0.07), (0.0, 0.05, 0.065), (0.0, 0.0025, 0.055), (0.003, 0.002, 0.08)]
EFFECT = 0.02


def simulate(rng, replicates: int, seeds: int, prompts: int, var_seed: float, var_prompt: float, var_cell: float,
             decodes: int = 1, var_decode: float = 0.0):
    """[R, S, P, D] differences: the effect plus a seed, a prompt, a seed x prompt and a decode term."""
    return (EFFECT + rng.normal(0, np.sqrt(var_seed), (replicates, seeds, 1, 1))
            + rng.normal(0, np.sqrt(var_prompt), (replicates, 1, prompts, 1))
            + rng.normal(0, np.sqrt(var_cell), (replicates, seeds, prompts, 1))
            + rng.normal(0, np.sqrt(var_decode), (replicates, seeds, prompts, decodes)))


@pytest.mark.parametrize("shape", SHAPES)
def test_interval_covers_the_effect_at_its_level(shape):
    rng = np.random.default_rng(sum(int(1e4 * v) for v in shape))
    replicates, seeds, prompts = 1000, 5, 256
    cells = simulate(rng, replicates, seeds, prompts, *shape)[..., 0]
    rows = intervals(cells)
    coverage = float(((rows["ci_low"] <= EFFECT) & (EFFECT <= rows["ci_high"])).mean())
    # the crossed seeds x prompts bootstrap of the older rows, beside it (first 500 replicates, 1000 draws each)
    means = crossed_means(cells[:500], draws=1000, seed=1)
    low, high = np.quantile(means, [0.025, 0.975], axis=-1)
    crossed = float(((low <= EFFECT) & (EFFECT <= high)).mean())
    true_se = np.sqrt(shape[0] / seeds + shape[1] / prompts + shape[2] / (seeds * prompts))
    print(f"components {shape}: variance-components interval covers {coverage:.3f} of {replicates}; crossed "
          f"bootstrap {crossed:.3f} of 500 (its standard error {means.std(axis=-1).mean() / true_se:.2f}x the "
          f"true one, the estimator's {rows['se'].mean() / true_se:.2f}x)")
    assert 0.93 <= coverage <= 0.97
    # the detectable difference is the interval's: ~2.8 standard errors at 80% power, 5% two-sided
    assert np.all(rows["mde"] > 2.8 * rows["se"])


def test_components_recover_the_truth_and_decodes_split_off():
    rng = np.random.default_rng(7)
    truth = (0.002, 0.01, 0.04)
    diff = simulate(rng, 400, 6, 200, *truth, decodes=3, var_decode=0.06)
    found = [components(d) for d in diff]
    assert np.mean([c.var_seed for c in found]) == pytest.approx(truth[0], rel=0.2)
    assert np.mean([c.var_prompt for c in found]) == pytest.approx(truth[1], rel=0.1)
    # the cell mean over 3 decodes holds the interaction and a third of the decode noise
    assert np.mean([c.var_cell for c in found]) == pytest.approx(truth[2] + 0.06 / 3, rel=0.05)
    assert np.mean([c.var_decode for c in found]) == pytest.approx(0.06, rel=0.05)


def test_plan_mde_matches_the_interval_and_falls_with_prompts_and_decodes():
    rng = np.random.default_rng(3)
    cells = simulate(rng, 1, 5, 256, 0.0005, 0.005, 0.07)[0, ..., 0]
    row = difference(cells[..., None] + 0.5, np.full((5, 256, 1), 0.5))
    assert row["diff"] == pytest.approx(cells.mean())
    # the planned detectable difference at the pilot's own size is the measured one
    planned = mde_for(row["var_seed"], row["var_prompt"], row["var_cell"], 5, 256)
    assert planned == pytest.approx(row["mde"], rel=0.05)
    # more prompts shrink it; with a measured decode term, more decodes do too; without one they do not
    pilot = mde_for(0.0005, 0.005, 0.07, 5, 256)
    assert mde_for(0.0005, 0.005, 0.07, 5, 1024) < pilot
    assert mde_for(0.0005, 0.005, 0.07, 5, 256, var_decode=0.05, decodes=3) < pilot
    assert mde_for(0.0005, 0.005, 0.07, 5, 256, decodes=3) == pytest.approx(pilot)
    assert len(row["per_seed_diff"]) == 5 and np.mean(row["per_seed_diff"]) == pytest.approx(row["diff"])


def test_too_few_seeds_is_refused():
    with pytest.raises(ValueError, match="2 seeds"):
        components(np.zeros((1, 10)))


@pytest.mark.parametrize("var_seed, most", [(0.0001, 1.0), (0.0005, SEED_BOUND + 0.1)])
def test_the_seed_components_upper_bound_covers_it_at_its_level(var_seed, most):
    """A pilot of 5 seeds: its estimate of a small seed component is below the truth more than half the time (at 0
    often), the plan's cautious bound above it at least 80% of the time: about 80% where prompts x var_seed is
    large beside the cell term, always where it is small (the bound never falls below var_cell x ((S - 1) /
    chi2 - 1) / P, what 5 seeds cannot tell from 0)."""
    rng = np.random.default_rng(int(var_seed * 1e5))
    seeds, prompts = 5, 256
    found = [components(d) for d in simulate(rng, 600, seeds, prompts, var_seed, 0.005, 0.07)[..., 0]]
    bounds = [seed_component_bound({"seeds": seeds, "prompts": prompts, "var_seed": c.var_seed,
                                    "var_cell": c.var_cell}) for c in found]
    covered = float(np.mean([b >= var_seed for b in bounds]))
    estimate_covers = float(np.mean([c.var_seed >= var_seed for c in found]))
    print(f"seed component {var_seed}: bound covers {covered:.3f}, the estimate {estimate_covers:.3f}; "
          f"estimated at 0 in {np.mean([c.var_seed == 0 for c in found]):.3f}")
    assert SEED_BOUND - 0.04 <= covered <= most
    assert estimate_covers < 0.6
    assert all(b >= c.var_seed for b, c in zip(bounds, found))


def _seeds_by_prompts(seed_effects, n_prompts=300, noise=0.15, rng_seed=2):
    """[S, P] paired differences: prompt effects shared by every seed, one offset per seed, cell noise."""
    rng = np.random.default_rng(rng_seed)
    prompts = rng.normal(0.02, 0.1, n_prompts)
    return np.array(seed_effects)[:, None] + prompts[None, :] + rng.normal(0, noise, (len(seed_effects), n_prompts))


def test_crossed_bootstrap_with_one_seed_is_the_prompts_only_bootstrap():
    cells = _seeds_by_prompts([0.01])
    draws = np.random.default_rng(3).integers(0, cells.shape[1], size=(5_000, cells.shape[1]))
    prompts_only = cells[0][draws].mean(axis=1)  # the older rows' prompts-only bootstrap, the same draws
    assert np.allclose(crossed_means(cells, draws=5_000, seed=3), prompts_only, rtol=0, atol=1e-12)


def test_crossed_bootstrap_is_deterministic_and_draws_seeds_and_prompts_together():
    cells = _seeds_by_prompts([0.0, 0.05, -0.03, 0.08])
    first, again = crossed_means(cells, 2_000, seed=7), crossed_means(cells, 2_000, seed=7)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, crossed_means(cells, 2_000, seed=8))
    # every leading array gets the same draws: the replicate of a sum is the sum of the replicates
    both = crossed_means(np.stack([cells, 2 * cells + 1]), 2_000, seed=7)
    assert np.allclose(both[0], first) and np.allclose(both[1], 2 * first + 1)


def test_crossed_interval_is_wider_when_seeds_disagree_and_its_variance_is_the_exact_one():
    agreeing = _seeds_by_prompts([0.02, 0.02, 0.02])
    disagreeing = _seeds_by_prompts([-0.03, 0.02, 0.07])  # the same prompts and noise, seeds apart
    width = {name: np.ptp(np.quantile(crossed_means(c, 20_000), [0.025, 0.975]))
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
        assert crossed_means(cells, 40_000, seed=1).var() == pytest.approx(exact, rel=0.05)
