"""KLController.boost, the health monitor's KL-explosion response: it composes with every
schedule, floors β = 0, and survives a checkpoint."""

import pytest

from scalerl.algorithms.kl_control import KLController, progressive_beta


def test_boost_multiplies_a_fixed_beta_and_floors_zero():
    c = KLController(schedule="fixed", beta=0.1, total_steps=10)
    c.boost(1.5, 0.01)
    assert c.beta_at(1) == pytest.approx(0.15)  # max(1.5 x 0.1, 0.01)
    zero = KLController(schedule="fixed", beta=0.0, total_steps=10)
    assert zero.beta_at(1) == 0.0
    zero.boost(1.5, 0.01)
    assert zero.beta_at(1) == pytest.approx(0.01)  # 1.5 x 0 = 0: the floor takes over
    zero.boost(1.5, 0.01)
    assert zero.beta_at(1) == pytest.approx(0.015)  # and is itself raised x1.5


def test_boost_composes_with_progressive_and_adaptive():
    p = KLController(schedule="progressive", beta=0.1, total_steps=100, beta_min=0.01, beta_target=0.05)
    p.boost(1.5, 0.01)
    for step in (1, 30, 90):
        expected = progressive_beta(step - 1, 100, beta_init=0.1, beta_min=0.01, beta_target=0.05)
        assert p.beta_at(step) == pytest.approx(max(1.5 * expected, 0.01))
    a = KLController(schedule="adaptive", beta=0.1, total_steps=10, target_kl=0.1, horizon=10)
    a.boost(2.0, 0.01)
    a.update(0.5)  # the controller moves its own β: 0.1 x (1 + 0.2 x 1/10) = 0.102
    assert a.beta == pytest.approx(0.102) and a.beta_at(2) == pytest.approx(0.204)


def test_boost_is_saved_and_old_states_load():
    c = KLController(schedule="fixed", beta=0.0, total_steps=10)
    c.boost(1.5, 0.02)
    resumed = KLController(schedule="fixed", beta=0.0, total_steps=10)
    resumed.load_state_dict(c.state_dict())
    assert (resumed.scale, resumed.floor, resumed.beta_at(3)) == (1.5, 0.02, 0.02)
    old = KLController(schedule="fixed", beta=0.1, total_steps=10)
    old.load_state_dict({"schedule": "fixed", "beta": 0.1})  # a checkpoint from before the boost existed
    assert (old.scale, old.floor) == (1.0, 0.0)
