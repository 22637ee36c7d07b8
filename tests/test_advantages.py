import math
import random

import pytest
import torch

from tokencredit.pipeline.credit.advantages import EPS, gdpo, group_has_variance, grpo


# --- plain-Python reference, straight from method.md section 1 ---------------------------------
def pstd(xs):
    mu = sum(xs) / len(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / len(xs))  # population std, ddof = 0


def ref_grpo(rows, groups):
    sums = [sum(r) for r in rows]
    out = []
    for i, g in enumerate(groups):
        members = [sums[j] for j in range(len(rows)) if groups[j] == g]
        out.append((sums[i] - sum(members) / len(members)) / (pstd(members) + EPS))
    return out


def ref_gdpo(rows, groups):
    adv = []
    for i, g in enumerate(groups):
        members = [j for j in range(len(rows)) if groups[j] == g]
        adv_i = []
        for k in range(len(rows[i])):
            col = [rows[j][k] for j in members]
            sd = pstd(col)
            adv_i.append(0.0 if sd <= EPS else (rows[i][k] - sum(col) / len(col)) / (sd + EPS))
        adv.append(adv_i)
    S = [sum(a) for a in adv]
    m, sd = sum(S) / len(S), pstd(S)
    return adv, [(s - m) / (sd + EPS) for s in S], 1 / (sd + EPS), m


def random_batch(seed, n_groups=6, group_size=5):
    """Groups with 1-6 rewards each; scores from few levels (ties), some groups constant in a reward."""
    rng = random.Random(seed)
    rows, groups = [], []
    for g in rng.sample(range(50), n_groups):  # sparse, unordered group ids
        K = rng.randint(1, 6)
        constant = {k: rng.choice([0.0, 1.0, 0.3]) for k in range(K) if rng.random() < 0.3}
        for _ in range(group_size):
            rows.append([constant.get(k, rng.choice([0.0, 0.25, 0.5, 1.0, rng.random()])) for k in range(K)])
            groups.append(g)
    order = list(range(len(rows)))
    rng.shuffle(order)  # groups interleaved in the batch
    return [rows[i] for i in order], [groups[i] for i in order]


def to_tensors(rows, groups):
    K = max(len(r) for r in rows)
    rewards = torch.full((len(rows), K), 7.0)  # junk under the mask must not leak in
    mask = torch.zeros(len(rows), K, dtype=torch.bool)
    for i, r in enumerate(rows):
        rewards[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    return rewards, mask, torch.tensor(groups)
# -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_grpo_matches_loop(seed):
    rows, groups = random_batch(seed)
    got = grpo(*to_tensors(rows, groups))
    torch.testing.assert_close(got, torch.tensor(ref_grpo(rows, groups)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_gdpo_matches_loop(seed):
    rows, groups = random_batch(seed)
    rewards, mask, group = to_tensors(rows, groups)
    result = gdpo(rewards, mask, group)
    adv, total, scale, shift = ref_gdpo(rows, groups)
    expected_adv = torch.zeros_like(rewards)
    for i, a in enumerate(adv):
        expected_adv[i, : len(a)] = torch.tensor(a)
    torch.testing.assert_close(result.reward_adv, expected_adv, atol=1e-5, rtol=1e-5)
    assert (result.reward_adv[~mask] == 0).all()
    torch.testing.assert_close(result.total, torch.tensor(total), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(result.scale, torch.tensor(scale), atol=0, rtol=1e-5)
    torch.testing.assert_close(result.shift, torch.tensor(shift), atol=1e-5, rtol=0)
    torch.testing.assert_close(result.total, result.scale * (rewards.new_tensor([sum(a) for a in adv]) - result.shift),
                               atol=1e-5, rtol=0)


def test_batch_normalized_total_has_zero_mean_unit_std():
    result = gdpo(*to_tensors(*random_batch(11)))
    assert abs(result.total.mean().item()) < 1e-6
    assert abs(result.total.std(correction=0).item() - 1) < 1e-4


def test_population_std_ddof0():
    # one group, rewards 0, 0, 1, 1: population std 0.5 (sample std would be 0.577)
    rewards = torch.tensor([[0.0], [0.0], [1.0], [1.0]])
    mask = torch.ones_like(rewards, dtype=torch.bool)
    group = torch.zeros(4, dtype=torch.long)
    expected = torch.tensor([-1.0, -1.0, 1.0, 1.0]) * 0.5 / (0.5 + EPS)
    torch.testing.assert_close(grpo(rewards, mask, group), expected)
    torch.testing.assert_close(gdpo(rewards, mask, group).reward_adv[:, 0], expected)


def test_zero_variance_groups_get_zero_advantage():
    # group 0 constant in reward 1 (0.3 does not sum exactly), group 1 has a single response
    rewards = torch.tensor([[1.0, 0.3], [0.0, 0.3], [0.5, 0.3], [1.0, 0.0]])
    mask = torch.ones_like(rewards, dtype=torch.bool)
    group = torch.tensor([0, 0, 0, 1])
    result = gdpo(rewards, mask, group)
    assert (result.reward_adv[:, 1] == 0).all() and (result.reward_adv[3] == 0).all()
    assert (result.reward_adv[:3, 0] != 0).any()
    expected = torch.tensor([[True, False], [True, False], [True, False], [False, False]])
    assert torch.equal(group_has_variance(rewards, mask, group), expected)
    mask[0, 1] = False  # masked entries are never "varied"
    assert not group_has_variance(rewards, mask, group)[0, 1]


def test_gdpo_with_one_reward_is_grpo_up_to_batch_normalization():
    rows, groups = random_batch(3)
    rows = [r[:1] for r in rows]
    rewards, mask, group = to_tensors(rows, groups)
    A = grpo(rewards, mask, group)
    result = gdpo(rewards, mask, group)
    torch.testing.assert_close(result.reward_adv[:, 0], A, atol=1e-6, rtol=0)
    torch.testing.assert_close(result.total, (A - A.mean()) / (A.std(correction=0) + EPS), atol=1e-5, rtol=0)


def test_bad_input_names_the_field():
    rewards = torch.tensor([[1.0, float("nan")], [0.0, 1.0]])
    mask = torch.ones_like(rewards, dtype=torch.bool)
    group = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match=r"rewards: response 0, reward 1 is nan"):
        gdpo(rewards, mask, group)
    mask[0, 1] = False  # a NaN under the mask is padding, not an error
    assert torch.isfinite(gdpo(rewards, mask, group).total).all()
    with pytest.raises(ValueError, match="group"):
        grpo(rewards, mask, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="mask"):
        gdpo(rewards, mask.float(), group)


# --- options and presets ------------------------------------------------------------------------
from tokencredit.pipeline.credit.advantages import PRESETS, GdpoOptions, batch_statistics, condition_on, preset  # noqa: E402


def sstd(xs):
    mu = sum(xs) / len(xs)
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))  # sample std, ddof = 1


@pytest.mark.parametrize("seed", range(3))
def test_sample_std_weights_and_eps_match_loop(seed):
    rows, groups = random_batch(seed, group_size=4)
    rewards, mask, group = to_tensors(rows, groups)
    K = rewards.shape[1]
    weights = torch.linspace(0.5, 2.0, K)
    options = GdpoOptions(ddof=1, eps=1e-3, zero_std=0.0, batch_ddof=1, batch_eps=1e-2)
    result = gdpo(rewards.double(), mask, group, options, weights=weights.double())
    S = []
    for i, g in enumerate(groups):
        members = [j for j in range(len(rows)) if groups[j] == g]
        s = 0.0
        for k in range(len(rows[i])):
            col = [rows[j][k] for j in members if k < len(rows[j])]
            sd = sstd(col) if len(col) > 1 else 0.0
            a = 0.0 if sd == 0 else (rows[i][k] - sum(col) / len(col)) / (sd + 1e-3)
            assert result.reward_adv[i, k].item() == pytest.approx(a, abs=1e-6)
            s += weights[k].item() * a
        S.append(s)
    m, sd = sum(S) / len(S), sstd(S)
    torch.testing.assert_close(result.summed, torch.tensor(S, dtype=torch.float64), atol=1e-5, rtol=0)
    torch.testing.assert_close(result.total, torch.tensor([(s - m) / (sd + 1e-2) for s in S], dtype=torch.float64),
                               atol=1e-5, rtol=0)


def test_single_response_groups_and_token_whitening():
    # group 0: two responses; group 1: one response (verl: mean 0, std 1, so A = r / (1 + eps))
    rewards = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.5, 1.0]], dtype=torch.float64)
    mask = torch.ones_like(rewards, dtype=torch.bool)
    group = torch.tensor([0, 0, 1])
    lengths = torch.tensor([3, 1, 4])
    verl = gdpo(rewards, mask, group, preset("verl"), lengths=lengths)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)  # sample std of (1, 0) is sqrt(0.5)
    expected_adv = torch.tensor([[a, 0.0], [-a, 0.0], [0.5 / (1 + 1e-6), 1.0 / (1 + 1e-6)]], dtype=torch.float64)
    torch.testing.assert_close(verl.reward_adv, expected_adv)
    assert verl.varied.tolist() == [[True, False], [True, False], [True, True]]
    tokens = [s for s, n in zip(verl.summed.tolist(), lengths.tolist()) for _ in range(n)]  # broadcast to tokens
    m = sum(tokens) / len(tokens)
    var = sum((t - m) ** 2 for t in tokens) / (len(tokens) - 1)
    torch.testing.assert_close(verl.total, (verl.summed - m) / math.sqrt(var + 1e-8))
    method = gdpo(rewards, mask, group)  # a group of one has no variance: 0
    assert method.reward_adv[2].tolist() == [0.0, 0.0] and not method.varied[2].any()
    with pytest.raises(ValueError, match="pass lengths"):
        gdpo(rewards, mask, group, preset("verl"))


def test_conditioned_reward_counts_secondaries_only_past_the_threshold():
    rewards = torch.tensor([[1.0, 0.7, 0.2], [0.0, 0.9, 1.0], [0.5, 0.4, 0.3]])
    mask = torch.tensor([[True, True, True], [True, True, True], [True, True, False]])
    out = condition_on(rewards, mask, 0, threshold=0.5)
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.7, 0.2], [0.0, 0.0, 0.0], [0.5, 0.4, 0.3]]))
    per_response = condition_on(rewards, mask, torch.tensor([1, -1, 0]), threshold=0.8)
    torch.testing.assert_close(per_response, torch.tensor([[0.0, 0.7, 0.0], [0.0, 0.9, 1.0], [0.5, 0.0, 0.3]]))
    with pytest.raises(ValueError, match="masked out"):
        condition_on(rewards, mask, torch.tensor([2, 2, 2]), threshold=0.5)


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="batch"):
        GdpoOptions(batch="tokens")
    with pytest.raises(ValueError, match="unknown GDPO preset 'x'"):
        preset("x")
    assert set(PRESETS) == {"method", "trl", "verl"}
    with pytest.raises(ValueError, match=r"weights \(2,\)"):
        gdpo(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), torch.zeros(2, dtype=torch.long),
             weights=torch.ones(2))


def test_batch_none_keeps_the_summed_advantage():
    rows, groups = random_batch(2)
    result = gdpo(*to_tensors(rows, groups), GdpoOptions(batch="none"))
    assert torch.equal(result.total, result.summed)
    scale, shift = batch_statistics(result.summed, torch.ones(len(rows), dtype=torch.bool))
    torch.testing.assert_close(shift.float(), result.summed.mean(), atol=1e-6, rtol=0)


def test_verl_preset_matches_verls_gdpo_estimator():
    """verl 0.9.1's own `adv_estimator=gdpo` (its registry), on DataProto-shaped inputs, to 1e-6."""
    np = pytest.importorskip("numpy")
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    g = torch.Generator().manual_seed(0)
    sizes = [4, 4, 1, 3, 4]  # a group of one, groups of unequal size
    group = torch.tensor([gi for gi, n in enumerate(sizes) for _ in range(n)])
    N, K, P, T = len(group), 3, 5, 9
    rewards = torch.randint(0, 3, (N, K), generator=g).float() / 2  # ties and constant groups
    rewards[:4, 1] = 0.5  # group 0 has no variance in reward 1
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    response_mask = (torch.arange(T)[None] < lengths[:, None]).float()
    weights = [1.0, 0.5, 2.0]
    batch = {"prompts": torch.ones(N, P, dtype=torch.long),
             "attention_mask": torch.cat([torch.ones(N, P), response_mask], 1).long()}
    non_tensor = {f"r{k}": rewards[:, k].numpy() for k in range(K)}
    estimator = core_algos.get_adv_estimator_fn("gdpo")
    theirs, _ = estimator(token_level_rewards=torch.zeros(N, T), response_mask=response_mask,
                          index=np.array([f"uid{int(x)}" for x in group]), epsilon=1e-6,
                          config={"gdpo_reward_keys": list(non_tensor), "gdpo_reward_weights": weights},
                          non_tensor_batch=non_tensor, batch=batch)
    ours = gdpo(rewards, torch.ones(N, K, dtype=torch.bool), group, preset("verl"),
                weights=torch.tensor(weights), lengths=lengths)
    torch.testing.assert_close(ours.total[:, None] * response_mask, theirs, atol=1e-6, rtol=0)
