"""rl_objective's features one at a time, on hand-written tensors: GSPO sequence ratios, the δ
two-sided clip, the off-policy sequence mask, truncated completions, Dr. GRPO's constant
normaliser, the entropy bonus, the ratio-corrected KL, truncated IS and the PPO value term.
Each expected number is worked out in a comment."""

import math

import pytest
import torch

from scalerl.algorithms.losses import aggregate, aggregation_units, mask_truncated, off_policy_sequence_mask
from scalerl.algorithms.objective import ObjectiveInputs, rl_objective

# Two completions, lengths 3 and 1 (row 1 is padded after its first token).
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def _with_ratios(log_ratios, old=-1.0):
    """(logprobs leaf with grad, old_logprobs) with log π_θ − log π_old = log_ratios."""
    log_ratios = torch.as_tensor(log_ratios, dtype=torch.float32)
    old_logprobs = torch.full_like(log_ratios, old)
    return (old_logprobs + log_ratios).requires_grad_(True), old_logprobs


# ---------------------------------------------------------------------------------------------
# GSPO: importance_level="sequence"

# Log ratios: row 0 (0.3, −0.1, 0.1) -> mean 0.1, s_0 = e^0.1 = 1.1051709; row 1 (0.5 | pads 9.0)
# -> s_1 = e^0.5 = 1.6487213 (the pads do not enter the mean). A = (+1, −1), ε = 0.2:
#   row 0: s_0 inside [0.8, 1.2]          -> ℓ = −1.1051709 on each of its 3 tokens
#   row 1: min(−1.6487, −1.2) = −1.6487   -> ℓ = +1.6487213 (not clipped)
#   token mean: (−3 · 1.1051709 + 1.6487213) / 4 = −0.4166979
# Token level instead: row 0 ρ = (1.3498588 -> clipped to 1.2, 0.9048374, 1.1051709):
#   (−1.2 − 0.9048374 − 1.1051709 + 1.6487213) / 4 = −0.3903218
GSPO_LOG_RATIOS = [[0.3, -0.1, 0.1], [0.5, 9.0, 9.0]]
GSPO_ADV = torch.tensor([1.0, -1.0])


def test_gspo_sequence_ratio_by_hand():
    logprobs, old = _with_ratios(GSPO_LOG_RATIOS)
    loss, stats = rl_objective(ObjectiveInputs(logprobs, old, GSPO_ADV, MASK), importance_level="sequence")
    assert loss.item() == pytest.approx(-0.4166979, abs=1e-6)
    assert stats["clip_frac"].item() == 0.0
    # ratio_mean is over tokens of the ratio used: (3 · 1.1051709 + 1.6487213) / 4 = 1.2410585
    assert stats["ratio_mean"].item() == pytest.approx(1.2410585, abs=1e-6)
    assert stats["ratio_max"].item() == pytest.approx(1.6487213, abs=1e-6)
    loss.backward()
    # L = (−3 s_0 + s_1) / 4 with ∂s_i/∂log π_it = s_i / |y_i|:
    #   row 0: −3 · (s_0 / 3) / 4 = −s_0 / 4 = −0.2762927 on every token (one shared ratio);
    #   row 1: s_1 / 4 = 0.4121803; pads 0.
    expected = torch.tensor([[-0.2762927] * 3, [0.4121803, 0.0, 0.0]])
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)

    token_logprobs, _ = _with_ratios(GSPO_LOG_RATIOS)
    token_loss, token_stats = rl_objective(ObjectiveInputs(token_logprobs, old, GSPO_ADV, MASK))
    assert token_loss.item() == pytest.approx(-0.3903218, abs=1e-6)
    assert token_stats["clip_frac"].item() == pytest.approx(1 / 4)  # row 0's ρ = 1.35


def test_gspo_with_cispo_weights_every_token_by_the_sequence_ratio():
    logprobs, old = _with_ratios(GSPO_LOG_RATIOS)
    loss, stats = rl_objective(ObjectiveInputs(logprobs, old, GSPO_ADV, MASK), policy_loss="cispo", eps_max=1.5,
                               importance_level="sequence")
    loss.backward()
    # ∂L/∂log π_it = −sg(min(s_i, 1.5)) A_i / 4: row 0 −1.1051709 / 4 = −0.2762927, row 1 +1.5 / 4 = 0.375.
    expected = torch.tensor([[-0.2762927] * 3, [0.375, 0.0, 0.0]])
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(1 / 4)  # row 1's one token: s_1 = 1.65 > 1.5


# ---------------------------------------------------------------------------------------------
# δ two-sided clip (INTELLECT-2)

# Per-token A = (−1, +1, −1), ρ = (4, 4, 2), ε = 0.2, δ = 3, normalizer 1 (loss = plain sum):
#   t0: A<0, ρ=4 > δ: min(min(4,3)·(−1), 1.2·(−1)) = min(−3, −1.2) = −3 -> ℓ = 3 = −δA, grad 0
#   t1: A>0, ρ=4: min(3, 1.2) = 1.2 -> ℓ = −1.2, grad 0 (ε-clipped either way)
#   t2: A<0, ρ=2 < δ: min(−2, −1.2) = −2 -> ℓ = 2, grad −Aρ = 2
# With δ = None t0 is min(−4, −1.2) = −4 -> ℓ = 4 = −ρA, grad 4.
DELTA_RATIOS = [[math.log(4.0), math.log(4.0), math.log(2.0)]]
DELTA_ADV = torch.tensor([[-1.0, 1.0, -1.0]])


@pytest.mark.parametrize(
    "delta, expected_loss, expected_grad, expected_clip_frac",
    [(3.0, 3.0 - 1.2 + 2.0, [0.0, 0.0, 2.0], 2 / 3), (None, 4.0 - 1.2 + 2.0, [4.0, 0.0, 2.0], 1 / 3)],
)
def test_delta_two_sided_clip(delta, expected_loss, expected_grad, expected_clip_frac):
    logprobs, old = _with_ratios(DELTA_RATIOS)
    loss, stats = rl_objective(ObjectiveInputs(logprobs, old, DELTA_ADV, torch.ones(1, 3)), delta=delta, normalizer=1.0)
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, abs=1e-5)
    assert torch.allclose(logprobs.grad, torch.tensor([expected_grad]), atol=1e-5)
    # clip_frac counts tokens whose gradient a clip removed: t1 always, t0 only under δ.
    assert stats["clip_frac"].item() == pytest.approx(expected_clip_frac)


def test_delta_is_for_the_clip_loss_only():
    logprobs, old = _with_ratios(DELTA_RATIOS)
    with pytest.raises(ValueError, match="delta"):
        rl_objective(ObjectiveInputs(logprobs, old, DELTA_ADV, torch.ones(1, 3)), policy_loss="cispo", delta=3.0)


# ---------------------------------------------------------------------------------------------
# Off-policy sequence mask (DeepSeek-V3.2)

# ρ ≡ 1 (log π_θ = log π_old = −1), so ℓ_it = −A_i. Threshold 0.1, KL_i = mean_t(log π_sampler − log π_θ):
#   row 0: A = −1,  sampler +0.5 on both tokens  -> KL 0.5 > 0.1 and A < 0: dropped
#   row 1: A = +2,  sampler +0.5                 -> KL 0.5, but A ≥ 0: kept
#   row 2: A = −0.5, sampler +0.05               -> KL 0.05 ≤ 0.1: kept
# Token mean over 6 tokens: (0 [row 0 dropped] − 2·2 + 0.5·2) / 6 = −0.5; unmasked it would be
# (1·2 − 4 + 1) / 6 = −1/6. Dropped: 1 of 3 completions.
OPM_ADV = torch.tensor([-1.0, 2.0, -0.5])
OPM_SHIFT = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.05, 0.05]])


def test_off_policy_mask_by_hand():
    logprobs = torch.full((3, 2), -1.0, requires_grad=True)
    inputs = ObjectiveInputs(logprobs, logprobs.detach(), OPM_ADV, torch.ones(3, 2),
                             sampler_logprobs=logprobs.detach() + OPM_SHIFT)
    loss, stats = rl_objective(inputs, off_policy_mask=0.1)
    assert loss.item() == pytest.approx(-0.5, abs=1e-6)
    assert stats["off_policy_masked_frac"].item() == pytest.approx(1 / 3)
    loss.backward()
    # ∂L/∂log π = −A_i · keep_i / 6: row 0 0, row 1 −2/6, row 2 +0.5/6.
    expected = torch.tensor([[0.0, 0.0], [-2 / 6, -2 / 6], [0.5 / 6, 0.5 / 6]])
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)

    unmasked, stats = rl_objective(inputs)
    assert unmasked.item() == pytest.approx(-1 / 6, abs=1e-6)
    assert "off_policy_masked_frac" not in stats


def test_off_policy_mask_uses_old_logprobs_without_a_sampler():
    # No sampler_logprobs: π_old stands in (as TRL does). Row 0's π_old is 0.5 above π_θ -> KL 0.5.
    logprobs = torch.full((3, 2), -1.0)
    loss, stats = rl_objective(ObjectiveInputs(logprobs, logprobs + OPM_SHIFT, OPM_ADV, torch.ones(3, 2)),
                               off_policy_mask=0.1)
    assert stats["off_policy_masked_frac"].item() == pytest.approx(1 / 3)


def test_off_policy_mask_ignores_padding_and_broadcasts_per_token_advantages():
    logprobs = torch.zeros(2, 3)
    # Row 0: the trained token has drift 0.05; the padded ones 10 must not enter the mean -> kept.
    sampler = torch.tensor([[0.05, 10.0, 10.0], [0.5, 0.5, 0.5]])
    one_token = torch.tensor([[1, 0, 0], [1, 0, 0]])
    keep = off_policy_sequence_mask(torch.tensor([-1.0, -1.0]), logprobs, sampler, one_token, threshold=0.1)
    # Row 1's trained token has drift 0.5 > 0.1 with A < 0 -> dropped.
    assert keep.tolist() == [[1.0], [0.0]]
    # Per-token advantages: each token's own sign, the row's KL (TRL's broadcasting).
    adv = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, 2.0, 0.0]])
    keep = off_policy_sequence_mask(adv, logprobs, sampler, torch.ones(2, 3), threshold=0.1)
    # Row 0's KL is now (0.05 + 10 + 10) / 3 > 0.1 with all A < 0 -> all dropped; row 1 keeps A ≥ 0.
    assert keep.tolist() == [[0.0, 0.0, 0.0], [0.0, 1.0, 1.0]]


# ---------------------------------------------------------------------------------------------
# mask_truncated


def test_mask_truncated_by_hand():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    out = mask_truncated(mask, torch.tensor([False, True, False]))
    # Row 1 hit the length limit: all its tokens leave the loss; the others are untouched.
    assert out.tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    assert out.dtype == mask.dtype


# ---------------------------------------------------------------------------------------------
# Dr. GRPO: loss_agg="constant"


def test_constant_aggregation_by_hand():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    # Σ m v = 1 + 2 + 3 + 4 = 10, over B · max_new_tokens = 2 · 4 = 8 -> 1.25; normalizer 5 -> 2.
    assert aggregate(values, MASK, "constant", max_new_tokens=4).item() == pytest.approx(1.25)
    assert aggregate(values, MASK, "constant", normalizer=5).item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        aggregate(values, MASK, "constant")

    # Through rl_objective with ρ ≡ 1, ℓ = −A: −(0.5 · 3 − 1 · 1) / 8 = −0.0625 and
    # ∂L/∂log π = −A m / 8: row 0 −0.0625, row 1 +0.125; no completion's length divides its tokens.
    logprobs = torch.zeros(2, 3, requires_grad=True)
    loss, _ = rl_objective(ObjectiveInputs(logprobs, logprobs.detach(), torch.tensor([0.5, -1.0]), MASK),
                           loss_agg="constant", max_new_tokens=4)
    loss.backward()
    assert loss.item() == pytest.approx(-0.0625)
    assert torch.allclose(logprobs.grad, torch.tensor([[-0.0625] * 3, [0.125, 0.0, 0.0]]))


def _random_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 5
    logprobs = (-torch.rand(B, T, generator=g) * 3).requires_grad_(True)
    old = logprobs.detach() + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
    lengths = torch.tensor([5, 2, 4, 1])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return logprobs, old, adv, mask


def test_constant_aggregation_micro_batch_invariance():
    logprobs, old, adv, mask = _random_batch()
    full, _ = rl_objective(ObjectiveInputs(logprobs, old, adv, mask), loss_agg="constant", max_new_tokens=5)
    (full_grad,) = torch.autograd.grad(full, logprobs)
    # The global normaliser B · max_new_tokens = 4 · 5 = 20, the sum of the micro-batches' units.
    parts = (slice(0, 1), slice(1, 4))  # uneven micro-batches: 1 and 3 rows
    norm = sum(aggregation_units(mask[s], "constant", max_new_tokens=5) for s in parts)
    assert norm.item() == 20
    split = sum(rl_objective(ObjectiveInputs(logprobs[s], old[s], adv[s], mask[s]), loss_agg="constant",
                             normalizer=norm)[0] for s in parts)
    (split_grad,) = torch.autograd.grad(split, logprobs)
    assert torch.allclose(split, full, atol=1e-6)
    assert torch.allclose(split_grad, full_grad, atol=1e-7)
    # Sensitivity: each micro-batch's own B_m · 5 (5 and 15) does not sum to the full loss.
    own = sum(rl_objective(ObjectiveInputs(logprobs[s], old[s], adv[s], mask[s]), loss_agg="constant",
                           max_new_tokens=5)[0] for s in parts)
    assert not torch.allclose(own, full, atol=1e-4)


def test_aggregation_units_by_hand():
    # Lengths 3, 1, 2, 0; groups 0, 0, 1, 1.
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
    groups = torch.tensor([0, 0, 1, 1])
    assert aggregation_units(mask, "token").item() == 6
    assert aggregation_units(mask, "sequence").item() == 3  # row 3 has no trained token
    assert aggregation_units(mask, "prompt", groups).item() == 2
    assert aggregation_units(mask, "constant", max_new_tokens=5).item() == 20  # 4 rows · 5, empty rows too
    levels = ("token", "sequence", "prompt", "constant")
    assert all(aggregation_units(mask, level, groups, 5).dim() == 0 for level in levels)


# ---------------------------------------------------------------------------------------------
# Entropy bonus

# H = (1, 2, 3 | 4, pads 9) on MASK: token mean (1 + 2 + 3 + 4) / 4 = 2.5. (A sequence mean would be
# (2 + 4) / 2 = 3, and so would the prompt mean with one group per row.) coef 0.1 -> bonus −0.25.
ENTROPY = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])


@pytest.mark.parametrize("level", ["sequence", "prompt", "token"])
def test_entropy_bonus_is_a_token_mean_at_every_level(level):
    logprobs = torch.zeros(2, 3)
    entropy = ENTROPY.clone().requires_grad_(True)
    inputs = ObjectiveInputs(logprobs, logprobs - 0.1, torch.tensor([0.5, -1.0]), MASK, group_ids=torch.tensor([0, 1]),
                             entropy=entropy)
    base, _ = rl_objective(inputs, loss_agg=level)
    loss, stats = rl_objective(inputs, loss_agg=level, entropy_coef=0.1)
    assert (loss - base).item() == pytest.approx(-0.1 * 2.5, abs=1e-6)  # not −0.1 · 3
    assert stats["entropy"].item() == pytest.approx(2.5)
    loss.backward()
    # ∂L/∂H = −0.1 · m / 4 tokens = −0.025 on trained tokens, 0 on pads.
    assert torch.allclose(entropy.grad, torch.tensor([[-0.025] * 3, [-0.025, 0.0, 0.0]]))


def test_entropy_bonus_token_normalizer():
    logprobs = torch.zeros(2, 3)
    inputs = ObjectiveInputs(logprobs, logprobs, torch.zeros(2), MASK, entropy=ENTROPY)
    # ρ ≡ 1 and A = 0: the loss is the bonus alone, −0.1 · 10 / 8 global tokens = −0.125.
    loss, _ = rl_objective(inputs, loss_agg="sequence", entropy_coef=0.1, token_normalizer=8)
    assert loss.item() == pytest.approx(-0.125)


# ---------------------------------------------------------------------------------------------
# KL with the importance ratio (DeepSeek-V3.2's unbiased KL, TRL's use_bias_correction_kl)

# One completion, 2 tokens, ρ = (2, 0.5), Δ = log π_θ − log π_ref = (0.5, −0.5), A = 0 (no policy term):
#   k3 = e^{−Δ} − 1 + Δ = (0.1065307, 0.1487213); k3·ρ = (0.2130613, 0.0743607), mean 0.1437110
#   loss = β · mean = 0.1 · 0.1437110 = 0.0143711   (without ρ: 0.1 · 0.1276260 = 0.0127626)
# Gradient: d(k3·ρ)/dlog π = (1 − e^{−Δ})ρ + k3·ρ = Δ·ρ -> (1.0, −0.25), times β / 2 = (0.05, −0.0125).
def _kl_inputs():
    logprobs, old = _with_ratios([[math.log(2.0), math.log(0.5)]])
    ref = logprobs.detach() - torch.tensor([[0.5, -0.5]])
    return ObjectiveInputs(logprobs, old, torch.zeros(1), torch.ones(1, 2), ref_logprobs=ref)


def test_kl_with_ratio_by_hand():
    inputs = _kl_inputs()
    loss, stats = rl_objective(inputs, beta=0.1, kl_with_ratio=True)
    assert loss.item() == pytest.approx(0.0143711, abs=1e-6)
    assert stats["kl"].item() == pytest.approx(0.1437110, abs=1e-6)
    assert stats["kl_seq"].item() == pytest.approx(0.2874220, abs=1e-6)  # the completion's sum
    loss.backward()
    assert torch.allclose(inputs.logprobs.grad, torch.tensor([[0.05, -0.0125]]), atol=1e-6)
    plain, _ = rl_objective(_kl_inputs(), beta=0.1)
    assert plain.item() == pytest.approx(0.0127626, abs=1e-6)
    # The ratio is taken before the δ cap (as in TRL): δ = 1.5 < ρ = 2 leaves the KL term alone.
    capped, _ = rl_objective(_kl_inputs(), beta=0.1, kl_with_ratio=True, delta=1.5)
    assert capped.item() == pytest.approx(0.0143711, abs=1e-6)


def test_kl_seq_averages_completions_with_trained_tokens():
    logprobs = torch.zeros(3, 3)
    ref = logprobs - torch.tensor([[1.0, 1.0, 1.0], [2.0, 5.0, 5.0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    _, stats = rl_objective(ObjectiveInputs(logprobs, logprobs, torch.zeros(3), mask, ref_logprobs=ref),
                            kl_estimator="k1")
    # k1 = Δ: token mean (1 + 1 + 1 + 2) / 4 = 1.25; per completion (3, 2), row 2 is empty -> 2.5.
    assert stats["kl"].item() == pytest.approx(1.25)
    assert stats["kl_seq"].item() == pytest.approx(2.5)


# ---------------------------------------------------------------------------------------------
# Truncated importance sampling

# π_old / π_sampler = (3, 0.5, 1 | pad 10), cap 2 -> w = (2, 0.5, 1). ρ ≡ 1, A = +1, ℓ = −w:
#   loss = −(2 + 0.5 + 1) / 3 = −1.1666667, ∂L/∂log π = −w / 3; capped: 1 of 3 trained tokens
#   (the padded 10 does not count).
def test_truncated_is_weights_and_clip_frac():
    old = torch.full((1, 4), -1.0)
    sampler = old - torch.tensor([[3.0, 0.5, 1.0, 10.0]]).log()
    logprobs = old.clone().requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = rl_objective(ObjectiveInputs(logprobs, old, torch.ones(1), mask, sampler_logprobs=sampler),
                               tis_cap=2.0)
    assert loss.item() == pytest.approx(-3.5 / 3, abs=1e-6)
    assert stats["tis_clip_frac"].item() == pytest.approx(1 / 3)
    assert stats["sampler_kl"].item() == pytest.approx(float((sampler - old)[0, :3].mean()), abs=1e-6)  # trained tokens only
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[-2 / 3, -0.5 / 3, -1 / 3, 0.0]]), atol=1e-6)
    # Without sampler_logprobs π_sampler is π_old: no weights (loss −1), nothing capped.
    plain, stats = rl_objective(ObjectiveInputs(logprobs, old, torch.ones(1), mask), tis_cap=2.0)
    assert plain.item() == pytest.approx(-1.0)
    assert stats["tis_clip_frac"].item() == 0.0


# ---------------------------------------------------------------------------------------------
# PPO value term

# V = (1, 3, 0.5), V_old = (0.5, 2, 0.5), R = (2, 0, 0), clip 0.2: ℓᵛ = (0.845, 4.5, 0.125) (see
# test_objectives), mean 5.47 / 3 = 1.8233333. With A = 0 and ρ ≡ 1 the loss is vf_coef · 1.8233333:
# 0.5 -> 0.9116667. ∂L/∂V = vf_coef · (0, 3, 0.5) / 3 = (0, 0.5, 0.0833333).
@pytest.mark.parametrize("vf_coef", [0.5, 1.0])
def test_value_term_included_with_vf_coef(vf_coef):
    logprobs = torch.zeros(1, 3)
    values = torch.tensor([[1.0, 3.0, 0.5]], requires_grad=True)
    inputs = ObjectiveInputs(logprobs, logprobs, torch.zeros(1), torch.ones(1, 3), values=values,
                             old_values=torch.tensor([[0.5, 2.0, 0.5]]), returns=torch.tensor([[2.0, 0.0, 0.0]]))
    loss, stats = rl_objective(inputs, vf_coef=vf_coef)
    assert loss.item() == pytest.approx(vf_coef * 5.47 / 3, abs=1e-6)
    assert stats["value_loss"].item() == pytest.approx(5.47 / 3, abs=1e-6)
    loss.backward()
    assert torch.allclose(values.grad, vf_coef * torch.tensor([[0.0, 3.0, 0.5]]) / 3, atol=1e-6)
    # Unclipped: ½ (V − R)² = (0.5, 4.5, 0.125) -> vf_coef · 5.125 / 3.
    unclipped, _ = rl_objective(inputs, vf_coef=vf_coef, value_clip=None)
    assert unclipped.item() == pytest.approx(vf_coef * 5.125 / 3, abs=1e-6)


def test_returns_without_values_raises():
    logprobs = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="values"):
        rl_objective(ObjectiveInputs(logprobs, logprobs, torch.zeros(1), torch.ones(1, 3), returns=torch.zeros(1, 3)))


def test_diagnostics_are_detached_scalars():
    logprobs, old = _with_ratios(GSPO_LOG_RATIOS)
    values = torch.zeros(2, 3, requires_grad=True)
    inputs = ObjectiveInputs(logprobs, old, GSPO_ADV, MASK, sampler_logprobs=old - 0.1, ref_logprobs=old,
                             entropy=ENTROPY.clone().requires_grad_(True), values=values, old_values=values.detach(),
                             returns=torch.ones(2, 3))
    _, stats = rl_objective(inputs, beta=0.1, tis_cap=1.0, off_policy_mask=0.1, entropy_coef=0.01)
    assert set(stats) == {"clip_frac", "approx_kl", "ratio_mean", "ratio_max", "off_policy_masked_frac",
                          "tis_clip_frac", "sampler_kl", "kl", "kl_seq", "value_loss", "value_clip_frac", "entropy"}
    assert stats["sampler_kl"].item() == pytest.approx(-0.1, abs=1e-6)  # log π_sampler − log π_old = −0.1 on every token
    assert all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad for v in stats.values())


# ---------------------------------------------------------------------------------------------
# TRL parity (only where TRL is installed: the main venv has none; run
# `.bench/trl-venv/bin/python bench/trl_loss_parity.py` for the table)


def test_matches_trl_compute_loss():
    pytest.importorskip("trl")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "trl_loss_parity.py"
    spec = importlib.util.spec_from_file_location("trl_loss_parity", path)
    parity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parity)
    for name, trl_loss, our_loss, grad_diff in parity.parity_rows():
        assert our_loss == pytest.approx(trl_loss, abs=1e-9), name
        assert grad_diff < 1e-9, name
