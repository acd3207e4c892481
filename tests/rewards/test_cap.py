"""Dynamic reward cap: warm-up, a spike clipped to the running quantile, a cap that follows a rising
distribution, and a checkpoint round trip through JSON."""

from __future__ import annotations

import json
import math

import pytest
import torch

from scalerl.rewards.cap import RewardCap, quantile_cap


def test_spike_is_clipped_to_the_running_quantile():
    cap = RewardCap(quantile=0.8, window=4, warmup_steps=2)
    step1 = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
    out, m = cap(step1)  # warm-up: nothing in the window yet
    assert torch.equal(out, step1) and m == {"reward_cap": None, "reward_capped_frac": 0.0}
    out, m = cap(torch.tensor([0.5, 0.4, 0.3, 0.2, 0.1]))  # one step in the window, still < warmup_steps
    assert m["reward_cap"] is None
    # window = 0.1..0.5 twice, sorted x_0..x_9 = .1 .1 .2 .2 .3 .3 .4 .4 .5 .5
    # h = 0.8 * 9 = 7.2 -> Q = x_7 + 0.2 (x_8 - x_7) = 0.4 + 0.2 * 0.1 = 0.42
    assert cap.cap == pytest.approx(0.42)
    out, m = cap(torch.tensor([0.2, 0.3, 5.0, 0.45, 0.41]))  # a spike (5.0) and a mild excess (0.45)
    assert torch.allclose(out, torch.tensor([0.2, 0.3, 0.42, 0.42, 0.41]))
    assert m["reward_cap"] == pytest.approx(0.42) and m["reward_capped_frac"] == pytest.approx(0.4)
    # the raw spike enters the window but barely moves the cap: 15 values sorted
    # .1 .1 .2 .2 .2 .3 .3 .3 .4 .4 .41 .45 .5 .5 5.0; h = 0.8 * 14 = 11.2 -> 0.45 + 0.2 * 0.05 = 0.46
    assert cap.cap == pytest.approx(0.46)


def test_cap_follows_a_rising_distribution():
    cap = RewardCap(quantile=0.95, window=3, warmup_steps=1)
    caps, fracs = [], []
    for t in range(10):
        _, m = cap(torch.tensor([t, t + 1, t + 2, t + 3], dtype=torch.float32))
        caps.append(m["reward_cap"])
        fracs.append(m["reward_capped_frac"])
    # from t = 3 the window holds steps t-3..t-1: 12 values, sorted
    # t-3, t-2, t-2, t-1, t-1, t-1, t, t, t, t+1, t+1, t+2; h = 0.95 * 11 = 10.45
    # -> Q = x_10 + 0.45 (x_11 - x_10) = t + 1 + 0.45: the cap rises one per step, like the rewards
    assert caps[0] is None
    assert caps[3:] == pytest.approx([t + 1.45 for t in range(3, 10)])
    assert fracs[3:] == [0.5] * 7  # t+2 and t+3 are above t+1.45
    # t = 1: window = step 0 (0 1 2 3), h = 0.95 * 3 = 2.85 -> 2 + 0.85 = 2.85
    assert caps[1] == pytest.approx(2.85)


def test_state_dict_round_trips_through_json():
    a = RewardCap(quantile=0.9, window=5, warmup_steps=2)
    g = torch.Generator().manual_seed(0)
    for _ in range(7):
        a(torch.rand(8, generator=g))
    b = RewardCap(quantile=0.9, window=5, warmup_steps=2)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))  # trainer_state.json holds it
    assert b.cap == a.cap and math.isfinite(a.cap)
    nxt = torch.rand(8, generator=g) * 2
    out_a, m_a = a(nxt)
    out_b, m_b = b(nxt)
    assert torch.equal(out_a, out_b) and m_a == m_b
    short = RewardCap(quantile=0.9, window=2, warmup_steps=1)  # a shorter window keeps the newest steps
    short.load_state_dict(a.state_dict())
    assert short.state_dict()["steps"] == a.state_dict()["steps"][-2:]


def test_step_rewards_of_all_ranks_set_the_window():
    cap = RewardCap(quantile=0.5, window=2, warmup_steps=1)
    local = torch.tensor([0.0, 1.0])
    cap(local, step_rewards=torch.tensor([0.0, 1.0, 10.0, 11.0]))  # another rank had higher rewards
    # window = 0 1 10 11, h = 0.5 * 3 = 1.5 -> 1 + 0.5 * 9 = 5.5
    assert cap.cap == pytest.approx(5.5) and quantile_cap(torch.tensor([0.0, 1.0, 10.0, 11.0]), 0.5) == pytest.approx(5.5)


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="warmup_steps"):
        RewardCap(quantile=0.9, window=3, warmup_steps=4)
    with pytest.raises(ValueError, match="quantile"):
        RewardCap(quantile=0.0)


def test_config_keys_build_the_cap():
    from scalerl.config import load_config
    from scalerl.errors import ScaleRLError

    rc = load_config(overrides={"reward.cap.enabled": True, "reward.cap.quantile": 0.9, "reward.cap.window": 10}).reward.cap
    cap = RewardCap(quantile=rc.quantile, window=rc.window, warmup_steps=rc.warmup_steps)
    assert (cap.quantile, cap.window, cap.warmup_steps) == (0.9, 10, 5)
    with pytest.raises(ScaleRLError, match="reward.cap"):
        load_config(overrides={"reward.cap.warmup_steps": 30})  # more than the default window of 20
