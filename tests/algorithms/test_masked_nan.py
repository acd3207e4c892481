"""Masked reductions ignore whatever sits under a zero mask (NaN, inf): each reduction is given a
NaN (or inf) at a masked position and must return the number computed from the trained positions
alone. Multiplying by the mask would give NaN (NaN · 0 = NaN); selecting with torch.where does not."""

import math

import pytest
import torch

from scalerl.algorithms.advantages import gae, masked_moments, whiten
from scalerl.algorithms.kl import kl_estimate, masked_kl
from scalerl.algorithms.losses import aggregate, importance_log_ratio, masked_mean, off_policy_sequence_mask, policy_stats
from scalerl.algorithms.objective import ObjectiveInputs, rl_objective

MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])
NAN = float("nan")
# Trained values 1, 2 | 4; the masked ones are NaN and inf.
VALUES = torch.tensor([[1.0, 2.0, NAN], [4.0, math.inf, NAN]])


@pytest.mark.parametrize("level, expected", [
    ("token", (1 + 2 + 4) / 3),  # Σ / 3 trained tokens
    ("sequence", (1.5 + 4.0) / 2),  # row means 1.5 and 4, over 2 rows
    ("prompt", (1 + 2 + 4) / 3),  # one group of both rows: its token mean
    ("constant", (1 + 2 + 4) / (2 * 3)),  # Σ / (B · max_new_tokens)
])
def test_aggregate_ignores_nan_under_the_mask(level, expected):
    out = aggregate(VALUES, MASK, level, group_ids=torch.tensor([0, 0]), max_new_tokens=3)
    assert out.item() == pytest.approx(expected)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "abs", "k3+"])
def test_masked_kl_ignores_nan_under_the_mask(estimator):
    logprobs = torch.tensor([[-1.0, -2.0, NAN], [-0.5, NAN, math.inf]])
    ref = torch.tensor([[-1.5, -1.0, -1.0], [-0.5, -1.0, NAN]])
    kl = kl_estimate(logprobs, ref, estimator)  # NaN at the masked positions
    clean = kl_estimate(torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-1.5, -1.0, -0.5]), estimator)
    assert masked_kl(kl, MASK, "token").item() == pytest.approx(clean.mean().item())
    # per completion: row 0 sums its two tokens, row 1 its one; mean over the 2 rows
    assert masked_kl(kl, MASK, "sequence").item() == pytest.approx((clean[0] + clean[1] + clean[2]).item() / 2)


def test_diagnostic_reductions_ignore_nan_under_the_mask():
    assert masked_mean(VALUES, MASK).item() == pytest.approx(7 / 3)
    logprobs = torch.tensor([[-1.0, -1.0, NAN], [-1.0, NAN, NAN]])
    old = torch.tensor([[-1.0, -1.0, 0.0], [-1.0, NAN, math.inf]])
    stats = policy_stats(logprobs, old, torch.zeros(2, 3, dtype=torch.bool), MASK)
    assert stats["approx_kl"].item() == 0.0 and stats["ratio_mean"].item() == 1.0
    # GSPO's sequence ratio: row 0 mean of (0, 0) = 0, row 1 = 0
    assert importance_log_ratio(logprobs, old, MASK, "sequence").abs().max().item() == 0.0
    keep = off_policy_sequence_mask(torch.tensor([-1.0, -1.0]), logprobs, old + 1.0, MASK, threshold=0.5)
    assert keep.flatten().tolist() == [0.0, 0.0]  # drift 1 on the trained tokens > 0.5: dropped, not NaN


def test_advantage_reductions_ignore_nan_under_the_mask():
    n, total, squares = masked_moments(VALUES, MASK).tolist()
    assert (n, total, squares) == (3.0, 7.0, 21.0)
    w = whiten(VALUES, MASK)  # mean 7/3, Bessel var ((4/3)² + (1/3)² + (5/3)²) / 2 = 7/3
    assert w[0, 0].item() == pytest.approx((1 - 7 / 3) / math.sqrt(7 / 3), rel=1e-6)
    assert torch.isfinite(w).all() and w[1, 1].item() == 0.0
    adv, ret = gae(torch.tensor([[0.0, 1.0, NAN], [1.0, NAN, NAN]]), torch.tensor([[0.5, 0.5, NAN], [0.0, math.inf, NAN]]),
                   MASK, gamma=1.0, lam=1.0)
    assert adv.tolist() == [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]  # Â = return − V: (1 − 0.5, 1 − 0.5 | 1 − 0)
    assert torch.isfinite(ret).all()


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "abs", "k3+"])
def test_rl_objective_loss_and_gradient_ignore_nan_under_the_mask(estimator):
    """Loss and gradient with NaN/inf in every input at masked positions equal those of the clean batch."""
    def run(poison):
        fill = (lambda t: torch.where(MASK.bool(), t, torch.full_like(t, poison)))
        logprobs = fill(torch.tensor([[-1.0, -0.7, -0.3], [-2.0, -0.2, -0.1]])).requires_grad_(True)
        entropy = fill(torch.tensor([[0.5, 0.6, 0.7], [0.8, 0.9, 1.0]])).requires_grad_(True)
        x = ObjectiveInputs(logprobs, fill(torch.tensor([[-1.1, -0.5, -0.3], [-1.8, 0.0, 0.0]])), torch.tensor([1.0, -0.5]),
                            MASK, ref_logprobs=fill(torch.tensor([[-1.3, -0.9, 0.0], [-2.2, 0.0, 0.0]])),
                            sampler_logprobs=fill(torch.tensor([[-1.0, -0.6, 0.0], [-1.9, 0.0, 0.0]])), entropy=entropy)
        loss, stats = rl_objective(x, beta=0.1, kl_estimator=estimator, entropy_coef=0.01, tis_cap=2.0,
                                   off_policy_mask=0.5, kl_with_ratio=True, loss_agg="sequence")
        loss.backward()
        return loss, logprobs.grad * MASK, entropy.grad * MASK, stats
    clean, dirty = run(0.0), run(NAN)
    assert torch.isfinite(dirty[0]) and dirty[0].item() == pytest.approx(clean[0].item())
    assert torch.isfinite(dirty[1]).all() and torch.allclose(dirty[1], clean[1])
    assert torch.allclose(dirty[2], clean[2])
    assert all(torch.isfinite(v) for v in dirty[3].values())


def test_abs_and_k3_plus_estimators_by_hand():
    # Δ = log π − log π_ref = 0.5:  abs = 0.5;  k3 = e^{−0.5} − 1 + 0.5 = 0.1065307;  k2 = 0.125
    logprobs = torch.tensor([-0.5], requires_grad=True)
    ref = torch.tensor([-1.0])
    assert kl_estimate(logprobs, ref, "abs").item() == pytest.approx(0.5)
    k3_plus = kl_estimate(logprobs, ref, "k3+")
    assert k3_plus.item() == pytest.approx(math.exp(-0.5) - 0.5, rel=1e-6)  # k3's value
    k3_plus.backward()
    assert logprobs.grad.item() == pytest.approx(0.5)  # k2's gradient, Δ; k3's would be 1 − e^{−0.5} = 0.3935
    g = torch.tensor([-1.5], requires_grad=True)  # Δ = −0.5: abs's gradient is sign(Δ) = −1
    kl_estimate(g, ref, "abs").backward()
    assert g.grad.item() == -1.0
