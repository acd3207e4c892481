"""rl_objective (the clipped-surrogate GRPO loss) and aggregate on hand-written tensors with padding masks."""

import math

import pytest
import torch

from scalerl.algorithms.losses import aggregate
from scalerl.algorithms.objective import ObjectiveInputs, rl_objective

# Two sequences, lengths 3 and 1 (row 1 is padded after its first token).
VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_aggregate_token_level():
    # (1 + 2 + 3 + 4) / 4 tokens = 2.5; padded 5 and 6 are ignored.
    assert aggregate(VALUES, MASK, "token").item() == pytest.approx(2.5)


def test_aggregate_sequence_level():
    # row 0: (1+2+3)/3 = 2, row 1: 4/1 = 4 -> (2 + 4) / 2 sequences = 3.
    assert aggregate(VALUES, MASK, "sequence").item() == pytest.approx(3.0)


def test_aggregate_explicit_normalizer():
    # token: sum 10 / 8 = 1.25; sequence: (2 + 4) / 4 = 1.5; a tensor normalizer works too.
    assert aggregate(VALUES, MASK, "token", normalizer=8).item() == pytest.approx(1.25)
    assert aggregate(VALUES, MASK, "sequence", normalizer=4).item() == pytest.approx(1.5)
    assert aggregate(VALUES, MASK, "token", normalizer=torch.tensor(8.0)).item() == pytest.approx(1.25)


def test_aggregate_empty_row_contributes_zero():
    values = torch.cat([VALUES, torch.tensor([[7.0, 8.0, 9.0]])])
    mask = torch.cat([MASK, torch.tensor([[0, 0, 0]])])
    # token: still 10 / 4 = 2.5; sequence: (2 + 4 + 0) / 3 rows = 2.
    assert aggregate(values, mask, "token").item() == pytest.approx(2.5)
    assert aggregate(values, mask, "sequence").item() == pytest.approx(2.0)
    # An all-padding batch gives 0, not NaN (denominator clamped to 1).
    assert aggregate(values, torch.zeros_like(mask), "token").item() == 0.0
    assert aggregate(values, torch.zeros_like(mask), "sequence").item() == 0.0


def test_aggregate_unknown_level_raises():
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(VALUES, MASK, "batch")


def _random_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 5
    logprobs = (-torch.rand(B, T, generator=g) * 3).requires_grad_(True)  # leaf
    old = logprobs.detach() + 0.3 * torch.randn(B, T, generator=g)  # ratio != 1, some clipped
    ref = logprobs.detach() + 0.2 * torch.randn(B, T, generator=g)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
    # Lengths 5, 2, 4, 1: micro-batches [0:2] and [2:4] hold 7 and 5 tokens (unequal).
    lengths = torch.tensor([5, 2, 4, 1])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return logprobs, old, ref, adv, mask


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_normalizer_makes_micro_batches_sum_to_full_batch(level):
    logprobs, old, ref, adv, mask = _random_batch()
    full, _ = rl_objective(ObjectiveInputs(logprobs, old, adv, mask, ref_logprobs=ref), beta=0.05, loss_agg=level)
    (full_grad,) = torch.autograd.grad(full, logprobs)

    # Normalizer: total token count (12) at token level, total sequence count (4) at sequence level.
    norm = float(mask.sum()) if level == "token" else 4.0
    parts = [rl_objective(ObjectiveInputs(logprobs[s], old[s], adv[s], mask[s], ref_logprobs=ref[s]),
                          normalizer=norm, beta=0.05, loss_agg=level)[0] for s in (slice(0, 2), slice(2, 4))]
    split = parts[0] + parts[1]
    (split_grad,) = torch.autograd.grad(split, logprobs)

    assert torch.allclose(split, full, atol=1e-6)
    assert torch.allclose(split_grad, full_grad, atol=1e-7)
    assert full_grad.abs().sum() > 0


def test_without_normalizer_token_level_micro_batches_do_not_match():
    # Sanity check that the invariance test is sensitive: averaging per-micro-batch token means
    # (7 and 5 tokens) is not the mean over all 12 tokens.
    logprobs, old, _, adv, mask = _random_batch()
    full, _ = rl_objective(ObjectiveInputs(logprobs, old, adv, mask))
    a, _ = rl_objective(ObjectiveInputs(logprobs[:2], old[:2], adv[:2], mask[:2]))
    b, _ = rl_objective(ObjectiveInputs(logprobs[2:], old[2:], adv[2:], mask[2:]))
    assert not torch.allclose((a + b) / 2, full, atol=1e-4)


# Per-token clipped surrogate with eps = 0.2, ℓ = −min(ρA, clip(ρ, 0.8, 1.2)A), and its gradient
# w.r.t. log π (dρ/dlogπ = ρ; 0 where the clipped branch is the minimum):
#   ρ=1.5, A=+2: min(3.0, 2.4) = 2.4 (clipped)   -> ℓ = -2.4, grad 0
#   ρ=0.5, A=+2: min(1.0, 1.6) = 1.0             -> ℓ = -1.0, grad -A ρ = -1.0
#   ρ=1.1, A=+2: 2.2 (inside the range)          -> ℓ = -2.2, grad -2.2
#   ρ=1.5, A=-2: min(-3.0, -2.4) = -3.0          -> ℓ = 3.0,  grad +3.0
#   ρ=0.5, A=-2: min(-1.0, -1.6) = -1.6 (clipped) -> ℓ = 1.6,  grad 0
#   ρ=1.1, A=-2: -2.2                            -> ℓ = 2.2,  grad +2.2
@pytest.mark.parametrize(
    "ratio, adv, expected_loss, expected_grad",
    [
        (1.5, 2.0, -2.4, 0.0),
        (0.5, 2.0, -1.0, -1.0),
        (1.1, 2.0, -2.2, -2.2),
        (1.5, -2.0, 3.0, 3.0),
        (0.5, -2.0, 1.6, 0.0),
        (1.1, -2.0, 2.2, 2.2),
    ],
)
def test_clipped_surrogate_single_token(ratio, adv, expected_loss, expected_grad):
    old = torch.tensor([[-1.0]])
    logprobs = (old + math.log(ratio)).requires_grad_(True)
    loss, _ = rl_objective(ObjectiveInputs(logprobs, old, torch.tensor([adv]), torch.ones(1, 1)))
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, abs=1e-5)
    assert logprobs.grad.item() == pytest.approx(expected_grad, abs=1e-5)


def test_clipped_batch_loss_and_stats():
    # Row 0, A=+2, ratios (1.5, 0.5, 1.1); row 1, A=-2, ratios (1.5, 0.5, 3.0) with the 3.0 masked.
    ratios = torch.tensor([[1.5, 0.5, 1.1], [1.5, 0.5, 3.0]])
    old = torch.full((2, 3), -2.0)
    logprobs = old + ratios.log()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    loss, stats = rl_objective(ObjectiveInputs(logprobs, old, torch.tensor([2.0, -2.0]), mask))
    # From the table above: (-2.4 - 1.0 - 2.2 + 3.0 + 1.6) / 5 = -1.0 / 5 = -0.2.
    assert loss.item() == pytest.approx(-0.2, abs=1e-5)
    # clip_frac counts trained tokens where the clipped branch is the minimum (as TRL does):
    # row 0 ρ=1.5 with A>0 and row 1 ρ=0.5 with A<0 -> 2 / 5; the masked 3.0 does not count.
    assert stats["clip_frac"].item() == pytest.approx(0.4)
    assert stats["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 1.1 + 1.5 + 0.5) / 5, abs=1e-5)
    assert stats["ratio_max"].item() == pytest.approx(1.5, abs=1e-5)  # not the masked 3.0
    # approx_kl = mean of ρ - 1 - log ρ over the 5 trained tokens.
    k = [r - 1 - math.log(r) for r in (1.5, 0.5, 1.1, 1.5, 0.5)]
    assert stats["approx_kl"].item() == pytest.approx(sum(k) / 5, abs=1e-5)
    assert "kl" not in stats


def test_zero_advantage_token_is_not_counted_as_clipped():
    # A = 0: ρA and clip(ρ)A are both 0, so nothing is clipped and the loss is 0.
    old = torch.zeros(1, 2)
    logprobs = old + torch.tensor([[math.log(2.0), math.log(0.3)]])
    loss, stats = rl_objective(ObjectiveInputs(logprobs, old, torch.tensor([0.0]), torch.ones(1, 2)))
    assert loss.item() == 0.0
    assert stats["clip_frac"].item() == 0.0


def test_asymmetric_clip_changes_only_the_tokens_between_the_bounds():
    # Ratios with A=+1 (row 0) and A=-1 (row 1); symmetric eps 0.2 vs DAPO eps_low 0.2, eps_high 0.28.
    ratios = torch.tensor([[1.25, 1.30, 0.75], [1.25, 1.30, 0.75]])
    old = torch.full((2, 3), -1.0)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 3)

    def per_token_grads(eps_high):
        logprobs = (old + ratios.log()).requires_grad_(True)
        # normalizer=1: the loss is the plain sum, so each gradient entry is one token's own.
        loss, stats = rl_objective(ObjectiveInputs(logprobs, old, adv, mask), clip_eps_low=0.2, clip_eps_high=eps_high,
                                   normalizer=1.0)
        loss.backward()
        return loss.item(), logprobs.grad, stats["clip_frac"].item()

    loss_sym, grad_sym, frac_sym = per_token_grads(0.2)
    loss_dapo, grad_dapo, frac_dapo = per_token_grads(0.28)
    # Per-token gradient -A ρ where unclipped, 0 where the clipped branch is the minimum:
    #   A=+1: ρ=1.25 clipped at 1.2 (sym) but not at 1.28 (DAPO): 0 -> -1.25
    #         ρ=1.30 clipped in both: 0; ρ=0.75 unclipped (min picks ρA): -0.75 in both
    #   A=-1: ρ=1.25, 1.30 unclipped (min picks ρA): +1.25, +1.30; ρ=0.75 clipped at 0.8: 0
    expected_sym = torch.tensor([[0.0, 0.0, -0.75], [1.25, 1.30, 0.0]])
    expected_dapo = torch.tensor([[-1.25, 0.0, -0.75], [1.25, 1.30, 0.0]])
    assert torch.allclose(grad_sym, expected_sym, atol=1e-5)
    assert torch.allclose(grad_dapo, expected_dapo, atol=1e-5)
    assert (grad_sym != grad_dapo).sum().item() == 1  # only token (0, 0) changed
    # Loss: sym  -(1.2 + 1.2 + 0.75) + (1.25 + 1.30 + 0.8) = 0.2
    #       DAPO -(1.25 + 1.28 + 0.75) + (1.25 + 1.30 + 0.8) = 0.07
    assert loss_sym == pytest.approx(0.2, abs=1e-5)
    assert loss_dapo == pytest.approx(0.07, abs=1e-5)
    # Clipped branch taken (the zero-gradient tokens above): sym 3/6, DAPO 2/6.
    assert frac_sym == pytest.approx(3 / 6)
    assert frac_dapo == pytest.approx(2 / 6)


def test_ratio_one_gradient_is_minus_advantage_over_token_count():
    logprobs = torch.tensor([[-0.5, -1.0, -2.0], [-0.3, -0.7, -0.9]], requires_grad=True)
    adv = torch.tensor([0.5, -1.0])
    loss, stats = rl_objective(ObjectiveInputs(logprobs, logprobs.detach(), adv, MASK))
    loss.backward()
    # n_tokens = 4; grad = -A·mask/4 -> row 0: -0.125 each, row 1: [0.25, 0, 0].
    expected = torch.tensor([[-0.125, -0.125, -0.125], [0.25, 0.0, 0.0]])
    assert torch.allclose(logprobs.grad, expected)
    # loss = -(0.5·3 - 1.0·1) / 4 = -0.125
    assert loss.item() == pytest.approx(-0.125)
    assert stats["clip_frac"].item() == 0.0
    assert stats["ratio_mean"].item() == pytest.approx(1.0)
    assert stats["approx_kl"].item() == pytest.approx(0.0)


def test_ratio_one_sequence_level_gradient():
    logprobs = torch.zeros(2, 3, requires_grad=True)
    inputs = ObjectiveInputs(logprobs, logprobs.detach(), torch.tensor([0.5, -1.0]), MASK)
    loss, _ = rl_objective(inputs, loss_agg="sequence")
    loss.backward()
    # grad = -A·mask/(len_i · B): row 0: -0.5/(3·2) = -1/12, row 1: 1.0/(1·2) = 0.5.
    expected = torch.tensor([[-1 / 12, -1 / 12, -1 / 12], [0.5, 0.0, 0.0]])
    assert torch.allclose(logprobs.grad, expected)


def test_per_token_advantages():
    logprobs = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])  # padded entries are ignored
    loss, _ = rl_objective(ObjectiveInputs(logprobs, logprobs.detach(), adv, MASK))
    # ρ ≡ 1: loss = -(1 + 2 + 3 + 4) / 4 = -2.5
    assert loss.item() == pytest.approx(-2.5)


# Δ = logπ − logπ_ref = (0.5, −0.5, 0.0, 0.3) on the 4 trained tokens (the pad has Δ = 9):
#   k3(Δ) = e^{−Δ} − 1 + Δ: k3(0.5) = e^{-0.5} - 0.5 = 0.1065307, k3(-0.5) = e^{0.5} - 1.5 = 0.1487213,
#   k3(0) = 0 -> mean over 4 tokens = 0.0638130.
DELTA = torch.tensor([[0.5, -0.5, 0.0], [0.0, 9.0, 9.0]])
K3_MEAN = (math.exp(-0.5) - 0.5 + math.exp(0.5) - 1.5) / 4


def test_beta_adds_beta_times_mean_k3():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]], requires_grad=True)
    ref = logprobs.detach() - DELTA
    adv = torch.tensor([0.5, -1.0])
    base, _ = rl_objective(ObjectiveInputs(logprobs, logprobs.detach(), adv, MASK))
    loss, stats = rl_objective(ObjectiveInputs(logprobs, logprobs.detach(), adv, MASK, ref_logprobs=ref), beta=0.1)
    assert stats["kl"].item() == pytest.approx(K3_MEAN, abs=1e-6)
    # base = -0.125 as above; loss = -0.125 + 0.1 · 0.0638130
    assert loss.item() == pytest.approx(-0.125 + 0.1 * K3_MEAN, abs=1e-6)
    assert loss.item() - base.item() == pytest.approx(0.1 * K3_MEAN, abs=1e-6)
    loss.backward()
    # d k3/dΔ = 1 − e^{−Δ}; token (0, 0): -0.5/4 + 0.1 (1 - e^{-0.5}) / 4
    assert logprobs.grad[0, 0].item() == pytest.approx(-0.125 + 0.1 * (1 - math.exp(-0.5)) / 4, abs=1e-6)
    assert logprobs.grad[1, 1].item() == 0.0  # padding gets no gradient


def test_beta_with_k1_estimator():
    logprobs = torch.zeros(2, 3)
    ref = logprobs - DELTA
    loss, stats = rl_objective(ObjectiveInputs(logprobs, logprobs, torch.zeros(2), MASK, ref_logprobs=ref), beta=1.0,
                               kl_estimator="k1")
    # k1 = Δ: mean over trained tokens (0.5 - 0.5 + 0 + 0) / 4 = 0
    assert stats["kl"].item() == pytest.approx(0.0, abs=1e-7)
    assert loss.item() == pytest.approx(0.0, abs=1e-7)


def test_beta_without_reference_raises():
    logprobs = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="ref_logprobs"):
        rl_objective(ObjectiveInputs(logprobs, logprobs, torch.ones(2), MASK), beta=0.1)


def test_reference_with_zero_beta_only_measures_kl():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]])
    old = logprobs + 0.1
    adv = torch.tensor([0.5, -1.0])
    plain, plain_stats = rl_objective(ObjectiveInputs(logprobs, old, adv, MASK))
    measured, stats = rl_objective(ObjectiveInputs(logprobs, old, adv, MASK, ref_logprobs=logprobs - DELTA), beta=0.0)
    assert measured.item() == plain.item()
    assert stats["kl"].item() == pytest.approx(K3_MEAN, abs=1e-6)
    assert "kl" not in plain_stats
