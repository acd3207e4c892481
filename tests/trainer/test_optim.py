"""lr_factor: warm-up, then constant, linear or cosine decay."""

import math

import pytest

from scalerl.config import OptimConfig
from scalerl.learner.optim import lr_factor


def test_warmup_then_constant():
    c = OptimConfig(warmup_steps=4)
    # step s < 4 uses (s + 1) / 4: 0.25, 0.5, 0.75, 1.0; constant afterwards.
    assert [lr_factor(s, 10, c) for s in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert lr_factor(9, 10, c) == 1.0


def test_constant_without_warmup():
    c = OptimConfig()
    assert all(lr_factor(s, 5, c) == 1.0 for s in range(5))


def test_linear():
    c = OptimConfig(schedule="linear")
    # progress = s / 9 (the last of 10 steps is s = 9), factor = 1 - progress
    assert lr_factor(0, 10, c) == pytest.approx(1.0)
    assert lr_factor(3, 10, c) == pytest.approx(2 / 3)
    assert lr_factor(9, 10, c) == pytest.approx(0.0)
    assert lr_factor(15, 10, c) == pytest.approx(0.0)  # progress is capped at 1


def test_linear_with_warmup_and_floor():
    c = OptimConfig(schedule="linear", warmup_steps=2, min_lr_ratio=0.2)
    # warm-up: 0.5, 1.0; then progress = (s - 2) / 7, factor = 0.2 + 0.8 (1 - progress)
    assert lr_factor(0, 10, c) == pytest.approx(0.5)
    assert lr_factor(1, 10, c) == pytest.approx(1.0)
    assert lr_factor(2, 10, c) == pytest.approx(1.0)
    assert lr_factor(9, 10, c) == pytest.approx(0.2)  # the floor at the last step
    assert lr_factor(10, 10, c) == pytest.approx(0.2)


def test_cosine():
    c = OptimConfig(schedule="cosine", min_lr_ratio=0.1)
    # 9 steps, last s = 8: factor = 0.1 + 0.9 · ½(1 + cos(π s / 8))
    assert lr_factor(0, 9, c) == pytest.approx(1.0)
    assert lr_factor(2, 9, c) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))  # 0.868198
    assert lr_factor(4, 9, c) == pytest.approx(0.55)  # cos(π/2) = 0
    assert lr_factor(8, 9, c) == pytest.approx(0.1)


def test_cosine_with_warmup():
    c = OptimConfig(schedule="cosine", warmup_steps=2)
    # 7 steps; after warm-up, progress = (s - 2) / 4: s = 4 -> 0.5 -> ½(1 + 0) = 0.5
    assert lr_factor(1, 7, c) == pytest.approx(1.0)
    assert lr_factor(4, 7, c) == pytest.approx(0.5)
    assert lr_factor(6, 7, c) == pytest.approx(0.0)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_decay_reaches_floor_at_last_step(schedule):
    c = OptimConfig(schedule=schedule, min_lr_ratio=0.0)
    assert lr_factor(9, 10, c) == pytest.approx(0.0)
