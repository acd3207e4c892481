"""Per-token objectives (clipped surrogate, CISPO, value loss), truncated IS weights,
policy_stats, prompt-level aggregation and rl_objective as their composition, on hand-written
tensors with padding masks."""

import math

import pytest
import torch

from scalerl.algorithms.kl import kl_estimate
from scalerl.algorithms.losses import (
    aggregate,
    cispo_objective,
    clipped_surrogate,
    policy_stats,
    truncated_is_weights,
    value_loss,
)
from scalerl.algorithms.objective import ObjectiveInputs, rl_objective

# ---------------------------------------------------------------------------------------------
# aggregate(level="prompt")

# Four completions of two prompts (group ids 0, 0, 1, 1); lengths 3, 1, 2, 0.
VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [10.0, 11.0, 12.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
GROUPS = torch.tensor([0, 0, 1, 1])


def test_prompt_level_by_hand():
    # Group 0: (1 + 2 + 3 + 4) / 4 tokens = 2.5; group 1: (7 + 8) / 2 tokens = 7.5 (row 3 is empty).
    # Prompt level: (2.5 + 7.5) / 2 groups = 5.0.
    assert aggregate(VALUES, MASK, "prompt", group_ids=GROUPS).item() == pytest.approx(5.0)
    # The other levels on the same batch: token 25 / 6; sequence (2 + 4 + 7.5 + 0) / 4 = 3.375.
    assert aggregate(VALUES, MASK, "token").item() == pytest.approx(25 / 6)
    assert aggregate(VALUES, MASK, "sequence").item() == pytest.approx(3.375)
    # normalizer replaces the group count: (2.5 + 7.5) / 4 = 2.5; a tensor works too.
    assert aggregate(VALUES, MASK, "prompt", normalizer=4, group_ids=GROUPS).item() == pytest.approx(2.5)
    assert aggregate(VALUES, MASK, "prompt", torch.tensor(4.0), GROUPS).item() == pytest.approx(2.5)


def test_prompt_level_group_ids_are_runs_not_values():
    # Ids need not start at 0 or be sorted: each run of equal ids is one group.
    assert aggregate(VALUES, MASK, "prompt", group_ids=torch.tensor([7, 7, 3, 3])).item() == pytest.approx(5.0)
    # One group per row is sequence level; one group for the batch is token level.
    assert aggregate(VALUES, MASK, "prompt", group_ids=torch.tensor([0, 1, 0, 1])).item() == pytest.approx(3.375)
    assert aggregate(VALUES, MASK, "prompt", group_ids=torch.zeros(4, dtype=torch.long)).item() == pytest.approx(25 / 6)


def test_prompt_level_empty_group_contributes_zero_and_counts():
    values = torch.cat([VALUES, torch.tensor([[13.0, 14.0, 15.0]])])
    mask = torch.cat([MASK, torch.tensor([[0, 0, 0]])])
    # A third group with no trained tokens: (2.5 + 7.5 + 0) / 3.
    groups = torch.tensor([0, 0, 1, 1, 2])
    assert aggregate(values, mask, "prompt", group_ids=groups).item() == pytest.approx(10 / 3)
    # An all-padding batch gives 0, not NaN.
    assert aggregate(VALUES, torch.zeros_like(MASK), "prompt", group_ids=GROUPS).item() == 0.0


def test_prompt_level_needs_group_ids():
    with pytest.raises(ValueError, match="group_ids"):
        aggregate(VALUES, MASK, "prompt")


def test_prompt_level_gradient_by_hand():
    # ρ ≡ 1: ℓ_t = −A_i, so ∂L/∂logπ_it = −A_i m_it / (n_tokens(g) · n_groups).
    logprobs = torch.zeros(4, 3, requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 2.0, 3.0])
    per_token, _ = clipped_surrogate(logprobs, logprobs.detach(), adv)
    loss = aggregate(per_token, MASK, "prompt", group_ids=GROUPS)
    loss.backward()
    # Group 0 has 4 tokens, group 1 has 2, 2 groups: rows 0-1 scale 1/8, rows 2-3 scale 1/4.
    expected = torch.tensor([[-1 / 8] * 3, [1 / 8, 0, 0], [-2 / 4, -2 / 4, 0], [0, 0, 0]])
    assert torch.allclose(logprobs.grad, expected)
    # loss = −(1·3 − 1·1) / 4 / 2 − (2·2) / 2 / 2 = −0.25 − 1.0 = −1.25
    assert loss.item() == pytest.approx(-1.25)


def _grouped_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 5
    logprobs = (-torch.rand(B, T, generator=g) * 3).requires_grad_(True)
    old = logprobs.detach() + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    groups = torch.tensor([10, 10, 11, 11, 12, 12])
    lengths = torch.tensor([5, 1, 2, 4, 3, 3])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return logprobs, old, adv, groups, mask


@pytest.mark.parametrize("objective", ["ppo", "cispo"])
def test_prompt_level_micro_batch_invariance(objective):
    logprobs, old, adv, groups, mask = _grouped_batch()

    def loss_of(s, normalizer=None):
        if objective == "ppo":
            per_token, _ = clipped_surrogate(logprobs[s], old[s], adv[s], clip_eps_low=0.2, clip_eps_high=0.28)
        else:
            per_token, _ = cispo_objective(logprobs[s], old[s], adv[s], eps_max=1.1)
        return aggregate(per_token, mask[s], "prompt", normalizer, groups[s])

    full = loss_of(slice(0, 6))
    (full_grad,) = torch.autograd.grad(full, logprobs)
    # Micro-batches of 1 and 2 whole groups; the normalizer is the global group count, 3.
    split = loss_of(slice(0, 2), normalizer=3) + loss_of(slice(2, 6), normalizer=3)
    (split_grad,) = torch.autograd.grad(split, logprobs)
    assert torch.allclose(split, full, atol=1e-6)
    assert torch.allclose(split_grad, full_grad, atol=1e-7)
    assert full_grad.abs().sum() > 0
    # Sensitivity: averaging the two micro-batch losses (1 and 2 groups) is not the same.
    assert not torch.allclose((loss_of(slice(0, 2)) + loss_of(slice(2, 6))) / 2, full, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# clipped_surrogate

# ε = 0.2; ℓ = −min(ρA, clip(ρ, 0.8, 1.2)A), gradient w.r.t. log π is −Aρ unless clipped (then 0):
#   row 0, A=+2: ρ=1.5 -> min(3.0, 2.4) = 2.4 clipped, ℓ=-2.4, grad 0
#                ρ=0.5 -> min(1.0, 1.6) = 1.0,         ℓ=-1.0, grad -1.0
#                ρ=1.1 -> 2.2 inside the range,        ℓ=-2.2, grad -2.2
#   row 1, A=-2: ρ=1.5 -> min(-3.0, -2.4) = -3.0,      ℓ=3.0,  grad 3.0
#                ρ=0.5 -> min(-1.0, -1.6) = -1.6 clipped, ℓ=1.6, grad 0
#                ρ=3.0 -> min(-6.0, -2.4) = -6.0,      ℓ=6.0,  grad 6.0
RATIOS = torch.tensor([[1.5, 0.5, 1.1], [1.5, 0.5, 3.0]])
PAD_MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_clipped_surrogate_by_hand():
    old = torch.full((2, 3), -2.0)
    logprobs = (old + RATIOS.log()).requires_grad_(True)
    per_token, clipped = clipped_surrogate(logprobs, old, torch.tensor([2.0, -2.0]))
    assert torch.allclose(per_token, torch.tensor([[-2.4, -1.0, -2.2], [3.0, 1.6, 6.0]]), atol=1e-5)
    assert torch.equal(clipped, torch.tensor([[True, False, False], [False, True, False]]))
    assert clipped.dtype == torch.bool and not clipped.requires_grad
    per_token.sum().backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, -1.0, -2.2], [3.0, 0.0, 6.0]]), atol=1e-5)


def test_clipped_surrogate_per_token_advantages_and_clip_higher():
    # A per token: (+1, +1) with ρ = 1.25. ε_high 0.2 clips it (ℓ = −1.2), ε_high 0.28 does not (−1.25).
    old = torch.zeros(1, 2)
    logprobs = old + math.log(1.25)
    adv = torch.tensor([[1.0, 0.0]])  # the second token has A = 0: ℓ = 0, never clipped
    sym, sym_clipped = clipped_surrogate(logprobs, old, adv)
    dapo, dapo_clipped = clipped_surrogate(logprobs, old, adv, clip_eps_low=0.2, clip_eps_high=0.28)
    assert torch.allclose(sym, torch.tensor([[-1.2, 0.0]]))
    assert torch.allclose(dapo, torch.tensor([[-1.25, 0.0]]))
    assert sym_clipped.tolist() == [[True, False]]
    assert dapo_clipped.tolist() == [[False, False]]


def test_old_logprobs_get_no_gradient():
    old = torch.full((2, 3), -2.0, requires_grad=True)
    logprobs = (old.detach() + RATIOS.log()).requires_grad_(True)
    for objective in (clipped_surrogate, cispo_objective):
        per_token, _ = objective(logprobs, old, torch.tensor([2.0, -2.0]))
        per_token.sum().backward()
        assert old.grad is None


# ---------------------------------------------------------------------------------------------
# cispo_objective

# ε_max = 5, old log π = −3. Row 0, A = +2: ρ = (0.1, 1, 3, 8) -> weights (0.1, 1, 3, 5), the 8
# truncated to 5 and the 0.1 left alone (truncation is from above only).
# Row 1, A = −1: ρ = (0.5, 6, pad, pad) -> weights (0.5, 5).
CISPO_RATIOS = torch.tensor([[0.1, 1.0, 3.0, 8.0], [0.5, 6.0, 9.0, 0.01]])
CISPO_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
CISPO_ADV = torch.tensor([2.0, -1.0])


def _cispo_inputs():
    old = torch.full((2, 4), -3.0)
    return (old + CISPO_RATIOS.log()).requires_grad_(True), old


def test_cispo_per_token_by_hand():
    logprobs, old = _cispo_inputs()
    per_token, clipped = cispo_objective(logprobs, old, CISPO_ADV, eps_max=5.0)
    # ℓ = −w·A·log π with log π = −3 + log ρ.
    lp = [[-3 + math.log(r) for r in row] for row in CISPO_RATIOS.tolist()]
    w = [[0.1, 1.0, 3.0, 5.0], [0.5, 5.0, 5.0, 0.01]]
    a = [2.0, -1.0]
    expected = torch.tensor([[-w[i][t] * a[i] * lp[i][t] for t in range(4)] for i in range(2)])
    assert torch.allclose(per_token, expected, atol=1e-5)
    # e.g. token (0, 0): −0.1 · 2 · (−3 + log 0.1) = 0.2 · 5.3025851 = 1.0605170
    assert per_token[0, 0].item() == pytest.approx(1.0605170, abs=1e-5)
    assert clipped.tolist() == [[False, False, False, True], [False, True, True, False]]


def test_cispo_gradient_is_truncated_weight_times_advantage():
    logprobs, old = _cispo_inputs()
    per_token, clipped = cispo_objective(logprobs, old, CISPO_ADV, eps_max=5.0)
    loss = aggregate(per_token, CISPO_MASK, "token")
    loss.backward()
    # ∂L/∂log π_t = −sg(min(ρ_t, 5)) · A / 6 trained tokens; no term from ρ's own dependence on
    # log π (the weight is detached):
    #   row 0: −(0.1, 1, 3, 5) · 2 / 6;  row 1: −(0.5, 5) · (−1) / 6, padding 0.
    expected = torch.tensor([[-0.2, -2.0, -6.0, -10.0], [0.5, 5.0, 0.0, 0.0]]) / 6
    assert torch.allclose(logprobs.grad, expected, atol=1e-6)
    stats = policy_stats(logprobs, old, clipped, CISPO_MASK)
    assert stats["clip_frac"].item() == pytest.approx(2 / 6)  # ρ = 8 and 6; the padded 9 does not count


def test_cispo_keeps_gradient_where_ppo_clip_drops_it():
    # ρ = 1.5, A = +1: PPO's clipped branch has zero gradient; CISPO still pushes with weight 1.5.
    old = torch.tensor([[-1.0]])
    logprobs = (old + math.log(1.5)).requires_grad_(True)
    ppo, _ = clipped_surrogate(logprobs, old, torch.tensor([1.0]))
    (ppo_grad,) = torch.autograd.grad(ppo.sum(), logprobs)
    cispo, _ = cispo_objective(logprobs, old, torch.tensor([1.0]))
    (cispo_grad,) = torch.autograd.grad(cispo.sum(), logprobs)
    assert ppo_grad.item() == 0.0
    assert cispo_grad.item() == pytest.approx(-1.5)


# ---------------------------------------------------------------------------------------------
# truncated_is_weights


def test_truncated_is_weights_cap_and_detach():
    old = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    sampler = torch.tensor([[-1.5, -1.0, -0.5]])
    w = truncated_is_weights(old, sampler, cap=1.5)
    # exp(0.5) = 1.6487 -> capped at 1.5; exp(−1) = 0.3678794 (not raised); exp(0) = 1.
    assert torch.allclose(w, torch.tensor([[1.5, 0.3678794, 1.0]]), atol=1e-6)
    assert not w.requires_grad
    # Multiplied into an objective it scales each token's gradient: ρ ≡ 1, A = 1, ℓ = −w.
    logprobs = old.detach().clone().requires_grad_(True)
    per_token, _ = clipped_surrogate(logprobs, old.detach(), torch.tensor([1.0]))
    (grad,) = torch.autograd.grad((per_token * w).sum(), logprobs)
    assert torch.allclose(grad, -w)


# ---------------------------------------------------------------------------------------------
# value_loss

# ε = 0.2, V_clip = V_old + clip(V − V_old, ±0.2), ℓ = ½ max((V − R)², (V_clip − R)²):
#   a) V=1.0, V_old=0.5, R=2.0: (V−R)² = 1, V_clip = 0.7, (−1.3)² = 1.69 -> ℓ = 0.845, grad 0
#      (the clipped branch wins and is flat in V)
#   b) V=3.0, V_old=2.0, R=0.0: 9 vs V_clip = 2.2, 4.84 -> ℓ = 4.5, grad V − R = 3
#   c) V=0.5, V_old=0.5, R=0.0: both 0.25 -> ℓ = 0.125, grad 0.5
# Unclipped: ½(V − R)² = (0.5, 4.5, 0.125), grad V − R = (−1, 3, 0.5).
V = torch.tensor([[1.0, 3.0, 0.5]])
V_OLD = torch.tensor([[0.5, 2.0, 0.5]])
R = torch.tensor([[2.0, 0.0, 0.0]])


def test_value_loss_clipped_by_hand():
    values = V.clone().requires_grad_(True)
    loss = value_loss(values, V_OLD, R, clip_eps=0.2)
    assert torch.allclose(loss, torch.tensor([[0.845, 4.5, 0.125]]), atol=1e-6)
    loss.sum().backward()
    assert torch.allclose(values.grad, torch.tensor([[0.0, 3.0, 0.5]]), atol=1e-6)


def test_value_loss_unclipped_by_hand():
    values = V.clone().requires_grad_(True)
    loss = value_loss(values, V_OLD, R, clip_eps=None)
    assert torch.allclose(loss, torch.tensor([[0.5, 4.5, 0.125]]))
    loss.sum().backward()
    assert torch.allclose(values.grad, torch.tensor([[-1.0, 3.0, 0.5]]))


def test_value_loss_targets_get_no_gradient():
    old, returns = V_OLD.clone().requires_grad_(True), R.clone().requires_grad_(True)
    values = V.clone().requires_grad_(True)
    value_loss(values, old, returns).sum().backward()
    assert old.grad is None and returns.grad is None


# ---------------------------------------------------------------------------------------------
# policy_stats and rl_objective as a composition


def test_policy_stats_by_hand():
    old = torch.full((2, 3), -2.0)
    logprobs = (old + RATIOS.log()).requires_grad_(True)
    clipped = torch.tensor([[True, False, False], [False, True, True]])  # the last one is padding
    stats = policy_stats(logprobs, old, clipped, PAD_MASK)
    # 5 trained tokens with ρ = (1.5, 0.5, 1.1, 1.5, 0.5); the padded ρ = 3 counts nowhere.
    assert stats["clip_frac"].item() == pytest.approx(2 / 5)
    assert stats["ratio_mean"].item() == pytest.approx(5.1 / 5, abs=1e-6)
    assert stats["ratio_max"].item() == pytest.approx(1.5, abs=1e-6)
    # approx_kl = mean(ρ − 1 − log ρ) (k3 of π_old against π_θ)
    k = [r - 1 - math.log(r) for r in (1.5, 0.5, 1.1, 1.5, 0.5)]
    assert stats["approx_kl"].item() == pytest.approx(sum(k) / 5, abs=1e-6)
    assert all(not v.requires_grad and v.dim() == 0 for v in stats.values())


def test_policy_stats_empty_mask():
    old = torch.zeros(2, 3)
    stats = policy_stats(old + 1.0, old, torch.ones(2, 3, dtype=torch.bool), torch.zeros(2, 3))
    assert stats["ratio_max"].item() == 1.0
    assert stats["clip_frac"].item() == 0.0 and stats["ratio_mean"].item() == 0.0
    assert stats["approx_kl"].item() == 0.0


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rl_objective_is_the_composition(level):
    g = torch.Generator().manual_seed(1)
    logprobs = (-torch.rand(3, 4, generator=g) * 2).requires_grad_(True)
    old = logprobs.detach() + 0.3 * torch.randn(3, 4, generator=g)
    ref = logprobs.detach() + 0.2 * torch.randn(3, 4, generator=g)
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    loss, stats = rl_objective(ObjectiveInputs(logprobs, old, adv, mask, ref_logprobs=ref), clip_eps_high=0.28,
                               beta=0.1, loss_agg=level)
    per_token, clipped = clipped_surrogate(logprobs, old, adv, clip_eps_low=0.2, clip_eps_high=0.28)
    kl = kl_estimate(logprobs, ref, "k3")
    expected = aggregate(per_token + 0.1 * kl, mask, level)
    assert torch.allclose(loss, expected)
    expected_stats = policy_stats(logprobs, old, clipped, mask)
    for key, value in expected_stats.items():
        assert torch.allclose(stats[key], value), key
    assert stats["kl"].item() == pytest.approx(((kl * mask).sum() / 7).item())
