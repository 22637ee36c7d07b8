"""P2T attribution and token rewards (method.md section 3) on a tiny random Llama reward model."""
import math
from types import SimpleNamespace

import pytest
import torch
from scipy.special import softmax
from torch import nn
from transformers import LlamaConfig, LlamaForSequenceClassification

from tokencredit.pipeline.credit.p2t import (
    P2TStats,
    attribute,
    is_near_flat,
    p2t_advantages,
    token_rewards,
)

PAD = 0
# mixed lengths; response 3 contains the pad id inside, response 4 ends with it
# (as when pad == eos): HF then pools at the last non-pad token, and so must we
PROMPTS = [[5, 6, 7, 8], [9, 10], [11], [12, 13, 14], [15, 16, 17, 18, 19, 20]]
RESPONSES = [[21, 22, 23], [24, 25, 26, 27, 28, 29], [30, 31], [32, PAD, 33, 34], [35, 36, 37, PAD]]


@pytest.fixture(scope="module")
def rm():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, pad_token_id=PAD, num_labels=1,
                      initializer_range=0.2)
    model = LlamaForSequenceClassification(cfg).eval()
    # HF zero-initialises the padding_idx row. With B = 0, the straight path starts where the first
    # RMSNorm (x / sqrt(mean x^2 + 1e-6)) is nearly discontinuous, and integrated gradients needs
    # thousands of steps; a trained model's pad row (often eos) is not zero, so give it a real one.
    with torch.no_grad():
        model.get_input_embeddings().weight[PAD] = 0.2 * torch.randn(cfg.hidden_size)
    return model


def own_score(model, embeds):
    """The model's own forward on ONE unpadded sequence of embeddings [1 or n, L, d] -> [n]."""
    return model(inputs_embeds=embeds).logits[:, 0]


def response_baseline(model, prompt, response, baseline="pad"):
    """Embeddings E [1, L, d] of prompt + response and B: E with response rows set to the baseline."""
    embed = model.get_input_embeddings()
    E = embed(torch.tensor([prompt + response])).detach()
    B = E.clone()
    B[0, len(prompt):] = embed.weight[PAD].detach() if baseline == "pad" else 0.0
    return E, B


# --- attribution -------------------------------------------------------------------------------


def test_score_equals_model_forward(rm):
    out = attribute(rm, PROMPTS, RESPONSES, batch_size=3)
    for p, r, a in zip(PROMPTS, RESPONSES, out):
        with torch.no_grad():
            expected = rm(torch.tensor([p + r])).logits[0, 0].item()
        assert a.score == pytest.approx(expected, abs=1e-5)
        assert a.raw.shape == (len(r),) and a.raw.dtype == torch.float32


@pytest.mark.parametrize("method", ["grad_x_input", "integrated_gradients"])
def test_batched_padded_equals_per_sequence_loop(rm, method):
    batched = attribute(rm, PROMPTS, RESPONSES, batch_size=3, method=method, ig_steps=4)
    for p, r, b in zip(PROMPTS, RESPONSES, batched):
        (single,) = attribute(rm, [p], [r], batch_size=1, method=method, ig_steps=4)
        assert b.score == pytest.approx(single.score, abs=1e-5)
        torch.testing.assert_close(b.raw, single.raw, atol=1e-5, rtol=0)
    # a token after the pooled position cannot move the score: its attribution is exactly 0
    assert batched[4].raw[-1].item() == 0.0
    assert batched[0].raw.abs().max() > 1e-3  # and the others are not trivially zero


def test_parameters_get_no_grad_and_no_grad_context_is_fine(rm):
    with torch.no_grad():
        (a,) = attribute(rm, PROMPTS[:1], RESPONSES[:1])
    assert a.raw.abs().sum() > 0
    assert all(p.grad is None for p in rm.parameters())


def test_against_captum_input_x_gradient(rm):
    captum = pytest.importorskip("captum.attr")
    ixg = captum.InputXGradient(lambda e: own_score(rm, e))
    out = attribute(rm, PROMPTS[:4], RESPONSES[:4], baseline="zero", batch_size=4)
    for p, r, a in zip(PROMPTS, RESPONSES, out):
        E, _ = response_baseline(rm, p, r)
        ref = ixg.attribute(E.requires_grad_()).sum(-1)[0, len(p):]
        torch.testing.assert_close(a.raw, ref.detach(), atol=1e-5, rtol=0)


def test_against_captum_integrated_gradients(rm):
    captum = pytest.importorskip("captum.attr")
    ig = captum.IntegratedGradients(lambda e: own_score(rm, e))
    out = attribute(rm, PROMPTS[:4], RESPONSES[:4], method="integrated_gradients", ig_steps=16)
    for p, r, a in zip(PROMPTS, RESPONSES, out):
        E, B = response_baseline(rm, p, r, "pad")
        ref = ig.attribute(E, baselines=B, n_steps=16, method="riemann_middle").sum(-1)[0, len(p):]
        torch.testing.assert_close(a.raw, ref.detach(), atol=1e-4, rtol=0)


@pytest.fixture
def mean_rm(rm):
    """The same model, scoring the mean of its head over the response (rm train's "response_mean")."""
    rm.config.tokencredit_pooling = "response_mean"
    yield rm
    del rm.config.tokencredit_pooling


def mean_score(model, embeds, prompt_length):
    """The head averaged over the response positions of ONE unpadded sequence [1 or n, L, d] -> [n]."""
    hidden = model.model(inputs_embeds=embeds).last_hidden_state
    return model.score(hidden)[:, prompt_length:, 0].mean(-1)


def test_response_mean_pooling_scores_and_attributes_the_response_mean(mean_rm):
    captum = pytest.importorskip("captum.attr")
    out = attribute(mean_rm, PROMPTS, RESPONSES, baseline="zero", batch_size=3)
    for p, r, a in zip(PROMPTS, RESPONSES, out):
        E, _ = response_baseline(mean_rm, p, r)
        with torch.no_grad():
            assert a.score == pytest.approx(mean_score(mean_rm, E, len(p)).item(), abs=1e-5)
        ixg = captum.InputXGradient(lambda e, n=len(p): mean_score(mean_rm, e, n))
        ref = ixg.attribute(E.requires_grad_()).sum(-1)[0, len(p):]
        torch.testing.assert_close(a.raw, ref.detach(), atol=1e-5, rtol=0)
    assert out[4].raw[-1].item() != 0.0  # unlike "last", a trailing pad id inside the response is read


def test_unknown_pooling_is_named(rm):
    rm.config.tokencredit_pooling = "max"
    try:
        with pytest.raises(ValueError, match=r"field 'config.tokencredit_pooling' must be one of"):
            attribute(rm, [[1]], [[2]])
    finally:
        del rm.config.tokencredit_pooling


def test_integrated_gradients_completeness(rm):
    out = attribute(rm, PROMPTS[:3], RESPONSES[:3], method="integrated_gradients", ig_steps=128)
    gaps = []
    for p, r, a in zip(PROMPTS, RESPONSES, out):
        E, B = response_baseline(rm, p, r, "pad")
        with torch.no_grad():
            gap = (own_score(rm, E) - own_score(rm, B)).item()
        gaps.append(gap)
        assert a.raw.sum().item() == pytest.approx(gap, abs=1e-3)
    assert max(abs(g) for g in gaps) > 1e-2  # the check is not 0 == 0


class LinearRM(nn.Module):
    """Score = <w, sum_t E_t> + bias: linear in the embeddings, causal, same interface as HF."""

    def __init__(self, vocab=50, d=8):
        super().__init__()
        self.config = SimpleNamespace(pad_token_id=PAD, num_labels=1)
        self.embed = nn.Embedding(vocab, d)
        self.score = nn.Linear(d, 1)

    def get_input_embeddings(self):
        return self.embed

    def base_model(self, inputs_embeds, attention_mask):
        return SimpleNamespace(last_hidden_state=(inputs_embeds * attention_mask[..., None]).cumsum(1))


@pytest.mark.parametrize("baseline", ["zero", "pad"])
def test_linear_model_attribution_is_exact(baseline):
    torch.manual_seed(1)
    model = LinearRM()
    prompts, responses = [[1, 2], [3], [4, 5, 6]], [[7, 8, 9], [10, 11], [12]]
    w = model.score.weight[0].detach()
    gxi = attribute(model, prompts, responses, baseline=baseline, batch_size=2)
    ig = attribute(model, prompts, responses, baseline=baseline, method="integrated_gradients", ig_steps=3)
    for p, r, a, b in zip(prompts, responses, gxi, ig):
        E = model.embed.weight[torch.tensor(r)].detach()
        base = model.embed.weight[PAD].detach() if baseline == "pad" else torch.zeros_like(w)
        torch.testing.assert_close(a.raw, (E - base) @ w, atol=1e-6, rtol=0)
        torch.testing.assert_close(b.raw, a.raw, atol=1e-6, rtol=0)
        if baseline == "zero":  # every token's exact share, prompt and bias included, adds up to R
            E_all = model.embed.weight[torch.tensor(p + r)].detach()
            assert a.score == pytest.approx((E_all @ w).sum().item() + model.score.bias.item(), abs=1e-5)


def test_bad_input_names_the_response_and_field(rm):
    with pytest.raises(ValueError, match=r"response 1: field 'response_ids' is empty"):
        attribute(rm, [[1], [2]], [[3], []])
    with pytest.raises(ValueError, match=r"response 0: field 'prompt_ids' has ids outside"):
        attribute(rm, [[1, 999]], [[3]])
    with pytest.raises(ValueError, match="pad_token_id"):
        model = LinearRM()
        model.config.pad_token_id = None
        attribute(model, [[1]], [[2]])
    with pytest.raises(ValueError, match="method"):
        attribute(rm, [[1]], [[2]], method="saliency")


# --- token rewards and advantages --------------------------------------------------------------


RAW = torch.tensor([0.3, -1.2, 2.0, 0.1, 0.4])


@pytest.mark.parametrize("R", [0.8, -0.5])
def test_paper_form_matches_formula_and_sums_to_T_plus_omega_R(R):
    rt = token_rewards(R, RAW, "paper", omega=0.6)
    torch.testing.assert_close(rt, torch.tensor(R + 0.6 * R * softmax(RAW.numpy()), dtype=torch.float32))
    assert rt.sum().item() == pytest.approx((len(RAW) + 0.6) * R, abs=1e-5)


@pytest.mark.parametrize("R", [0.8, -0.5])
def test_completeness_form_sums_to_R(R):
    rho = token_rewards(R, RAW, "completeness")
    assert rho.sum().item() == pytest.approx(R, abs=1e-5)
    torch.testing.assert_close(rho, R * RAW / RAW.sum())


def test_completeness_form_uniform_fallback():
    rho = token_rewards(0.9, torch.tensor([1.0, -1.0, 0.5, -0.5 + 5e-7]), "completeness")
    torch.testing.assert_close(rho, torch.full((4,), 0.9 / 4))
    with pytest.raises(ValueError, match="form"):
        token_rewards(0.9, RAW, "softmax")


def test_p2t_advantages():
    rt = token_rewards(1.0, RAW)
    torch.testing.assert_close(p2t_advantages(0.7, rt, alpha=0.1), 0.7 + 0.1 * rt)
    both = torch.stack([rt, 2 * rt])
    torch.testing.assert_close(p2t_advantages(torch.tensor([0.7, -0.3]), both, alpha=1.0),
                               torch.stack([0.7 + rt, -0.3 + 2 * rt]))
    with pytest.raises(ValueError, match="response_adv"):
        p2t_advantages(torch.tensor([0.7, -0.3]), rt)


def test_near_flat_detection_and_stats():
    flat = torch.tensor([0.0, math.log(1.4), 0.2]) + 7.0  # max/min of softmax = 1.4
    sharp = torch.tensor([0.0, math.log(1.6), 0.2])  # = 1.6
    assert is_near_flat(flat) and not is_near_flat(sharp)
    assert is_near_flat(torch.tensor([3.0]))  # one token: softmax is [1], a pure shift
    assert not is_near_flat(flat, ratio=1.3)
    p = softmax(sharp.numpy())
    assert p.max() / p.min() == pytest.approx(1.6)
    stats = P2TStats()
    for raw in (flat, sharp, flat):
        stats.add(raw)
    assert (stats.responses, stats.near_flat) == (3, 2)
    assert stats.near_flat_fraction == pytest.approx(2 / 3)


# --- bf16 weights (CUDA, and CPU so that the dtype path runs without a GPU) ----------------------

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("method", ["grad_x_input", "integrated_gradients"])
def test_bf16_matches_float32_reference(rm, device, method):
    ref = attribute(rm, PROMPTS, RESPONSES, method=method, ig_steps=8)
    low = LlamaForSequenceClassification(rm.config).eval()
    low.load_state_dict(rm.state_dict())
    low = low.to(device, torch.bfloat16)
    out = attribute(low, PROMPTS, RESPONSES, batch_size=2, method=method, ig_steps=8)
    for a, b in zip(ref, out):
        assert b.raw.device.type == "cpu" and b.raw.dtype == torch.float32
        assert b.score == pytest.approx(a.score, abs=0.05 * max(1.0, abs(a.score)))
        # bf16 keeps ~3 significant digits; seen on CPU: relative error <= 0.09
        assert (b.raw - a.raw).norm() <= 0.2 * a.raw.norm() + 1e-3
