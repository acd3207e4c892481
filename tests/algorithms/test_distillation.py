"""On-policy distillation's per-token advantage by hand."""

import math

import pytest
import torch

from scalerl.algorithms.advantages import distillation_advantages

MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_distillation_advantage_is_the_negative_reverse_kl_per_token():
    teacher = torch.tensor([[-0.5, -2.0, math.nan], [-1.0, 0.0, 0.0]])
    student = torch.tensor([[-1.0, -1.0, -3.0], [-1.0, math.nan, 0.0]])
    adv = distillation_advantages(teacher, student, MASK, coef=2.0)
    # 2 · (log π_t − log π_s): (0.5, −1.0) | (0.0); 0 (not NaN) off the mask
    assert adv.flatten().tolist() == pytest.approx([1.0, -2.0, 0.0, 0.0, 0.0, 0.0])
    mixed = distillation_advantages(teacher, student, MASK, coef=1.0, task_advantages=torch.tensor([1.0, -1.0]), task_coef=0.5)
    assert mixed.flatten().tolist() == pytest.approx([0.5 + 0.5, -1.0 + 0.5, 0.0, 0.0 - 0.5, 0.0, 0.0])
