"""Rollout-correction presets by hand: IS weights per token and per completion, the rejection masks
(IcePop's token band, the sequence and geometric-mean sequence bands, k3), their metrics, and the
preset reaching the loss through rl_objective (red when the option is ignored)."""

import math

import pytest
import torch

from scalerl.algorithms.objective import ObjectiveInputs, rl_objective
from scalerl.algorithms.rollout_correction import RolloutCorrection, is_weights, rejection_mask, rollout_correction

MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
OLD = torch.zeros(2, 3)
# δ = log π_old − log π_sampler: row 0 (0.1, 0.9, −0.1), row 1 (−0.8, −0.2 | pad 5.0)
SAMPLER = -torch.tensor([[0.1, 0.9, -0.1], [-0.8, -0.2, 5.0]])


def test_is_weights_by_hand():
    token = is_weights(OLD, SAMPLER, MASK, level="token", cap=2.0)
    assert token.flatten().tolist() == pytest.approx([math.exp(0.1), 2.0, math.exp(-0.1), math.exp(-0.8), math.exp(-0.2), 0.0], rel=1e-6)
    seq = is_weights(OLD, SAMPLER, MASK, level="sequence", cap=2.0)  # row 0: e^{0.9} = 2.46 -> 2; row 1: e^{−1.0}
    assert seq.flatten().tolist() == pytest.approx([2.0, 2.0, 2.0, math.exp(-1.0), math.exp(-1.0), 0.0], rel=1e-6)


@pytest.mark.parametrize("mode, low, high, expected", [
    # k1 = −δ = log π_sampler/π_old must lie in [log low, log high] = [log 0.5, log 2] = [−0.693, 0.693]
    ("token_k1", 0.5, 2.0, [1, 0, 1, 0, 1, 0]),  # −0.9 and +0.8 are outside (IcePop's two-sided token mask)
    ("seq_sum_k1", 0.5, 2.0, [0, 0, 0, 0, 0, 0]),  # row sums −0.9 and +1.0: both outside
    ("seq_mean_k1", 0.5, 2.0, [1, 1, 1, 1, 1, 0]),  # geometric means: −0.3 and +0.5: both inside
    ("seq_mean_k1", 0.8, 1.25, [0, 0, 0, 0, 0, 0]),  # band [−0.223, 0.223]: both outside
    # k3 = e^δ − 1 − δ: row 0 (0.005171, 0.559603, 0.004837) mean 0.189870; row 1 (0.249329, 0.018731) mean 0.134030
    ("seq_mean_k3", 0.5, 0.15, [0, 0, 0, 1, 1, 0]),
    ("token_k2", 0.5, 0.1, [1, 0, 1, 0, 1, 0]),  # k2 = ½δ²: 0.405 and 0.32 are above 0.1
    ("seq_max_k3", 0.5, 0.5, [0, 0, 0, 1, 1, 0]),  # row 0's max 0.5596 > 0.5, row 1's 0.2493
])
def test_rejection_masks_by_hand(mode, low, high, expected):
    keep = rejection_mask(OLD, SAMPLER, MASK, mode=mode, low=low, high=high)
    assert keep.flatten().tolist() == expected


def test_preset_metrics_and_factor():
    factor, stats = rollout_correction(OLD, SAMPLER, MASK, RolloutCorrection("geo_mis_token_tis", cap=2.0, low=0.8, high=1.25))
    assert factor.abs().sum().item() == 0.0  # both rows dropped by the band
    assert stats["rollout_corr/masked_frac"].item() == 1.0
    assert stats["rollout_corr/is_clip_frac"].item() == pytest.approx(1 / 5)  # e^{0.9} ≥ 2
    # ratios π_old/π_sampler = e^δ over the 5 trained tokens; the median is e^{−0.1}
    assert stats["rollout_corr/ratio_p50"].item() == pytest.approx(math.exp(-0.1), rel=1e-5)
    k3 = [math.exp(d) - 1 - d for d in (0.1, 0.9, -0.1, -0.8, -0.2)]
    assert stats["rollout_corr/sampler_kl_k3"].item() == pytest.approx(sum(k3) / 5, rel=1e-5)
    with pytest.raises(ValueError, match="unknown rollout correction"):
        rollout_correction(OLD, SAMPLER, MASK, RolloutCorrection("tis"))


def test_rl_objective_applies_the_preset():
    """icepop: the two out-of-band tokens lose their policy term; the loss is the clip surrogate (ρ = 1,
    A = 1 on row 0, −1 on row 1) over the 3 kept of 5 tokens: (−1 − 1 + 1) / 5."""
    logprobs = OLD.clone().requires_grad_(True)
    x = ObjectiveInputs(logprobs, OLD, torch.tensor([1.0, -1.0]), MASK, sampler_logprobs=SAMPLER)
    loss, stats = rl_objective(x, rollout_correction=RolloutCorrection("icepop", low=0.5, high=2.0))
    assert loss.item() == pytest.approx(-1 / 5)
    assert stats["rollout_corr/masked_frac"].item() == pytest.approx(2 / 5)
    loss.backward()
    assert logprobs.grad[0, 1].item() == 0.0 and logprobs.grad[1, 0].item() == 0.0 and logprobs.grad[0, 0].item() != 0.0
    with pytest.raises(ValueError, match="rollout_correction with tis_cap"):
        rl_objective(x, rollout_correction=RolloutCorrection("token_tis"), tis_cap=2.0)
