"""A live forecast of a run's total wall time from the steps, evaluations and saves measured so far.

    total ≈ elapsed + (steps left) · mean step interval + (evals left) · mean eval time
                    + (saves left) · mean save time

The step interval is the wall time between two consecutive logged steps minus the evaluation and
checkpoint time inside it (so logging and console overhead are included), averaged over the steps
after the first `warmup_steps` (the first steps pay one-off costs: allocator growth, lazy kernel
selection). Evaluations and saves left are counted from the run's schedule (`eval.every`, the final
evaluation, `checkpoint.every`, `checkpoint.save_final`). Before any in-loop evaluation has been
measured, the time before the first step (the step-0 evaluation of a fresh run) stands in for one;
a save not yet measured counts as 0 s. "Total" is the time since the trainer's clock started (after
the model is built, just before the step-0 evaluation), i.e. the summary's `wall_time_s`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def count_scheduled(first: int, last: int, every: int, *, include_last: bool) -> int:
    """Steps s in [first, last] with s % every == 0 (every > 0), plus `last` itself when include_last."""
    if last < first:
        return 0
    n = (last // every - (first - 1) // every) if every > 0 else 0
    if include_last and not (every > 0 and last % every == 0):
        n += 1
    return n


@dataclass
class TimeEstimator:
    """Feed it each step's metrics with `update`; it returns the estimated total seconds (None while warming up)."""

    total_steps: int
    start_step: int = 0
    eval_every: int = 0
    checkpoint_every: int = 0
    save_final: bool = True
    warmup_steps: int = 2
    at_fraction: float = 0.1
    intervals: list[float] = field(default_factory=list)
    eval_times: list[float] = field(default_factory=list)
    save_times: list[float] = field(default_factory=list)
    pre_loop_s: float | None = None
    estimate_at_fraction: float | None = None
    _last_elapsed: float | None = None
    _last_save_total: float = 0.0

    def update(self, step: int, *, elapsed_s: float, step_time_s: float, eval_time_s: float | None = None,
               save_time_total_s: float = 0.0) -> float | None:
        """`elapsed_s`: seconds since the clock started, at logging time of `step`; `save_time_total_s`:
        seconds spent saving checkpoints so far (saves happen after logging, so they land in the next gap)."""
        eval_s = eval_time_s or 0.0
        new_save = save_time_total_s - self._last_save_total
        if new_save > 0:
            self.save_times.append(new_save)
        self._last_save_total = save_time_total_s
        if self._last_elapsed is None:
            self.pre_loop_s = max(elapsed_s - step_time_s - eval_s, 0.0)
        elif step - self.start_step > self.warmup_steps:
            self.intervals.append(max(elapsed_s - self._last_elapsed - eval_s - new_save, 0.0))
        if eval_time_s is not None:
            self.eval_times.append(eval_time_s)
        self._last_elapsed = elapsed_s
        estimate = self.estimate(step, elapsed_s)
        if self.estimate_at_fraction is None and estimate is not None and \
                step - self.start_step >= math.ceil(self.at_fraction * (self.total_steps - self.start_step)):
            self.estimate_at_fraction = estimate
        return estimate

    def estimate(self, step: int, elapsed_s: float) -> float | None:
        if not self.intervals:
            return None
        last = self.total_steps
        evals_left = count_scheduled(step + 1, last, self.eval_every, include_last=True)
        saves_left = count_scheduled(step + 1, last, self.checkpoint_every, include_last=self.save_final)
        # A save scheduled at `step` itself has not happened yet when the step is logged.
        saves_left += int(self.checkpoint_every > 0 and step % self.checkpoint_every == 0 or (step == last and self.save_final))
        eval_s = _mean(self.eval_times) if self.eval_times else (self.pre_loop_s if self.start_step == 0 else 0.0) or 0.0
        save_s = _mean(self.save_times) if self.save_times else 0.0
        return elapsed_s + (last - step) * _mean(self.intervals) + evals_left * eval_s + saves_left * save_s

    def summary(self, actual_s: float) -> dict[str, float | None]:
        """The estimate made at `at_fraction` of the run against the measured total; error = (estimate − actual) / actual."""
        est = self.estimate_at_fraction
        return {"time_estimate_at_10pct_s": est, "time_actual_s": actual_s,
                "time_estimate_rel_error": None if est is None else (est - actual_s) / actual_s}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
