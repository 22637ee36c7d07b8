import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from tokencredit.pipeline.credit.divergence import js_divergence, js_divergence_naive

V = 97


def scipy_js(logits_p: torch.Tensor, logits_q: torch.Tensor) -> np.ndarray:
    """JS per row in nats, float64, from scipy: jensenshannon is the square root of the divergence."""
    p = torch.softmax(logits_p.double(), -1).reshape(-1, logits_p.shape[-1]).numpy()
    q = torch.softmax(logits_q.double(), -1).reshape(-1, logits_q.shape[-1]).numpy()
    return np.array([jensenshannon(a, b) ** 2 for a, b in zip(p, q)]).reshape(logits_p.shape[:-1])


def logit_pairs(seed: int, shape=(3, 17, V)):
    g = torch.Generator().manual_seed(seed)
    p, q = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    near_zero = p.clone()
    near_zero[..., ::3] -= 60.0  # probabilities around e^-60, far below float32's epsilon
    return {
        "random": (p, q),
        "peaked": (50 * p, 50 * q),
        "near_zero": (near_zero, near_zero + 0.3 * q),
        "close": (p, p + 1e-3 * q),
    }


@pytest.mark.parametrize("kind", ["random", "peaked", "near_zero", "close"])
def test_matches_scipy(kind):
    p, q = logit_pairs(0)[kind]
    expected = scipy_js(p, q)
    got = js_divergence(p, q, chunk_size=5)
    assert got.dtype == torch.float32 and got.shape == p.shape[:-1]
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-5, rtol=0)
    if kind == "close":  # tiny divergences keep their relative accuracy too
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-3)


def test_hard_zero_probabilities_match_scipy():
    p, q = logit_pairs(1)["random"]
    p[..., :10] = -math.inf  # 0 * log 0 = 0, both sides zero included
    q[..., 5:20] = -math.inf
    np.testing.assert_allclose(js_divergence(p, q).numpy(), scipy_js(p, q), atol=1e-5, rtol=0)


def test_identical_inputs_give_exactly_zero():
    for kind, (p, _) in logit_pairs(2).items():
        assert torch.equal(js_divergence(p, p.clone()), torch.zeros(p.shape[:-1])), kind


def test_symmetric_and_bounded_by_ln2():
    p, q = logit_pairs(3)["peaked"]
    pq, qp = js_divergence(p, q), js_divergence(q, p)
    torch.testing.assert_close(pq, qp, atol=1e-7, rtol=0)
    disjoint_p = torch.full((4, V), -math.inf)
    disjoint_p[:, 0] = 0.0
    disjoint_q = torch.full((4, V), -math.inf)
    disjoint_q[:, 1] = 0.0
    assert (pq <= math.log(2)).all() and (pq >= 0).all()
    torch.testing.assert_close(js_divergence(disjoint_p, disjoint_q), torch.full((4,), math.log(2)))


@pytest.mark.parametrize("chunk_size", [1, 4, 7, 17, 51, 128])
def test_chunked_equals_naive(chunk_size):
    p, q = logit_pairs(4)["random"]  # 3 * 17 = 51 positions: 4 and 7 do not divide them
    torch.testing.assert_close(js_divergence(p, q, chunk_size=chunk_size), js_divergence_naive(p, q),
                               atol=1e-6, rtol=0)


def test_naive_matches_scipy():
    p, q = logit_pairs(5)["random"]
    np.testing.assert_allclose(js_divergence_naive(p, q).numpy(), scipy_js(p, q), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_input(dtype):
    p, q = logit_pairs(6)["random"]
    p, q = p.to(dtype), q.to(dtype)
    got = js_divergence(p, q, chunk_size=8)
    assert got.dtype == torch.float32
    # the reference sees exactly the rounded logits, so only float32 arithmetic differs
    np.testing.assert_allclose(got.numpy(), scipy_js(p.float(), q.float()), atol=1e-5, rtol=0)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="differ in shape"):
        js_divergence(torch.zeros(2, 5), torch.zeros(2, 6))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_matches_cpu():
    p, q = logit_pairs(7, shape=(2, 300, 1000))["peaked"]
    p, q = p.bfloat16(), q.bfloat16()
    got = js_divergence(p.cuda(), q.cuda(), chunk_size=64)
    assert got.dtype == torch.float32 and got.is_cuda
    np.testing.assert_allclose(got.cpu().numpy(), scipy_js(p.float(), q.float()), atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_chunked_memory_is_bounded():
    g = torch.Generator(device="cuda").manual_seed(0)
    B, T, V_big, chunk = 4, 2048, 8192, 64
    p = torch.randn(B, T, V_big, device="cuda", generator=g).bfloat16()
    q = torch.randn(B, T, V_big, device="cuda", generator=g).bfloat16()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    js_divergence(p, q, chunk_size=chunk)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    # a float32 [B, T, V] copy alone would be 256 MiB; the chunks need a few MiB
    assert extra < 32 * chunk * V_big * 4, extra
