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
