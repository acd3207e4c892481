"""A live forecast of a run's total wall time that follows the work: per-token costs, measured in the run.

The step's cost model is `scalerl.predict.step_cost.StepCost`, the one `scalerl plan` fits across shapes.

    total ≈ elapsed + Σ_{future steps s} [ a_r + b_r · Ŝ(s)  +  a_l + b_l · T̂(s)  +  o ]
                    + (evals left) · mean eval time + (saves left) · mean save time

    S  sampled positions of a step: completions × the batch's longest completion, what the sampler
       decoded (the engine runs every row until the longest one ends, so padding costs too)
    T  trained positions: completions × (prompt + completion width), what the learner runs forward
       and backward, once per epoch
    a_r + b_r·S   the step's rollout time (sample, score, filter), least squares over the steps seen
    a_l + b_l·T   its learning time (advantages, old/ref log-probs, the epochs, publishing weights)
    o             the rest of the interval between two logged steps (health checks, logging, console)

Ŝ(s) and T̂(s) are the positions' trend over the recent steps (the last half seen, at least 20,
at most 200; tested from 10 on): Sen's line (slope the median of the pairwise slopes, intercept
the median of y − slope·x), kept only when the Mann–Kendall test finds a monotonic trend (|z| ≥ 3,
ties corrected; else the recent mean), and clipped between one token per completion and
`max_new_tokens` per completion. Both are rank-based: a lone long batch (one completion running to
the cap) moves neither, where a least-squares line through it would be carried over every step
left. So a run whose completions grow is priced at the lengths it is heading for, not at the short
ones it began with, and a run whose completions are steady is priced flat. `upper` prices every future step at full
length at the per-position costs measured so far: what the run takes if completions grow to their cap
and cost per position stays. Not a bound: a position of a longer sequence can cost more (the built-in
model's training forward and backward take 23 µs per position at 4-token completions and 42 µs at 48,
batches of 128; on the late_jump benchmark run the figure at 10 % was 79 s against 141 s actual).

With too little spread in a step's positions to separate a fixed part from a per-token one (less
than 2 %), the cost is taken as proportional to the positions (a = 0); a negative fitted part is
dropped the same way. The first `warmup_steps` pay one-off costs (allocator growth, lazy kernel
selection) and are not used. Evaluations and saves left are counted from the run's schedule
(`eval.every`, the final evaluation, `checkpoint.every`, `checkpoint.save_final`); before an
in-loop evaluation has been measured the time before the first step (the step-0 evaluation of a
fresh run) stands in for one; a save not yet measured counts as 0 s. "Total" is the time since the
trainer's clock started (after the model is built, just before the step-0 evaluation), i.e. the
summary's `wall_time_s`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from scalerl.predict.step_cost import StepCost

MIN_TREND_POINTS = 10  # fewer points: the mean
TREND_WINDOW = (20, 200)  # the trend looks at the last half of the steps seen, within these bounds (pairs cost O(n²))
TREND_Z = 3.0  # a trend is used only when the Mann–Kendall z is this far from zero


def count_scheduled(first: int, last: int, every: int, *, include_last: bool) -> int:
    """Steps s in [first, last] with s % every == 0 (every > 0), plus `last` itself when include_last."""
    if last < first:
        return 0
    n = (last // every - (first - 1) // every) if every > 0 else 0
    if include_last and not (every > 0 and last % every == 0):
        n += 1
    return n


@dataclass(frozen=True)
class StepWork:
    """What one step did and what it took, from its metrics (scalerl/trainer/step.py)."""

    step: int
    rollout_s: float
    learn_s: float
    other_s: float  # the logged interval minus the step itself, evaluation and saves
    sampled: float  # positions the sampler decoded
    trained: float  # positions the learner ran
    completions: float

    @classmethod
    def of(cls, step: int, metrics: dict, other_s: float) -> "StepWork":
        return cls(step, metrics["time/rollout_s"], metrics["time/learn_s"], other_s,
                   float(metrics["sampled_positions"]), float(metrics["trained_positions"]), float(metrics["completions"]))


def trend(steps: np.ndarray, values: np.ndarray, future: np.ndarray, low: float, high: float) -> np.ndarray:
    """`values` carried to the `future` steps: Sen's line through the recent half of the points (within
    TREND_WINDOW) when there are MIN_TREND_POINTS and the Mann–Kendall z is at least TREND_Z, else their mean;
    clipped to [low, high]."""
    keep = min(max(TREND_WINDOW[0], len(steps) // 2), TREND_WINDOW[1])
    x, y = steps[-keep:].astype(float), values[-keep:]
    level = np.full(len(future), y.mean())
    if len(x) >= MIN_TREND_POINTS and abs(mann_kendall_z(y)) >= TREND_Z:
        i, j = np.triu_indices(len(x), 1)
        slope = float(np.median((y[j] - y[i]) / (x[j] - x[i])))
        level = slope * future + float(np.median(y - slope * x))
    return np.clip(level, low, max(high, low))


def mann_kendall_z(y: np.ndarray) -> float:
    """The Mann–Kendall statistic of a series in time order, S = Σ_{i<j} sign(y_j − y_i), as a z-score:
    var S = [n(n−1)(2n+5) − Σ_ties t(t−1)(2t+5)] / 18, z = (S − sign S) / √var S (0 when var S = 0)."""
    n = len(y)
    i, j = np.triu_indices(n, 1)
    s = float(np.sign(y[j] - y[i]).sum())
    _, t = np.unique(y, return_counts=True)
    var = (n * (n - 1) * (2 * n + 5) - float((t * (t - 1) * (2 * t + 5)).sum())) / 18
    return 0.0 if var <= 0 else (s - np.sign(s)) / math.sqrt(var)


@dataclass
class TimeEstimator:
    """Feed it each step's metrics with `update`; it returns the estimated total seconds (None while warming up)."""

    total_steps: int
    start_step: int = 0
    eval_every: int = 0
    checkpoint_every: int = 0
    save_final: bool = True
    max_new_tokens: int = 0  # per completion (all turns); 0: no cap known
    warmup_steps: int = 2
    at_fraction: float = 0.1
    work: list[StepWork] = field(default_factory=list)
    eval_times: list[float] = field(default_factory=list)
    save_times: list[float] = field(default_factory=list)
    pre_loop_s: float | None = None
    estimate_at_fraction: float | None = None
    upper_at_fraction: float | None = None
    _last_elapsed: float | None = None
    _last_save_total: float = 0.0

    def update(self, step: int, metrics: dict, *, elapsed_s: float, save_time_total_s: float = 0.0) -> float | None:
        """`metrics`: the step's (with `eval_time_s` when it evaluated); `elapsed_s`: seconds since the clock
        started, at logging time of `step`; `save_time_total_s`: seconds spent saving checkpoints so far
        (saves happen after logging, so they land in the next gap)."""
        eval_s = metrics.get("eval_time_s") or 0.0
        new_save = save_time_total_s - self._last_save_total
        if new_save > 0:
            self.save_times.append(new_save)
        self._last_save_total = save_time_total_s
        if self._last_elapsed is None:
            self.pre_loop_s = max(elapsed_s - metrics["step_time_s"] - eval_s, 0.0)
        elif step - self.start_step > self.warmup_steps:
            interval = max(elapsed_s - self._last_elapsed - eval_s - new_save, 0.0)
            self.work.append(StepWork.of(step, metrics, max(interval - metrics["step_time_s"], 0.0)))
        if metrics.get("eval_time_s") is not None:
            self.eval_times.append(metrics["eval_time_s"])
        self._last_elapsed = elapsed_s
        estimate = self.estimate(step, elapsed_s)
        if self.estimate_at_fraction is None and estimate is not None and \
                step - self.start_step >= math.ceil(self.at_fraction * (self.total_steps - self.start_step)):
            self.estimate_at_fraction, self.upper_at_fraction = estimate, self.estimate(step, elapsed_s, upper=True)
        return estimate

    def estimate(self, step: int, elapsed_s: float, *, upper: bool = False) -> float | None:
        """The total; `upper`: with every future step's completions at max_new_tokens (the same as the
        estimate when no cap is known)."""
        if not self.work:
            return None
        last = self.total_steps
        future = np.arange(step + 1, last + 1, dtype=float)
        steps_left = self._steps_cost(future, upper) if len(future) else 0.0
        evals_left = count_scheduled(step + 1, last, self.eval_every, include_last=True)
        saves_left = count_scheduled(step + 1, last, self.checkpoint_every, include_last=self.save_final)
        # A save scheduled at `step` itself has not happened yet when the step is logged.
        saves_left += int(self.checkpoint_every > 0 and step % self.checkpoint_every == 0 or (step == last and self.save_final))
        eval_s = _mean(self.eval_times) if self.eval_times else (self.pre_loop_s if self.start_step == 0 else 0.0) or 0.0
        save_s = _mean(self.save_times) if self.save_times else 0.0
        return elapsed_s + steps_left + evals_left * eval_s + saves_left * save_s

    def _steps_cost(self, future: np.ndarray, upper: bool) -> float:
        w = self.work[-500:]  # costs from the recent steps (a machine's speed can drift over a long run)
        steps = np.array([x.step for x in w])
        sampled, trained = np.array([x.sampled for x in w]), np.array([x.trained for x in w])
        completions = w[-1].completions
        prompt = max(trained[-1] - sampled[-1], 0.0)  # the latest batch's prompt positions
        cap = completions * self.max_new_tokens if self.max_new_tokens else math.inf
        if upper and math.isfinite(cap):
            s_hat, t_hat = np.full(len(future), cap), np.full(len(future), prompt + cap)
        else:
            s_hat = trend(steps, sampled, future, completions, cap)
            t_hat = trend(steps, trained, future, prompt + completions, prompt + cap)
        cost = StepCost.fit(sampled, np.array([x.rollout_s for x in w]), trained, np.array([x.learn_s for x in w]),
                            np.array([x.other_s for x in w]))
        return cost.total(s_hat, t_hat)

    def summary(self, actual_s: float) -> dict[str, float | None]:
        """The estimate made at `at_fraction` of the run against the measured total; error = (estimate − actual) / actual."""
        est = self.estimate_at_fraction
        return {"time_estimate_at_10pct_s": est, "time_upper_at_10pct_s": self.upper_at_fraction, "time_actual_s": actual_s,
                "time_estimate_rel_error": None if est is None else (est - actual_s) / actual_s}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
