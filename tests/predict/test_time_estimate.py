"""The live time estimate on synthetic step, evaluation and checkpoint times."""

from scalerl.predict.time_estimate import TimeEstimator, count_scheduled


def test_count_scheduled():
    assert count_scheduled(1, 100, 10, include_last=True) == 10   # 10, 20, ..., 100
    assert count_scheduled(31, 95, 10, include_last=True) == 7    # 40..90 and 95
    assert count_scheduled(1, 100, 0, include_last=True) == 1
    assert count_scheduled(101, 100, 10, include_last=True) == 0


def simulate(est: TimeEstimator, *, pre: float, step_s: float, eval_s: float, save_s: float, first_extra: float = 0.0):
    """Feed a run whose steps take step_s (the first one first_extra longer), evals eval_s, saves save_s; returns (estimates, actual)."""
    t, saves, out = pre, 0.0, []
    for step in range(1, est.total_steps + 1):
        dt = step_s + (first_extra if step == 1 else 0.0)
        t += dt
        ev = eval_s if (est.eval_every and step % est.eval_every == 0) or step == est.total_steps else None
        t += ev or 0.0
        out.append(est.update(step, elapsed_s=t, step_time_s=dt, eval_time_s=ev, save_time_total_s=saves))
        if (est.checkpoint_every and step % est.checkpoint_every == 0) or (step == est.total_steps and est.save_final):
            t += save_s
            saves += save_s
    return out, t


def test_exact_on_a_regular_run():
    # pre-loop eval 2 s, 100 steps × 0.5 s (+3 s on step 1), evals every 25 (4) × 2 s, saves every 50 (2) × 1 s:
    # actual = 2 + 3 + 50 + 8 + 2 = 65 s. At step 10 (10 %): no in-loop eval yet, so the pre-loop 2 s stands in for
    # one (exact here), no save measured yet (0 s: the 2 s of saves are missed) → 63 s, error −3.1 %.
    est = TimeEstimator(100, 0, eval_every=25, checkpoint_every=50, save_final=True)
    estimates, actual = simulate(est, pre=2.0, step_s=0.5, eval_s=2.0, save_s=1.0, first_extra=3.0)
    assert abs(actual - 65.0) < 1e-9
    assert estimates[0] is None and estimates[1] is None  # the first two steps are warm-up
    assert abs(est.estimate_at_fraction - 63.0) < 1e-9
    assert abs(estimates[60] - 65.0) < 1e-9  # after the first save (step 50) everything is measured
    s = est.summary(actual)
    assert abs(s["time_estimate_rel_error"] - (63.0 - 65.0) / 65.0) < 1e-12


def test_warmup_step_excluded():
    # A 10 s first step would add 10 × 99 s if it counted as the rate; excluded, the estimate at 10 % is exact.
    est = TimeEstimator(100, 0, eval_every=0, checkpoint_every=0, save_final=False)
    _, actual = simulate(est, pre=0.5, step_s=1.0, eval_s=0.5, save_s=0.0, first_extra=10.0)  # 0.5 + 110 + 0.5 (final eval)
    assert abs(est.estimate_at_fraction - actual) < 1e-9
