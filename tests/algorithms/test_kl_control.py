"""The β schedules: progressive by hand at its phase boundaries, the adaptive controller, and
KLController's state round trip."""

import math

import pytest

from scalerl.algorithms.kl_control import KLController, adaptive_beta_update, progressive_beta

KW = dict(beta_init=0.1, beta_min=0.01, beta_target=0.05)
T = 1000  # phases: t < 100, 100 ≤ t < 600, t ≥ 600


def beta(t, total=T, **kw):
    return progressive_beta(t, total, **{**KW, **kw})


def test_progressive_values_by_hand():
    assert beta(0) == pytest.approx(0.1)  # 0.1 · (1 + 0.5 sin 0)
    assert beta(99) == pytest.approx(0.1 * (1 + 0.5 * math.sin(0.99)))  # ≈ 0.14180
    assert beta(100) == pytest.approx(0.1 * math.sqrt(0.1))  # max(0.01, 0.0316228)
    assert beta(599) == pytest.approx(0.1 * math.sqrt(0.599))  # ≈ 0.07740
    assert beta(600) == pytest.approx(0.01 + 0.04 * 0.36)  # 0.0244
    assert beta(999) == pytest.approx(0.01 + 0.04 * 0.999**2)  # ≈ 0.04992
    # Phase two is floored at β_min: β_init · sqrt(0.3) = 0.0055 < 0.01.
    assert beta(300, beta_init=0.01) == pytest.approx(0.01)


def test_progressive_jumps_at_the_boundaries_as_documented():
    # Documented jumps (right value minus left limit):
    #   at 0.1T: max(β_min, β_init·sqrt(0.1)) − β_init·(1 + 0.5 sin(T/1000)) = 0.0316 − 0.1421 ≈ −0.1105
    #   at 0.6T: β_min + 0.36(β_target − β_min) − max(β_min, β_init·sqrt(0.6)) = 0.0244 − 0.0775 ≈ −0.0531
    jump_1 = max(0.01, 0.1 * math.sqrt(0.1)) - 0.1 * (1 + 0.5 * math.sin(T / 1000))
    jump_2 = 0.01 + 0.36 * (0.05 - 0.01) - max(0.01, 0.1 * math.sqrt(0.6))
    # One integer step differs from the limit by at most the phase's slope: 0.5·β_init/100 in
    # phase one (|cos| ≤ 1), β_init / (2 sqrt(tT)) < 1e-4 in phase two near 0.6T.
    assert beta(100) - beta(99) == pytest.approx(jump_1, abs=0.5 * 0.1 / 100)
    assert beta(600) - beta(599) == pytest.approx(jump_2, abs=1e-4)
    assert jump_1 < -0.1 and jump_2 < -0.05  # genuinely discontinuous, not rounding
    # Within a phase one step moves β by at most ~1e-3 (phase two at t = 100: β_init / (2 sqrt(tT))
    # = 1.6e-4; phase three: 2 (β_target − β_min) t / T² = 4.8e-5), far below the jumps.
    assert abs(beta(101) - beta(100)) < 1e-3 and abs(beta(601) - beta(600)) < 1e-3


def test_progressive_boundaries_belong_to_the_later_phase():
    # T = 25: 0.1T = 2.5 (t = 2 is phase one, t = 3 phase two); 0.6T = 15 (t = 15 is phase three).
    assert beta(2, 25) == pytest.approx(0.1 * (1 + 0.5 * math.sin(0.02)))
    assert beta(3, 25) == pytest.approx(0.1 * math.sqrt(3 / 25))
    assert beta(14, 25) == pytest.approx(0.1 * math.sqrt(14 / 25))
    assert beta(15, 25) == pytest.approx(0.01 + 0.04 * (15 / 25) ** 2)


def test_progressive_can_be_continuous_at_the_second_boundary():
    # With β_init·sqrt(0.6) ≤ β_min = β_target both sides of 0.6T are β_min: no jump.
    kw = dict(beta_init=0.001, beta_min=0.02, beta_target=0.02)
    assert beta(599, **kw) == pytest.approx(0.02) and beta(600, **kw) == pytest.approx(0.02)


def test_progressive_needs_positive_total():
    with pytest.raises(ValueError, match="total_steps"):
        progressive_beta(0, 0, **KW)


@pytest.mark.parametrize(
    "kl, n, expected",
    [
        (0.1, 1, 0.1),  # on target: e = 0
        (0.11, 1, 0.1 * (1 + 0.1 / 10)),  # e = 0.1 -> 0.101
        (0.5, 1, 0.1 * (1 + 0.2 / 10)),  # e = 4 clipped to 0.2 -> 0.102
        (0.0, 1, 0.1 * (1 - 0.2 / 10)),  # e = −1 clipped to −0.2 -> 0.098
        (0.09, 1, 0.1 * (1 - 0.1 / 10)),  # e = −0.1 -> 0.099
        (0.5, 5, 0.1 * (1 + 0.2 * 5 / 10)),  # n = 5 steps: 0.11
    ],
)
def test_adaptive_update_by_hand(kl, n, expected):
    assert adaptive_beta_update(0.1, kl, target_kl=0.1, horizon=10, n_steps=n) == pytest.approx(expected)


def test_adaptive_direction_and_bad_arguments():
    assert adaptive_beta_update(0.1, 0.3, target_kl=0.1, horizon=100) > 0.1  # KL above target raises β
    assert adaptive_beta_update(0.1, 0.03, target_kl=0.1, horizon=100) < 0.1
    with pytest.raises(ValueError):
        adaptive_beta_update(0.1, 0.3, target_kl=0.0, horizon=100)


def test_controller_fixed():
    c = KLController(schedule="fixed", beta=0.05, total_steps=10)
    c.update(100.0)  # no-op
    assert [c.beta_at(s) for s in (1, 5, 10)] == [0.05, 0.05, 0.05]


def test_controller_progressive_is_zero_based_inside():
    c = KLController(schedule="progressive", beta=0.1, total_steps=T, beta_min=0.01, beta_target=0.05)
    assert c.beta_at(1) == pytest.approx(beta(0))
    assert c.beta_at(101) == pytest.approx(beta(100))
    assert c.beta_at(T) == pytest.approx(beta(T - 1))
    c.update(100.0)  # no-op
    assert c.beta_at(1) == pytest.approx(0.1)


def test_controller_adaptive_and_state_round_trip():
    c = KLController(schedule="adaptive", beta=0.1, total_steps=10, target_kl=0.1, horizon=10)
    c.update(0.5)  # 0.102
    c.update(0.11, n_steps=2)  # 0.102 · (1 + 0.1·2/10) = 0.10404
    assert c.beta_at(3) == pytest.approx(0.10404)
    state = c.state_dict()
    resumed = KLController(schedule="adaptive", beta=0.1, total_steps=10, target_kl=0.1, horizon=10)
    resumed.load_state_dict(state)
    assert resumed.beta_at(3) == c.beta_at(3)
    resumed.update(0.0)
    c.update(0.0)
    assert resumed.beta_at(4) == c.beta_at(4)


def test_controller_fixed_state_keeps_the_configured_beta():
    old = KLController(schedule="fixed", beta=0.05, total_steps=10)
    new = KLController(schedule="fixed", beta=0.02, total_steps=10)
    new.load_state_dict(old.state_dict())
    assert new.beta_at(1) == 0.02  # nothing to restore: the config's β wins on resume


def test_controller_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown KL schedule"):
        KLController(schedule="cosine", beta=0.1, total_steps=10)
    with pytest.raises(ValueError, match="1-based"):
        KLController(schedule="fixed", beta=0.1, total_steps=10).beta_at(0)
    with pytest.raises(ValueError, match="schedule"):
        KLController(schedule="fixed", beta=0.1, total_steps=10).load_state_dict({"schedule": "adaptive", "beta": 1.0})
    with pytest.raises(ValueError, match="total_steps"):
        KLController(schedule="progressive", beta=0.1, total_steps=0)
