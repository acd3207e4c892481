"""Fusion rules by hand: weighted sum, within-group spread, dynamic weights (and their state)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from scalerl.rewards.components import EnvComponent, RewardInputs
from scalerl.rewards.fusion import DynamicState, dynamic_weights, group_spread, weighted_sum
from scalerl.rewards.scorer import RewardScorer

NAN = float("nan")


def test_weighted_sum_by_hand():
    scores = torch.tensor([[1.0, 0.0], [0.5, 0.5]])  # (K=2, B=2)
    # r_0 = 0.3·1 + 0.7·0.5 = 0.65; r_1 = 0.3·0 + 0.7·0.5 = 0.35
    assert weighted_sum(scores, torch.tensor([0.3, 0.7])).tolist() == pytest.approx([0.65, 0.35])


def test_group_spread_is_the_mean_within_group_std():
    # groups of 2: (1, 0) has population std 0.5, (1, 1) has 0 → mean 0.25; second component: (0, 2), (4, 4) → (1 + 0) / 2.
    scores = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 2.0, 4.0, 4.0]])
    assert group_spread(scores, 2).tolist() == pytest.approx([0.25, 0.5])


def _step(scores, state=None, *, ceiling=(1.0, 1.0), floor=(0.0, 0.0), base=(1.0, 1.0), **kw):
    s = torch.tensor(scores, dtype=torch.float64)
    return dynamic_weights(torch.tensor(base), group_spread(s, 2), s.mean(1), s.max(1).values, s.min(1).values, state,
                           ceiling=torch.tensor(ceiling), floor=torch.tensor(floor), **kw)


def test_saturated_component_loses_weight_and_varying_one_gains():
    # Component 0 is saturated (all 1): u = 0, h = (1 − 1)/1 = 0 → ŵ = 1·(0.05 + 0) = 0.05.
    # Component 1 is (1, 0 | 1, 0): each group's std 0.5 → u = 0.5/1; mean 0.5 → h = 0.5 → ŵ = 0.05 + 0.25 = 0.30.
    # Renormalised to the configured total 2: w = (0.05, 0.30) / 0.35 · 2 = (0.285714, 1.714286).
    weights, state = _step([[1, 1, 1, 1], [1, 0, 1, 0]], eps=0.05)
    assert weights.tolist() == pytest.approx([0.285714, 1.714286], abs=1e-6)
    assert weights.sum().item() == pytest.approx(2.0)
    assert state.running_mean.tolist() == [1.0, 0.5]  # the first step starts the running mean at the batch mean


def test_base_weights_scale_the_signal_and_the_total_is_kept():
    # Equal signal (both vary like (1, 0) in every group, mean 0.5): ŵ_k = w0_k·(0.05 + 0.5·0.5) = 0.3·w0_k,
    # so the weights stay at the configured (0.3, 0.7).
    weights, _ = _step([[1, 0, 1, 0], [0, 1, 0, 1]], base=(0.3, 0.7))
    assert weights.tolist() == pytest.approx([0.3, 0.7])


def test_running_mean_ema_and_weight_smoothing():
    state = DynamicState(running_mean=torch.tensor([0.2, 0.2], dtype=torch.float64), running_max=torch.tensor([1.0, 1.0], dtype=torch.float64),
                         running_min=torch.tensor([0.0, 0.0], dtype=torch.float64), weights=torch.tensor([1.0, 1.0], dtype=torch.float64))
    weights, new = _step([[1, 1, 1, 1], [1, 0, 1, 0]], state, mean_ema=0.1, weight_ema=0.5, eps=0.05)
    # m = 0.9·0.2 + 0.1·(1, 0.5) = (0.28, 0.23). h = (0.72, 0.77); u = (0, 0.5).
    # ŵ = (0.05, 0.05 + 0.5·0.77) = (0.05, 0.435) → w = (0.05, 0.435)/0.485·2 = (0.206186, 1.793814).
    # Smoothed with β = 0.5 against (1, 1): (0.603093, 1.396907).
    assert new.running_mean.tolist() == pytest.approx([0.28, 0.23])
    assert weights.tolist() == pytest.approx([0.603093, 1.396907], abs=1e-6)
    assert weights.sum().item() == pytest.approx(2.0)


def test_observed_range_when_no_ceiling_or_floor_is_configured():
    # No ceiling/floor: C, F = running max/min. Component 0 ranged over [0, 4] in an earlier step and now scores
    # (2, 2 | 4, 0): u = (0 + 2)/2 / 4 = 0.25. Its running mean 0.9·3 + 0.1·2 = 2.9 → h = (4 − 2.9)/4 = 0.275.
    # Component 1 never varied (range 0): u = 0, h = 1 → ŵ = ε.
    state = DynamicState(running_mean=torch.tensor([3.0, 1.0], dtype=torch.float64), running_max=torch.tensor([4.0, 1.0], dtype=torch.float64),
                         running_min=torch.tensor([0.0, 1.0], dtype=torch.float64), weights=torch.tensor([1.0, 1.0], dtype=torch.float64))
    weights, new = _step([[2, 2, 4, 0], [1, 1, 1, 1]], state, ceiling=(NAN, NAN), floor=(NAN, NAN), eps=0.05, weight_ema=0.0)
    # ŵ = (0.05 + 0.25·0.275, 0.05) = (0.11875, 0.05) → w = (0.11875, 0.05)/0.16875·2 = (1.407407, 0.592593)
    assert weights.tolist() == pytest.approx([1.407407, 0.592593], abs=1e-6)
    assert new.running_max.tolist() == [4.0, 1.0] and new.running_min.tolist() == [0.0, 1.0]


def _inputs(env_scores):
    n = len(env_scores)
    return RewardInputs([""] * n, [""] * n, [True] * n, [None] * n, [i // 2 for i in range(n)], torch.tensor(env_scores))


def test_scorer_dynamic_weights_metrics_and_state_roundtrip():
    """Two env-backed components seen through the scorer: the saturated one loses weight over steps."""

    class Fixed(EnvComponent):
        def score(self, inputs):
            return torch.ones(len(inputs.completions))  # always at its ceiling

    def make():
        return RewardScorer([EnvComponent("env"), Fixed("fixed")], weights=[0.5, 0.5], fallbacks=[0.0, 0.0], fusion="dynamic_weight",
                            group_size=2, ceilings=[1.0, 1.0], floors=[0.0, 0.0], eps=0.05, mean_ema=0.1, weight_ema=0.0)

    scorer = make()
    rewards, metrics = scorer.score(_inputs([1.0, 0.0, 1.0, 0.0]))
    # env: u = 0.5, h = 0.5 → ŵ = 0.5·0.30 = 0.15; fixed: ŵ = 0.5·0.05 = 0.025 → w = (0.857143, 0.142857) (total 1).
    assert metrics["reward/weight/env"] == pytest.approx(0.857143, abs=1e-6)
    assert metrics["reward/weight/fixed"] == pytest.approx(0.142857, abs=1e-6)
    assert metrics["reward/env_mean"] == 0.5 and metrics["reward/fixed_mean"] == 1.0
    assert rewards.tolist() == pytest.approx([1.0, 0.142857, 1.0, 0.142857], abs=1e-6)
    assert scorer.last_scores["fixed"].tolist() == [1.0] * 4
    # The state goes through JSON (trainer_state.json) and a fresh scorer continues identically.
    restored = make()
    restored.load_state_dict(json.loads(json.dumps(scorer.state_dict())))
    nxt = _inputs([0.0, 1.0, 1.0, 1.0])
    assert restored.score(nxt)[1] == scorer.score(nxt)[1]
    # evaluate() uses the configured weights and leaves the state alone: 0.5·env + 0.5·1.
    before = scorer.state_dict()
    assert scorer.evaluate(_inputs([1.0, 0.0])).tolist() == [1.0, 0.5] and scorer.state_dict() == before


def test_weighted_sum_scorer_uses_configured_weights():
    scorer = RewardScorer([EnvComponent("env")], weights=[0.4], fallbacks=[0.0], fusion="weighted_sum", group_size=2)
    rewards, metrics = scorer.score(_inputs([1.0, 0.0]))
    assert rewards.tolist() == pytest.approx([0.4, 0.0]) and metrics["reward/weight/env"] == pytest.approx(0.4)
    assert not math.isnan(metrics["reward/env_mean"]) and scorer.state_dict()["dynamic"] is None


def test_normalize_within_groups_by_hand():
    from scalerl.rewards.fusion import normalize_within_groups

    # component 0, groups of 2: (1, 0) mean 0.5, Bessel std √0.5 = 0.707107 → ±0.5/0.707107 = ±0.707107 (eps 0); (1, 1) → 0
    # component 1 on a 100× scale: (0, 200) → ∓0.707107, (400, 600) → ∓0.707107: the same size as component 0
    scores = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 200.0, 400.0, 600.0]])
    out = normalize_within_groups(scores, 2, eps=1e-12)
    r = math.sqrt(0.5)
    assert out.flatten().tolist() == pytest.approx([r, -r, 0.0, 0.0, -r, r, -r, r], abs=1e-6)


def test_scorer_normalizes_each_component_before_the_sum():
    """reward.normalize_components (GDPO): a component on a 100× scale no longer drowns the other."""

    class Big(EnvComponent):
        def score(self, inputs):
            return torch.tensor([0.0, 100.0, 50.0, 0.0])

    def scorer(normalize):
        return RewardScorer([EnvComponent("env"), Big("big")], weights=[1.0, 1.0], fallbacks=[0.0, 0.0], fusion="weighted_sum",
                            group_size=2, normalize_components=normalize)

    plain, _ = scorer(False).score(_inputs([1.0, 0.0, 1.0, 0.0]))
    assert plain.tolist() == pytest.approx([1.0, 100.0, 51.0, 0.0])  # env's 0/1 lost in big's 0..100
    fused, metrics = scorer(True).score(_inputs([1.0, 0.0, 1.0, 0.0]))
    # each group: env (1, 0) → (+a, −a), a = 0.5 / (√0.5 + 1e-4); big (0, 100) → (−b, +b), b = 50 / (√5000 + 1e-4) ≈ a
    a, b = 0.5 / (math.sqrt(0.5) + 1e-4), 50.0 / (math.sqrt(5000.0) + 1e-4)
    assert fused.tolist() == pytest.approx([a - b, b - a, a + b, -a - b], abs=1e-5)
    assert metrics["reward/big_mean"] == 37.5  # the metrics keep the raw scores
