"""group_advantages by hand."""

import math

import pytest
import torch

from scalerl.algorithms.advantages import group_advantages


def test_two_groups_bessel_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    adv = group_advantages(rewards, 4)
    # Group 1: mean 0.25, Bessel var = (0.75² + 3·0.25²) / 3 = 0.25 -> std 0.5.
    # Group 2: mean 0.75, var = (3·0.25² + 0.75²) / 3 = 0.25 -> std 0.5. Divide by 0.5 + 1e-4.
    d = 0.5 + 1e-4
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25]) / d
    assert torch.allclose(adv, expected, atol=1e-6)
    assert adv.shape == (8,)


def test_bessel_not_population_std():
    # [0, 2]: mean 1, Bessel std sqrt((1 + 1) / 1) = sqrt(2) (the population std would be 1).
    adv = group_advantages(torch.tensor([0.0, 2.0]), 2, eps=0.0)
    assert torch.allclose(adv, torch.tensor([-1.0, 1.0]) / math.sqrt(2))


def test_eps_is_added_to_std():
    # std 0.5 + eps 0.5 = 1: the advantages are the centred rewards.
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4, eps=0.5)
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_dr_grpo_no_scaling():
    rewards = torch.tensor([3.0, 1.0, 5.0, 5.0, 2.0, 8.0])
    adv = group_advantages(rewards, 3, scale=False)
    # Group means 3 and 5: centred rewards only.
    assert torch.allclose(adv, torch.tensor([0.0, -2.0, 2.0, 0.0, -3.0, 3.0]))


def test_all_equal_group_gives_zeros():
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0]), 3)
    assert torch.equal(adv[:3], torch.zeros(3))
    # Second group [0, 1, 0]: mean 1/3, Bessel std sqrt((1/9 + 4/9 + 1/9)/2) = sqrt(1/3).
    s = math.sqrt(1 / 3) + 1e-4
    assert torch.allclose(adv[3:], torch.tensor([-1 / 3, 2 / 3, -1 / 3]) / s, atol=1e-6)


@pytest.mark.parametrize("scale", [True, False])
def test_group_size_one_gives_zeros(scale):
    adv = group_advantages(torch.tensor([0.3, 1.0, -2.0]), 1, scale=scale)
    assert torch.equal(adv, torch.zeros(3))
    assert torch.isfinite(adv).all()


def test_wrong_size_raises():
    with pytest.raises(ValueError, match="groups of 2"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0]), 2)


# --- scale_rewards, RLOO, REINFORCE++ ---------------------------------------------------------

from scalerl.algorithms.advantages import reinforce_pp_advantages, rloo_advantages  # noqa: E402

REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
CENTRED = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25])  # minus group means 0.25, 0.75


def test_scale_rewards_group_and_none_match_the_bool():
    assert torch.equal(group_advantages(REWARDS, 4, scale_rewards="group"), group_advantages(REWARDS, 4))
    assert torch.equal(group_advantages(REWARDS, 4, scale_rewards="none"), CENTRED)
    # scale_rewards overrides scale.
    assert torch.equal(group_advantages(REWARDS, 4, scale=True, scale_rewards="none"), CENTRED)
    assert torch.equal(group_advantages(REWARDS, 4, scale=False, scale_rewards="group"), group_advantages(REWARDS, 4))


def test_scale_rewards_batch_by_hand():
    # Batch of 8 rewards: mean 0.5, Bessel var 8·0.25/7 = 2/7 -> std 0.5345225; centred by group mean.
    adv = group_advantages(REWARDS, 4, scale_rewards="batch")
    assert torch.allclose(adv, CENTRED / (math.sqrt(2 / 7) + 1e-4), atol=1e-6)
    # Where it differs from group scaling: [0, 2 | 5, 5], G = 2. Group centred (−1, 1, 0, 0); batch
    # mean 3, Bessel var (9 + 1 + 4 + 4) / 3 = 6 -> divide by sqrt(6) (group scaling divides by sqrt(2)).
    adv = group_advantages(torch.tensor([0.0, 2.0, 5.0, 5.0]), 2, scale_rewards="batch", eps=0.0)
    assert torch.allclose(adv, torch.tensor([-1.0, 1.0, 0.0, 0.0]) / math.sqrt(6))


def test_scale_rewards_batch_single_reward_and_unknown():
    assert torch.equal(group_advantages(torch.tensor([3.0]), 1, scale_rewards="batch"), torch.zeros(1))
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(REWARDS, 4, scale_rewards="prompt")


def test_rloo_by_hand_and_against_loop():
    # [1, 0, 0, 0]: A_0 = 1 − (0+0+0)/3 = 1, A_1 = 0 − (1+0+0)/3 = −1/3 (= 4/3 · (r − 0.25)).
    adv = rloo_advantages(REWARDS, 4)
    assert torch.allclose(adv[:4], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    r = REWARDS.tolist()
    loop = [r[i] - sum(r[j] for j in range(4 * (i // 4), 4 * (i // 4) + 4) if j != i) / 3 for i in range(8)]
    assert torch.allclose(adv, torch.tensor(loop))


def test_rloo_needs_two_per_group():
    with pytest.raises(ValueError, match="at least 2"):
        rloo_advantages(torch.tensor([1.0, 0.0]), 1)
    with pytest.raises(ValueError, match="groups of 3"):
        rloo_advantages(REWARDS, 3)


def test_reinforce_pp_batch_baseline_by_hand():
    # mean 0.5, Bessel std sqrt(2/7) = 0.5345225: A = ±0.5 / 0.5345225 = ±0.9354143.
    adv = reinforce_pp_advantages(REWARDS, 4)
    assert torch.allclose(adv, (REWARDS - 0.5) / math.sqrt(2 / 7), atol=1e-6)


def test_reinforce_pp_group_baseline_by_hand():
    # Centred by group means: CENTRED, whose mean is 0 and Bessel var
    # (2·0.75² + 6·0.25²) / 7 = 1.5 / 7 -> std 0.4629100.
    adv = reinforce_pp_advantages(REWARDS, 4, baseline="group")
    assert torch.allclose(adv, CENTRED / math.sqrt(1.5 / 7), atol=1e-6)
    assert adv.mean().abs().item() < 1e-6


def test_reinforce_pp_unknown_baseline():
    with pytest.raises(ValueError, match="baseline"):
        reinforce_pp_advantages(REWARDS, 4, baseline="token")
