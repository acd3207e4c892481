"""The adaptive entropy coefficient: the pure rule by hand, and the learner steering it step by step."""

import pytest

from scalerl.algorithms.entropy_control import applied_entropy_coef, next_entropy_coef


def test_entropy_coefficient_rule_by_hand():
    # below (or at) the target: up by the step, capped; above: down by the step, floored at 0
    assert next_entropy_coef(0.01, 0.1, target=0.2, step=0.005, high=1.0) == pytest.approx(0.015)
    assert next_entropy_coef(0.01, 0.2, target=0.2, step=0.005, high=1.0) == pytest.approx(0.015)
    assert next_entropy_coef(0.998, 0.1, target=0.2, step=0.005, high=1.0) == 1.0
    assert next_entropy_coef(0.01, 0.3, target=0.2, step=0.005, high=1.0) == pytest.approx(0.005)
    assert next_entropy_coef(0.003, 0.3, target=0.2, step=0.005, high=1.0) == 0.0
    # applied only while the entropy is at or below the target (and before any measurement)
    assert applied_entropy_coef(0.02, None, 0.2) == 0.02
    assert applied_entropy_coef(0.02, 0.15, 0.2) == 0.02
    assert applied_entropy_coef(0.02, 0.25, 0.2) == 0.0
