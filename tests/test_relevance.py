"""Relevance options (method.md section 2, "Relevance"): each option's formula, the noise floor, the
pointing sections of `feedback_sections`, and the MRTPO invariants under every option."""
import pytest
import torch

from tokencredit.pipeline.credit.mrtpo import mrtpo_advantages
from tokencredit.pipeline.sample.prompts import feedback_sections, feedback_text
from tokencredit.pipeline.credit.relevance import RELEVANCES, apply_floor, relevance, signs
from tokencredit.pipeline.credit.replay import ReplayOutput
from tokencredit.schemas.records import RewardScore


def replayed(seed=0, K=3, T=9):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(T, generator=g) * 5
    lq = -torch.rand(K, T, generator=g) * 5
    return ReplayOutput(lp, lq, torch.rand(K, T, generator=g) * 0.5)


def test_each_option_is_its_formula():
    out = replayed()
    gain = out.logprob_all - out.logprob_drop  # log p - log q
    assert torch.equal(relevance("js", out), out.js)
    assert torch.equal(relevance("logprob_drop", out), (-gain).clamp(min=0))
    assert torch.equal(relevance("logprob_abs", out), gain.abs())
    sign = torch.tensor([1.0, -1.0, 1.0])
    signed = relevance("logprob_signed", out, sign)
    assert torch.equal(signed[0], gain[0].clamp(min=0)) and torch.equal(signed[1], (-gain[1]).clamp(min=0))
    # a failing reward's signed relevance is logprob_drop; the drop and the rise split |gain|
    assert torch.equal(signed[1], relevance("logprob_drop", out)[1])
    torch.testing.assert_close(relevance("logprob_signed", out, -sign) + signed, relevance("logprob_abs", out))


def test_identical_prompts_give_zero_under_every_option():
    out = replayed()
    same = ReplayOutput(out.logprob_all, out.logprob_all.expand(3, -1).clone(), torch.zeros(3, 9))
    for kind in RELEVANCES:
        assert torch.equal(relevance(kind, same, torch.tensor([1.0, -1.0, 1.0])), torch.zeros(3, 9)), kind


def test_errors_name_the_problem():
    out = replayed()
    with pytest.raises(ValueError, match="unknown relevance 'kl'"):
        relevance("kl", out)
    with pytest.raises(ValueError, match="needs one sign per reward"):
        relevance("logprob_signed", out)
    with pytest.raises(ValueError, match="js=True"):
        relevance("js", ReplayOutput(out.logprob_all, out.logprob_drop, None))
    with pytest.raises(ValueError, match="floor must be >= 0"):
        apply_floor(out.js, -1.0)


def test_floor_zeroes_weak_rows_and_leaves_unreplayed_rows_alone():
    values = torch.tensor([[0.01, 0.02, 0.0], [1.0, 0.0, 2.0], [float("nan")] * 3])
    floored_values, floored = apply_floor(values, 0.05)
    assert floored.tolist() == [True, False, False]
    assert torch.equal(floored_values[0], torch.zeros(3)) and torch.equal(floored_values[1], values[1])
    assert torch.isnan(floored_values[2]).all()


@pytest.mark.parametrize("kind", RELEVANCES)
def test_mrtpo_invariants_hold_for_every_option(kind):
    """beta 0 is GDPO, and every (response, reward) keeps its advantage on average (mass preservation),
    floored pairs included."""
    N, K, T = 2, 3, 9
    distance = torch.stack([apply_floor(relevance(kind, replayed(n), torch.tensor([1.0, -1.0, 1.0])), 0.3)[0]
                            for n in range(N)])
    reward_adv = torch.tensor([[0.5, -1.0, 0.0], [-0.2, 0.7, 1.5]])
    mask_t, mask_k = torch.ones(N, T, dtype=torch.bool), torch.ones(N, K, dtype=torch.bool)
    scale, shift = torch.tensor(0.8), torch.tensor(0.1)
    _, adv, _ = mrtpo_advantages(reward_adv, distance, mask_t, mask_k, 0.7, scale, shift)
    torch.testing.assert_close(adv.mean(-1), reward_adv)
    _, adv0, total0 = mrtpo_advantages(reward_adv, distance, mask_t, mask_k, 0.0, scale, shift)
    torch.testing.assert_close(adv0, reward_adv[..., None].expand(-1, -1, T))
    torch.testing.assert_close(total0, (scale * (reward_adv.sum(-1) - shift))[:, None].expand(-1, T))


def test_signs_follow_the_advantage_except_where_a_section_points():
    adv = torch.tensor([0.4, -0.3, 0.0, -1.0])
    assert signs(adv, [False, False, False, True]).tolist() == [1.0, -1.0, 0.0, 1.0]


def rewards():
    return [RewardScore("format", 1.0, "Wrap the query in <sql>.", "Found one <sql> block."),
            RewardScore("c1_no_commas", 0.0, "Do not use any commas.", "Found: 1 comma."),
            RewardScore("c2_title", 1.0, "Include a title.", "")]


@pytest.mark.parametrize("style, texts, points", [
    ("expected", ["Wrap the query in <sql>.", "Do not use any commas.", "Include a title."], [False, False, False]),
    ("expected+observed", ["Wrap the query in <sql>. Found one <sql> block.", "Do not use any commas. Found: 1 comma.",
                           "Include a title."], [False, True, False]),
    ("auto", ["Wrap the query in <sql>.", "Do not use any commas. Found: 1 comma.", "Include a title."],
     [False, True, False]),
])
def test_feedback_sections_by_style(style, texts, points):
    """A constraint the prompt already states adds nothing as a section: `auto` adds what was found, and
    such a section points at the response. A section with nothing found never points."""
    prompt = "Write about rain.  Do not use any   commas. Include a title."
    sections, pointing = feedback_sections(rewards(), prompt, style)
    assert [t for _, t in sections] == texts and pointing == points
    assert [n for n, _ in sections] == ["format", "c1_no_commas", "c2_title"]
    with pytest.raises(ValueError, match="feedback style 'terse'"):
        feedback_sections(rewards(), prompt, "terse")
    assert feedback_text(rewards()[1], with_observed=True) == "Do not use any commas. Found: 1 comma."
    assert feedback_text(rewards()[1]) == "Do not use any commas."
