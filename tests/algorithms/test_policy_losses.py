"""The policy losses of policy_losses.py and the options that reach them through rl_objective
(SAPO, VESPO, GMPO, Clip-Cov, KL-Cov, LUSPO's sequence_sum, the top-entropy mask), each on
hand-written tensors with the expected number worked out in a comment; each test fails when
rl_objective skips the option (it would return the plain clip loss, a different number)."""

import math

import pytest
import torch

from scalerl.algorithms.losses import aggregate
from scalerl.algorithms.objective import ObjectiveInputs, rl_objective
from scalerl.algorithms.policy_losses import clip_cov_keep, high_entropy_mask, kl_cov_selected, vespo_weights

sig = (lambda x: 1.0 / (1.0 + math.exp(-x)))
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])
# log π_θ − log π_old: row 0 (0.2, −0.1), row 1 (0.3); log π_old = −1 everywhere
LOG_RATIOS = torch.tensor([[0.2, -0.1, 0.0], [0.3, 0.0, 0.0]])
ADV = torch.tensor([1.0, -0.5])


def _inputs(log_ratios=LOG_RATIOS, adv=ADV, mask=MASK, **kw):
    old = torch.full_like(log_ratios, -1.0)
    return ObjectiveInputs((old + log_ratios).requires_grad_(True), old, adv, mask, **kw)


def test_sapo_by_hand():
    # τ = 1 for A = +1, τ = 1.05 for A = −0.5.  ℓ = −(4/τ) σ(τ(ρ − 1)) A
    r = [math.exp(0.2), math.exp(-0.1), math.exp(0.3)]
    l0 = [-4 * sig(r[0] - 1), -4 * sig(r[1] - 1)]
    l1 = (4 / 1.05) * sig(1.05 * (r[2] - 1)) * 0.5
    x = _inputs()
    loss, stats = rl_objective(x, policy_loss="sapo", policy_params=dict(tau_pos=1.0, tau_neg=1.05), loss_agg="sequence")
    assert loss.item() == pytest.approx(((l0[0] + l0[1]) / 2 + l1) / 2, rel=1e-6)
    loss.backward()  # ∂ℓ/∂log π = −4σ(1−σ) ρ A: at token (0, 0): −4σ(0.2214)(1 − σ(0.2214)) · e^0.2 / 2 (row mean) / 2 (rows)
    s = sig(r[0] - 1)
    assert x.logprobs.grad[0, 0].item() == pytest.approx(-4 * s * (1 - s) * r[0] / 4, rel=1e-6)
    assert stats["clip_frac"].item() == 0.0 and 0 < stats["sapo_gate"].item() <= 1.0


def test_vespo_weight_and_loss_by_hand():
    # row 0: log w = 0.2 − 0.1 = 0.1, A ≥ 0 -> k 2, λ 3: φ = exp(3 + 2·0.1 − 3 e^0.1)
    # row 1: log w = 0.3, A < 0 -> k 3, λ 2: φ = exp(2 + 3·0.3 − 2 e^0.3)
    phi = vespo_weights(ADV, LOG_RATIOS, MASK)
    expected = [math.exp(3 + 0.2 - 3 * math.exp(0.1)), math.exp(2 + 0.9 - 2 * math.exp(0.3))]
    assert phi.flatten().tolist() == pytest.approx(expected, rel=1e-6)
    x = _inputs()
    loss, stats = rl_objective(x, policy_loss="vespo", policy_params=dict(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0))
    # ℓ = −φ A log π summed over the 3 trained tokens / 3; log π = −0.8, −1.1 | −0.7
    by_hand = (-expected[0] * 1.0 * (-0.8 - 1.1) - expected[1] * (-0.5) * (-0.7)) / 3
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)
    loss.backward()
    assert x.logprobs.grad[1, 0].item() == pytest.approx(expected[1] * 0.5 / 3, rel=1e-6)  # −φ A / N
    assert stats["vespo_phi"].item() == pytest.approx((2 * expected[0] + expected[1]) / 3, rel=1e-6)


def test_vespo_folds_truncated_is_into_its_weight():
    # sampler 0.2 below old on every token: w_IS = min(e^0.2, 1.1) = 1.1 -> log w gains Σ_t log 1.1
    sampler = torch.full((2, 3), -1.2)
    x = _inputs(sampler_logprobs=sampler)
    loss, _ = rl_objective(x, policy_loss="vespo", tis_cap=1.1, policy_params={})
    phi0 = math.exp(3 + 2 * (0.1 + 2 * math.log(1.1)) - 3 * math.exp(0.1 + 2 * math.log(1.1)))
    phi1 = math.exp(2 + 3 * (0.3 + math.log(1.1)) - 2 * math.exp(0.3 + math.log(1.1)))
    assert loss.item() == pytest.approx((phi0 * 1.9 - phi1 * 0.5 * 0.7) / 3, rel=1e-6)  # not also multiplied by 1.1


def test_gmpo_by_hand():
    # ε = 0.15 in log space. Row 0 (A > 0): min(0.2, 0.15) = 0.15, min(−0.1, −0.1) = −0.1 -> r_0 = e^{0.025}
    # Row 1 (A < 0): s = −1: −min(−0.3, −0.15) = 0.3 (pessimistic: unclipped) -> r_1 = e^{0.3}
    x = _inputs()
    loss, stats = rl_objective(x, policy_loss="gmpo", clip_eps_low=0.15, clip_eps_high=0.15, loss_agg="sequence")
    assert loss.item() == pytest.approx((-math.exp(0.025) + 0.5 * math.exp(0.3)) / 2, rel=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(2 / 3)  # tokens (0, 0) and (1, 0) are outside ±0.15
    loss.backward()  # token (0, 0) clipped: no gradient; (0, 1): −A r_0 / 2 tokens / 2 rows
    assert x.logprobs.grad[0, 0].item() == 0.0
    assert x.logprobs.grad[0, 1].item() == pytest.approx(-math.exp(0.025) / 4, rel=1e-6)


def test_kl_cov_penalises_the_highest_covariance_token():
    # token-level advantages: covariance (A − Ā)(log π − mean log π) over 4 trained tokens
    mask = torch.tensor([[1, 1], [1, 1]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    lr = torch.tensor([[0.1, -0.2], [0.05, 0.0]])
    old = torch.tensor([[-0.5, -2.0], [-1.0, -1.5]])  # log π = −0.4, −2.2, −0.95, −1.5, mean −1.2625
    # C = (1)(0.8625), (1)(−0.9375), (−1)(0.3125), (−1)(−0.2375) -> the largest is token (0, 0)
    assert kl_cov_selected(adv, old + lr, mask, ratio=0.25).tolist() == [[True, False], [False, False]]
    x = ObjectiveInputs((old + lr).requires_grad_(True), old, adv, mask)
    loss, stats = rl_objective(x, policy_loss="kl_cov", policy_params=dict(ratio=0.25, kl_coef=0.5))
    unclipped = [-math.exp(0.1), -math.exp(-0.2), math.exp(0.05), 1.0]  # −A ρ, no clip at all
    assert loss.item() == pytest.approx((sum(unclipped) + 0.5 * 0.1) / 4, rel=1e-6)
    assert stats["cov_frac"].item() == 0.25


def test_clip_cov_drops_the_gradient_of_a_high_covariance_token():
    mask = torch.tensor([[1, 1], [1, 1]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    old = torch.tensor([[-0.5, -2.0], [-1.0, -1.5]])
    logprobs = old + 0.01  # ρ ≈ 1: nothing is PPO-clipped
    # C = 0.8625, −0.9375, 0.3125·(−1), 0.2375 -> in (0.5, 5): only token (0, 0)
    keep = clip_cov_keep(adv, logprobs, mask, torch.zeros(2, 2, dtype=torch.bool), ratio=0.25, cov_low=0.5, cov_high=5.0)
    assert keep.tolist() == [[0.0, 1.0], [1.0, 1.0]]
    x = ObjectiveInputs(logprobs.clone().requires_grad_(True), old, adv, mask)
    loss, stats = rl_objective(x, policy_loss="clip_cov", policy_params=dict(ratio=0.25, cov_low=0.5, cov_high=5.0))
    r = math.exp(0.01)
    assert loss.item() == pytest.approx((-r + r + r) / 4, rel=1e-6)  # token (0, 0)'s −ρA is gone
    loss.backward()
    assert x.logprobs.grad[0, 0].item() == 0.0 and x.logprobs.grad[0, 1].item() != 0.0
    assert stats["cov_frac"].item() == 0.25


def test_sequence_sum_is_luspo_reduction():
    values = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]])
    assert aggregate(values, MASK, "sequence_sum").item() == pytest.approx((3.0 + 4.0) / 2)
    x = _inputs()
    loss, _ = rl_objective(x, loss_agg="sequence_sum")
    # clip ε 0.2: row 0 −min(e^0.2, 1.2) − e^−0.1 = −1.2 − e^−0.1, row 1: −min(−0.5 e^0.3, −0.5·1.2) = 0.5 e^0.3
    # summed per row, averaged over the 2 rows (the sequence mean would halve row 0's sum first)
    assert loss.item() == pytest.approx((-1.2 - math.exp(-0.1) + 0.5 * math.exp(0.3)) / 2, rel=1e-6)


def test_top_entropy_quantile_trains_only_the_high_entropy_tokens():
    entropy = torch.tensor([[0.1, 0.9, 5.0], [0.5, 5.0, 5.0]])  # trained: 0.1, 0.9, 0.5
    # quantile 0.5 -> threshold = median of (0.1, 0.5, 0.9) = 0.5: tokens (0, 1) and (1, 0) kept
    assert high_entropy_mask(entropy, MASK, 0.5).tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    x = _inputs(torch.tensor([[0.1, -0.1, 0.0], [0.3, 0.0, 0.0]]), entropy=entropy.clone().requires_grad_(True))
    loss, stats = rl_objective(x, top_entropy_quantile=0.5, entropy_coef=0.1)
    # policy (token mean over all 3 trained tokens): −e^−0.1 + 0.5 e^0.3, the bonus over the 2 kept: (0.9 + 0.5) / 2
    assert loss.item() == pytest.approx((-math.exp(-0.1) + 0.5 * math.exp(0.3)) / 3 - 0.1 * 0.7, rel=1e-6)
    assert stats["top_entropy_frac"].item() == pytest.approx(2 / 3)
    loss.backward()
    assert x.logprobs.grad[0, 0].item() == 0.0  # the low-entropy token (ρ = e^0.1, unclipped) gets no policy gradient
    assert x.entropy.grad[0, 0].item() == 0.0 and x.entropy.grad[0, 1].item() == pytest.approx(-0.1 / 2)


@pytest.mark.parametrize("kw, message", [
    (dict(policy_loss="sapo", delta=1.5), "delta"),
    (dict(policy_loss="gmpo", importance_level="sequence"), "importance_level=sequence"),
    (dict(policy_loss="vespo", importance_level="sequence"), "importance_level=sequence"),
    (dict(top_entropy_quantile=0.5), "needs entropy"),
    (dict(policy_loss="ppo"), "unknown policy loss"),
])
def test_incompatible_objective_options_are_refused(kw, message):
    with pytest.raises(ValueError, match=message):
        rl_objective(_inputs(), **kw)


def test_cispo_lower_cap_by_hand():
    # ρ = e^{−0.5} = 0.6065 on one token, A = 1, log π = −1.5: without eps_min ℓ = 0.6065·1.5; with eps_min 0.8, 0.8·1.5
    old = torch.tensor([[-1.0]])
    x = ObjectiveInputs((old - 0.5).requires_grad_(True), old, torch.tensor([1.0]), torch.tensor([[1]]))
    plain, _ = rl_objective(x, policy_loss="cispo")
    capped, stats = rl_objective(x, policy_loss="cispo", policy_params={"eps_min": 0.8})
    assert plain.item() == pytest.approx(math.exp(-0.5) * 1.5, rel=1e-6)
    assert capped.item() == pytest.approx(0.8 * 1.5, rel=1e-6) and stats["clip_frac"].item() == 1.0


def test_value_clip_fraction_by_hand():
    # V_old = 0, R = 1, ε = 0.2: V = 0.5 -> V_clip = 0.2, (0.2 − 1)² = 0.64 > (0.5 − 1)² = 0.25: clipped;
    # V = 0.1 -> V_clip = 0.1, equal: not clipped. One of two tokens.
    values = torch.tensor([[0.5, 0.1]], requires_grad=True)
    x = ObjectiveInputs(torch.zeros(1, 2, requires_grad=True), torch.zeros(1, 2), torch.zeros(1), torch.ones(1, 2, dtype=torch.long),
                        values=values, old_values=torch.zeros(1, 2), returns=torch.ones(1, 2))
    _, stats = rl_objective(x, value_clip=0.2)
    assert stats["value_clip_frac"].item() == 0.5
