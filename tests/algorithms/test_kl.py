"""KL estimators k1, k2, k3 against their formulas and a Monte-Carlo estimate of KL(p‖q)."""

import math

import pytest
import torch

from scalerl.algorithms.kl import kl_estimate, measured_kl

DELTAS = [-2.0, -0.5, 0.0, 0.3, 1.0, 3.0]


def _estimate(delta, estimator, dtype=torch.float64):
    logprobs = torch.tensor([delta], dtype=dtype)
    return kl_estimate(logprobs, torch.zeros_like(logprobs), estimator)


@pytest.mark.parametrize("delta", DELTAS)
def test_formulas(delta):
    # k1 = Δ, k2 = Δ²/2, k3 = e^{−Δ} − 1 + Δ
    assert _estimate(delta, "k1").item() == pytest.approx(delta)
    assert _estimate(delta, "k2").item() == pytest.approx(0.5 * delta**2)
    assert _estimate(delta, "k3").item() == pytest.approx(math.exp(-delta) - 1 + delta)


def test_hand_values_and_shape():
    # logπ = [-1, -2], logπ_ref = [-2, -1]: Δ = [1, -1]
    # k3(1) = e^{-1} = 0.3678794, k3(-1) = e - 2 = 0.7182818
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-2.0, -1.0]])
    k3 = kl_estimate(lp, ref)  # k3 is the default
    assert k3.shape == (1, 2)
    assert torch.allclose(k3, torch.tensor([[0.3678794, 0.7182818]]), atol=1e-6)
    assert torch.allclose(kl_estimate(lp, ref, "k1"), torch.tensor([[1.0, -1.0]]))
    assert torch.allclose(kl_estimate(lp, ref, "k2"), torch.tensor([[0.5, 0.5]]))


def test_k1_can_be_negative_k2_k3_nonnegative():
    delta = torch.linspace(-10, 10, 201)
    ref = torch.zeros_like(delta)
    assert (kl_estimate(delta, ref, "k1") < 0).any()
    assert (kl_estimate(delta, ref, "k2") >= 0).all()
    assert (kl_estimate(delta, ref, "k3") >= 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_k3_finite_for_extreme_deltas(dtype):
    # e^{1000} overflows any float; the estimate must stay finite, >= 0, and its gradient finite.
    lp = torch.tensor([-1000.0, -100.0, -10.0, 10.0, 100.0, 1000.0], dtype=dtype, requires_grad=True)
    k3 = kl_estimate(lp, torch.zeros_like(lp), "k3")
    assert torch.isfinite(k3).all()
    assert (k3 >= 0).all()
    # Still growing away from 0 on both sides (up to the clamp).
    assert k3[0] >= k3[2] and k3[5] >= k3[3]
    k3.sum().backward()
    assert torch.isfinite(lp.grad).all()


def test_unknown_estimator_raises():
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")


def test_monte_carlo_matches_exact_kl():
    p = torch.tensor([0.10, 0.20, 0.30, 0.25, 0.15], dtype=torch.float64)
    q = torch.tensor([0.30, 0.10, 0.20, 0.20, 0.20], dtype=torch.float64)
    exact = (p * (p / q).log()).sum().item()  # KL(p‖q) ≈ 0.1524
    n = 200_000
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(p, n, replacement=True, generator=g)  # tokens sampled from p
    logprobs, ref = p.log()[x], q.log()[x]
    for estimator in ("k1", "k3"):
        k = kl_estimate(logprobs, ref, estimator)
        # Both are unbiased for KL(p‖q) when tokens come from p; 5 standard errors of the mean.
        tol = 5 * k.std().item() / math.sqrt(n)
        assert abs(k.mean().item() - exact) < tol, (estimator, k.mean().item(), exact, tol)
        assert tol < 0.01  # the test is tight enough to mean something
    # k2 is biased: E[Δ²/2] differs from KL by far more than its standard error here.
    k2 = kl_estimate(logprobs, ref, "k2")
    assert abs(k2.mean().item() - exact) > 5 * k2.std().item() / math.sqrt(n)


def test_measured_kl_token_and_sequence_levels():
    kl = torch.tensor([[0.2, 0.4, 9.0], [1.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # row 2 filtered out entirely
    # token: (0.2 + 0.4 + 1.0) / 3 tokens = 0.5333; sequence: rows 0 and 1 only, (0.6 + 1.0) / 2 = 0.8
    assert measured_kl(kl, mask, "token") == pytest.approx(1.6 / 3)
    assert measured_kl(kl, mask, "sequence") == pytest.approx(0.8)
    assert measured_kl(kl, torch.zeros_like(mask), "sequence") == 0.0
    with pytest.raises(ValueError, match="token or sequence"):
        measured_kl(kl, mask, "batch")
