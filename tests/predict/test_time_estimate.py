"""The live time estimate on synthetic runs: step costs that grow with the positions sampled and trained,
completions that stay put, grow, or grow into their cap, evaluations and checkpoints."""

import numpy as np

from scalerl.predict.step_cost import LinearCost
from scalerl.predict.time_estimate import TimeEstimator, count_scheduled, mann_kendall_z, trend

N, PROMPT = 64, 8  # completions per step, prompt width
ROLLOUT, LEARN, OTHER = (0.05, 1e-4), (0.02, 2e-4), 0.01  # fixed s + s per position; the rest of the interval


def test_count_scheduled():
    assert count_scheduled(1, 100, 10, include_last=True) == 10   # 10, 20, ..., 100
    assert count_scheduled(31, 95, 10, include_last=True) == 7    # 40..90 and 95
    assert count_scheduled(1, 100, 0, include_last=True) == 1
    assert count_scheduled(101, 100, 10, include_last=True) == 0


def step_metrics(width: float, *, scale: float = 1.0, extra: float = 0.0) -> dict:
    sampled, trained = N * width, N * (PROMPT + width)
    rollout_s = scale * (ROLLOUT[0] + ROLLOUT[1] * sampled) + extra
    learn_s = scale * (LEARN[0] + LEARN[1] * trained)
    return {"time/rollout_s": rollout_s, "time/learn_s": learn_s, "step_time_s": rollout_s + learn_s, "completions": N,
            "sampled_positions": sampled, "trained_positions": trained}


def simulate(est: TimeEstimator, width, *, pre: float = 0.0, eval_s: float = 0.0, save_s: float = 0.0, first_extra: float = 0.0):
    """Feed a run whose step s has completions `width(s)` wide (its cost as above, step 1 `first_extra` longer),
    evals of eval_s and saves of save_s on the estimator's schedule; returns (estimates, actual total)."""
    t, saves, out = pre, 0.0, []
    for step in range(1, est.total_steps + 1):
        m = step_metrics(width(step), extra=first_extra if step == 1 else 0.0)
        t += m["step_time_s"] + OTHER
        if (est.eval_every and step % est.eval_every == 0) or step == est.total_steps:
            m["eval_time_s"] = eval_s
            t += eval_s
        out.append(est.update(step, m, elapsed_s=t, save_time_total_s=saves))
        if (est.checkpoint_every and step % est.checkpoint_every == 0) or (step == est.total_steps and est.save_final):
            t += save_s
            saves += save_s
    return out, t


def test_exact_on_a_regular_run():
    # Constant width 4: a step takes 0.05 + 0.0256 + 0.02 + 0.1536 + 0.01 = 0.2592 s (+3 s on step 1); pre-loop eval
    # 2 s, evals every 25 (4) × 2 s, saves every 50 (2) × 1 s. At step 10 (10 %): no in-loop eval yet, so the
    # time before step 1's log line (2 s + the first 0.01 s of logging) stands in for each of the 4 left; no save
    # measured yet (0 s): the estimate misses the 2 s of saves.
    est = TimeEstimator(100, 0, eval_every=25, checkpoint_every=50, save_final=True, max_new_tokens=16)
    estimates, actual = simulate(est, lambda s: 4, pre=2.0, eval_s=2.0, save_s=1.0, first_extra=3.0)
    assert abs(actual - (2 + 3 + 100 * 0.2592 + 8 + 2)) < 1e-9
    assert estimates[0] is None and estimates[1] is None  # the first two steps are warm-up
    assert abs(est.estimate_at_fraction - (actual - 2.0 + 4 * OTHER)) < 1e-9
    assert abs(estimates[60] - actual) < 1e-9  # after the first save (step 50) everything is measured
    assert abs(est.summary(actual)["time_estimate_rel_error"] - (4 * OTHER - 2.0) / actual) < 1e-12
    # All 16 tokens wide from step 11 on. With one width seen, a fixed part cannot be told from a per-token one, so
    # the whole cost scales with the positions: rollout 0.0756 s × (1024/256 − 1), learning 0.1736 s × (1536/768 − 1).
    assert abs(est.upper_at_fraction - (est.estimate_at_fraction + 90 * (0.0756 * 3 + 0.1736 * 1))) < 1e-9


def test_warmup_step_excluded():
    # A 10 s first step would add 10 × 99 s if it counted as the rate; excluded, the estimate at 10 % is exact
    # but for the first step's 0.01 s of logging, in the pre-loop time that stands in for the final evaluation.
    est = TimeEstimator(100, 0, eval_every=0, checkpoint_every=0, save_final=False)
    _, actual = simulate(est, lambda s: 4, pre=0.5, eval_s=0.5, first_extra=10.0)
    assert abs(est.estimate_at_fraction - (actual + OTHER)) < 1e-9


def test_growing_completions_priced_at_the_lengths_they_are_heading_for():
    # Width grows by one token every 5 steps (2 → 42 over 200 steps): the mean step so far prices the run at its
    # short start and misses by about 40 %; the per-token model with the positions' trend is exact (a straight line).
    est = TimeEstimator(200, 0, max_new_tokens=64)
    _, actual = simulate(est, lambda s: 2 + s // 5)
    at = 20  # 10 % of the run
    per_step = np.mean([step_metrics(2 + s // 5)["step_time_s"] + OTHER for s in range(3, at + 1)])
    assert abs(est.estimate_at_fraction - actual) / actual < 0.01
    elapsed = sum(step_metrics(2 + s // 5)["step_time_s"] + OTHER for s in range(1, at + 1))
    assert abs(elapsed + (200 - at) * per_step - actual) / actual > 0.3  # what a per-step mean would have said


def test_growth_stops_at_the_cap():
    # Width 2 + s/2 would pass max_new_tokens = 24 at step 44: every step after is priced at 24, not on the line.
    est = TimeEstimator(300, 0, max_new_tokens=24)
    _, actual = simulate(est, lambda s: min(2 + s // 2, 24))
    assert abs(est.estimate_at_fraction - actual) / actual < 0.02
    assert est.upper_at_fraction >= est.estimate_at_fraction
    unclipped = trend(np.arange(3, 31), np.array([N * (2 + s // 2) for s in range(3, 31)], float), np.arange(31, 301.0), N, np.inf)
    assert unclipped.max() > N * 100  # the line itself runs far past the cap


def test_steady_noisy_lengths_give_no_spurious_trend():
    # Width 6 ± 1 at random: the slope test keeps the recent mean, so the estimate is within 2 %.
    rng = np.random.default_rng(0)
    widths = {s: 6 + int(rng.integers(-1, 2)) for s in range(1, 1001)}
    est = TimeEstimator(1000, 0, max_new_tokens=32)
    _, actual = simulate(est, widths.__getitem__)
    assert abs(est.estimate_at_fraction - actual) / actual < 0.02
    assert est.upper_at_fraction > 1.5 * actual  # at 32 wide every step would cost far more


def test_a_lone_long_batch_does_not_move_the_estimate():
    # The widths of a real steady run (bench/time_estimate.py, steady_seed0, steps 20-44): 4 or 5 tokens, a few
    # 6s and one batch 8 wide at step 44. A least-squares line through the last 20 steps finds a slope in that
    # last point (t > 3) and carries it over the 956 steps left; the rank-based trend keeps the recent mean.
    tail = [4, 4, 4, 6, 4, 5, 5, 4, 4, 5, 4, 4, 4, 5, 4, 5, 4, 5, 5, 4, 5, 6, 6, 5, 8]
    widths = {s: tail[s - 20] if 20 <= s < 20 + len(tail) else 4 + s % 2 for s in range(1, 1001)}
    est = TimeEstimator(1000, 0, max_new_tokens=32)
    estimates, actual = simulate(est, widths.__getitem__)
    assert abs(estimates[43] - estimates[42]) / estimates[42] < 0.02
    assert abs(estimates[43] - actual) / actual < 0.03


def test_mann_kendall_z():
    # 0..9 rising: S = 45, var S = 10·9·25 / 18 = 125, z = (45 − 1) / √125; falling: the same, negative.
    assert abs(mann_kendall_z(np.arange(10.0)) - 44 / 125 ** 0.5) < 1e-12
    assert abs(mann_kendall_z(np.arange(10.0)[::-1]) + 44 / 125 ** 0.5) < 1e-12
    # 1 1 2 2: S = 4, two ties of 2: var S = (4·3·13 − 2·2·1·9) / 18 = 120 / 18, z = 3 / √(120/18).
    assert abs(mann_kendall_z(np.array([1.0, 1, 2, 2])) - 3 / (120 / 18) ** 0.5) < 1e-12
    assert mann_kendall_z(np.full(10, 2.0)) == 0.0          # all ties: no trend, no division by zero
    assert abs(mann_kendall_z(np.array([4.0, 5, 4, 4, 5, 4, 5, 5, 4, 16]))) < 3  # one high last point is no trend


def test_fixed_and_per_position_costs_are_separated():
    x = np.array([100.0, 200, 300, 400])
    cost = LinearCost.fit(x, 0.5 + 0.01 * x)
    assert abs(cost.fixed - 0.5) < 1e-9 and abs(cost.per_position - 0.01) < 1e-12
    assert LinearCost.fit(np.full(4, 100.0), np.full(4, 2.0)) == LinearCost(0.0, 0.02)  # no spread: proportional
    assert LinearCost.fit(x, 5 - 0.001 * x).per_position == 0.0  # cost falling with positions: a constant
