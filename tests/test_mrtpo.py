import math

import pytest
import torch

from tokencredit.pipeline.credit.advantages import gdpo
from tokencredit.pipeline.credit.mrtpo import (constrain_second_moment, mrtpo_advantages, reallocate, replay_weights,
                            smoothstep_beta, total_token_advantage)


def batch(seed=0, N=8, K=4, T=12):
    """A padded batch: 2 prompt groups, 2-4 rewards and 1-12 tokens per response, some pairs gated."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (N, K), generator=g).float() / 2
    group = torch.arange(N) % 2
    n_rewards = torch.where(group == 0, K, 2)
    reward_mask = torch.arange(K)[None] < n_rewards[:, None]
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    lengths[0] = T
    token_mask = torch.arange(T)[None] < lengths[:, None]
    result = gdpo(rewards, reward_mask, group)
    distance = torch.rand(N, K, T, generator=g) * math.log(2)
    distance[1, 0] = 0.0  # replayed, but nothing changed: uniform weights
    gated = reward_mask & (result.reward_adv == 0)
    gated[2, 1] = True
    distance[gated] = float("nan")
    distance[~token_mask[:, None, :].expand(N, K, T)] = float("nan")  # padding is not looked at
    return result, distance, token_mask, reward_mask, lengths


def test_weights_have_mean_one_and_follow_distance():
    d = torch.tensor([[0.1, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0]])
    w = replay_weights(d)
    torch.testing.assert_close(w[0], d[0] / 0.15)
    assert torch.equal(w[1], torch.ones(4))  # mean distance 0: uniform
    mask = torch.tensor([True, True, False, False])
    wm = replay_weights(d, mask)
    torch.testing.assert_close(wm[0], torch.tensor([0.5, 1.5, 0.0, 0.0]))
    torch.testing.assert_close(wm[:, :2].mean(-1), torch.ones(2))


def test_weights_reject_bad_distances():
    with pytest.raises(ValueError, match=r"distance: entry \(0, 2\) is -0.5"):
        replay_weights(torch.tensor([[0.1, 0.2, -0.5]]))
    with pytest.raises(ValueError, match="nan"):
        replay_weights(torch.tensor([[0.1, float("nan")]]))


def test_smoothstep_beta():
    assert smoothstep_beta(0) == 0.0
    assert smoothstep_beta(5) == pytest.approx(0.25)  # u = 1/2: 1/4 * 2 = 1/2 of beta_max
    assert smoothstep_beta(2.5, beta_max=1.0) == pytest.approx(0.25 ** 2 * 2.5)
    assert smoothstep_beta(10) == 0.5 and smoothstep_beta(1000) == 0.5
    assert smoothstep_beta(-3) == 0.0
    assert smoothstep_beta(0, beta_max=0.8, warmup_steps=0) == 0.8
    steps = [smoothstep_beta(s) for s in range(12)]
    assert steps == sorted(steps)


def test_reallocation_preserves_mass():
    g = torch.Generator().manual_seed(1)
    A = torch.randn(5, generator=g)
    w = replay_weights(torch.rand(5, 40, generator=g))
    for beta in (0.0, 0.3, 0.5, 1.0):
        adv = reallocate(A, w, beta)
        torch.testing.assert_close(adv.mean(-1), A, atol=1e-6, rtol=0)
    torch.testing.assert_close(reallocate(A, w, 1.0), A[:, None] * w)
    with pytest.raises(ValueError, match="beta"):
        reallocate(A, w, 1.5)


def test_second_moment_constraint():
    g = torch.Generator().manual_seed(2)
    w = replay_weights(torch.rand(4, 30, generator=g) ** 4)  # heavy-tailed weights
    second = ((w - 1) ** 2).mean(-1)
    limit = float(second.median())
    c = constrain_second_moment(w, limit)
    assert (((c - 1) ** 2).mean(-1) <= limit * (1 + 1e-5)).all()
    torch.testing.assert_close(c.mean(-1), torch.ones(4))
    within = second <= limit
    assert within.any() and (~within).any()
    assert torch.equal(c[within], w[within])  # already within: untouched
    # scaled rows keep their shape: w - 1 shrinks by one factor per row
    factor = (limit / second[~within]).sqrt()[:, None]
    torch.testing.assert_close(c[~within] - 1, factor * (w[~within] - 1), atol=1e-6, rtol=0)
    assert torch.equal(constrain_second_moment(w, float(second.max()) + 1), w)
    A = torch.randn(4, generator=g)
    torch.testing.assert_close(reallocate(A, w, 0.5, max_second_moment=limit), reallocate(A, c, 0.5))


def test_total_token_advantage():
    adv = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]])
    scale, shift = torch.tensor(2.0), torch.tensor(0.25)
    torch.testing.assert_close(total_token_advantage(adv, scale, shift), 2.0 * (adv.sum(0) - 0.25))


def test_beta_zero_is_exactly_gdpo():
    result, distance, token_mask, reward_mask, _ = batch()
    weights, adv, total = mrtpo_advantages(result.reward_adv, distance, token_mask, reward_mask, 0.0,
                                           result.scale, result.shift)
    T = token_mask.shape[1]
    expected = torch.where(token_mask, result.total[:, None].expand(-1, T), 0.0)
    assert torch.equal(total, expected)
    valid = reward_mask[:, :, None] & token_mask[:, None, :]
    assert torch.equal(adv, torch.where(valid, result.reward_adv[:, :, None].expand_as(adv), 0.0))


@pytest.mark.parametrize("beta,max_second_moment", [(0.5, None), (1.0, None), (0.7, 0.05)])
def test_batched_equals_per_response_loop(beta, max_second_moment):
    result, distance, token_mask, reward_mask, lengths = batch(seed=3)
    weights, adv, total = mrtpo_advantages(result.reward_adv, distance, token_mask, reward_mask, beta,
                                           result.scale, result.shift, max_second_moment)
    N, K, T = distance.shape
    for i in range(N):
        n, k_i = int(lengths[i]), int(reward_mask[i].sum())
        d = distance[i, :k_i, :n].nan_to_num(0.0)  # a gated pair: no distance, uniform weights
        w_i = replay_weights(d)
        if max_second_moment is not None:
            w_i = constrain_second_moment(w_i, max_second_moment)
        a_i = reallocate(result.reward_adv[i, :k_i], w_i, beta)
        torch.testing.assert_close(weights[i, :k_i, :n], w_i, atol=1e-6, rtol=0)
        torch.testing.assert_close(adv[i, :k_i, :n], a_i, atol=1e-6, rtol=0)
        torch.testing.assert_close(total[i, :n], total_token_advantage(a_i, result.scale, result.shift),
                                   atol=1e-5, rtol=0)
        # mass preservation and mean-1 weights on every valid pair
        torch.testing.assert_close(adv[i, :k_i, :n].mean(-1), result.reward_adv[i, :k_i], atol=1e-6, rtol=0)
        torch.testing.assert_close(weights[i, :k_i, :n].mean(-1), torch.ones(k_i), atol=1e-6, rtol=0)
    outside = ~(reward_mask[:, :, None] & token_mask[:, None, :])
    assert (weights[outside] == 0).all() and (adv[outside] == 0).all() and (total[~token_mask] == 0).all()
    assert torch.equal(weights[2, 1, : int(lengths[2])], torch.ones(int(lengths[2])))  # gated: uniform
    assert torch.equal(weights[1, 0, : int(lengths[1])], torch.ones(int(lengths[1])))  # d = 0: uniform


def test_batched_rejects_partly_missing_distance():
    result, distance, token_mask, reward_mask, _ = batch()
    distance[0, 0, 3] = float("nan")  # response 0 has every token, reward 0 replayed
    assert not torch.isnan(distance[0, 0, :3]).any()
    with pytest.raises(ValueError, match=r"\(response, reward\) = \(0, 0\)"):
        mrtpo_advantages(result.reward_adv, distance, token_mask, reward_mask, 0.5, result.scale, result.shift)
