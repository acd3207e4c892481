"""Health rules over each step's metrics: pure functions with the rule in the docstring, and
`HealthMonitor`, which keeps the short histories they need and turns findings into `Event`s.

No torch and no trainer here: what the trainer does about an event (raise β, halve the lr,
restore a snapshot, dump the batch) are in `scalerl/learner/recovery.py` and `scalerl/trainer/health_guard.py`.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any, Sequence

from scalerl.config import HealthConfig
from scalerl.monitor.events import Event


def setting_text(value: float) -> str:
    """A configured number as its shortest exact text: 10 -> '10', 0.2 -> '0.2', 1e-9 -> '1e-09'."""
    return f"{value:g}" if float(f"{value:g}") == value else repr(value)


def digits_apart(x: float, limit: float, start: int = 3, *, limit_text: str | None = None) -> int:
    """The fewest significant digits (at least `start`) at which `x` printed with them compares with the
    printed limit (`limit_text`, or `limit` with as many digits) as the numbers themselves do: 10.04
    against 10 needs 4 ("10.04 > 10"), never "10 > 10"."""
    for d in range(start, 18):
        px = float(f"{x:.{d}g}")
        pl = float(limit_text) if limit_text is not None else float(f"{limit:.{d}g}")
        if (px > pl) == (x > limit) and (px < pl) == (x < limit):
            return d
    return 17


def apart(x: float, limit: float, start: int = 3, *, setting: bool = False) -> tuple[str, str]:
    """(x, limit) as text whose comparison reads as the numbers' does; a `setting` limit is printed
    exactly (`setting_text`), a computed one with the digits x needs."""
    limit_text = setting_text(limit) if setting else None
    d = digits_apart(x, limit, start, limit_text=limit_text)
    return f"{x:.{d}g}", limit_text if limit_text is not None else f"{limit:.{d}g}"


def kl_side(kl: float, band: tuple[float, float]) -> str:
    """'below' if KL < low, 'above' if KL > high, else 'inside' (the band is closed)."""
    return "below" if kl < band[0] else "above" if kl > band[1] else "inside"


def kl_explosion(kl: float, recent: Sequence[float], *, band_high: float, explosion_factor: float,
                 jump_factor: float, min_history: int) -> str | None:
    """Why this KL is an explosion, or None. An explosion is either

        KL > explosion_factor · high                                      (absolute), or
        KL > high  and  KL > jump_factor · median(recent)  with ≥ min_history values  (a jump).

    The jump must also leave the band, so that 0.001 → 0.02 early in training is not one.
    """
    if kl > explosion_factor * band_high:
        x, limit = apart(kl, explosion_factor * band_high, 4)
        return f"{x} > {setting_text(explosion_factor)} x band high {setting_text(band_high)} = {limit}"
    if kl > band_high and len(recent) >= min_history:
        median = statistics.median(recent)
        if kl > jump_factor * median:
            d = max(digits_apart(kl, jump_factor * median, 4), digits_apart(kl, band_high, 4, limit_text=setting_text(band_high)))
            return (f"{kl:.{d}g} > band high {setting_text(band_high)} and > {setting_text(jump_factor)} x recent median {median:.{d}g} "
                    f"= {jump_factor * median:.{d}g}")
    return None


def reward_collapse(reward: float, recent: Sequence[float], *, k: float, margin: float,
                    min_history: int) -> tuple[bool, float, float]:
    """(collapsed, μ, σ) with μ, σ the mean and population std of `recent` (the previous steps):

        collapsed = len(recent) ≥ min_history  and  reward < μ − k·σ  and  μ − reward > margin

    The margin keeps a near-constant reward (σ ≈ 0) from firing on a tiny dip.
    """
    if len(recent) < min_history:
        return False, math.nan, math.nan
    mu, sigma = statistics.fmean(recent), statistics.pstdev(recent)
    return reward < mu - k * sigma and mu - reward > margin, mu, sigma


def linear_trend(values: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares line through (i, y_i), i = 0..n−1: (slope b, t = b / SE(b), residual std).

        b = Σ(x−x̄)(y−ȳ) / Σ(x−x̄)²,  SE(b) = sqrt(Σe² / (n−2) / Σ(x−x̄)²),  residual std = sqrt(Σe² / n)

    SE(b) = 0 (a perfect line) gives t = ±inf, or 0 for a flat line.
    """
    n = len(values)
    xm, ym = (n - 1) / 2, statistics.fmean(values)
    sxx = sum((i - xm) ** 2 for i in range(n))
    b = sum((i - xm) * (y - ym) for i, y in enumerate(values)) / sxx
    sse = sum((y - (ym + b * (i - xm))) ** 2 for i, y in enumerate(values))
    se = math.sqrt(sse / (n - 2) / sxx) if n > 2 else 0.0
    t = b / se if se > 0 else (0.0 if b == 0 else math.copysign(math.inf, b))
    return b, t, math.sqrt(sse / n)


def direction_flips(values: Sequence[float]) -> float:
    """Fraction of consecutive differences d_i, d_{i+1} with opposite signs (d_i · d_{i+1} < 0).
    White noise gives about 2/3; a monotone or flat curve 0."""
    d = [b - a for a, b in zip(values, values[1:])]
    if len(d) < 2:
        return 0.0
    return sum(1 for a, b in zip(d, d[1:]) if a * b < 0) / (len(d) - 1)


def phase_verdict(rewards: Sequence[float], *, sampling_se: float, min_steps: int = 8, t_threshold: float = 2.0,
                  min_change: float = 0.02, oscillation_ratio: float = 3.0) -> dict[str, Any]:
    """The run's phase from the last half of its reward_mean curve (y, n = ⌈len/2⌉ points):

        too_short    fewer than min_steps rewards in all
        rising       t > t_threshold and b·(n−1) > min_change      (b, t from `linear_trend`)
        falling      t < −t_threshold and b·(n−1) < −min_change
        oscillating  otherwise, if direction_flips(y) ≥ 0.5 and residual std > oscillation_ratio · sampling_se
        plateau      otherwise

    `sampling_se` is the standard error of one step's reward mean from sampling alone (about
    reward_std / sqrt(completions per step)); swings within a few of it are noise, not oscillation.
    """
    if len(rewards) < min_steps:
        return {"verdict": "too_short", "points": len(rewards)}
    y = list(rewards[len(rewards) // 2:])
    b, t, resid = linear_trend(y)
    flips = direction_flips(y)
    change = b * (len(y) - 1)
    stats = {"points": len(y), "slope": b, "t": t, "change": change, "residual_std": resid,
             "direction_flips": flips, "sampling_se": sampling_se}
    if t > t_threshold and change > min_change:
        verdict = "rising"
    elif t < -t_threshold and change < -min_change:
        verdict = "falling"
    elif flips >= 0.5 and resid > oscillation_ratio * sampling_se:
        verdict = "oscillating"
    else:
        verdict = "plateau"
    return {"verdict": verdict, **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in stats.items()}}


def scaler_overflow(metrics: dict[str, Any]) -> bool:
    """fp16's loss scaler skipped an update whose scaled gradient overflowed (the loss itself finite)."""
    return bool(metrics.get("loss_scale_overflows")) and math.isfinite(metrics["loss"])


class HealthMonitor:
    """Evaluates every rule on one step's metrics (the same on every rank, so responses agree).

    Rules and their event names: `kl_inactive` (info, once), `kl_band` (warning, on leaving the
    band), `kl_explosion` (critical), `nonfinite` (critical), `reward_collapse` (critical),
    `reward_plateau` (warning, once per plateau), `grad_norm` (warning, once per excursion above the
    limit, at most once per `grad_norm.cooldown` steps), `no_signal` (warning, once per stretch of
    `no_signal.steps` steps with all rewards equal or a zero gradient), and `pass_rate_drop` (critical, judged on each
    held-out evaluation by `evaluate_pass_rate`). A non-finite step is judged by that rule alone and
    does not enter the histories.
    """

    def __init__(self, config: HealthConfig, *, completions_per_step: int):
        self.config = config
        self.completions_per_step = completions_per_step
        self.kl_history: deque[float] = deque(maxlen=config.window)
        self.reward_history: deque[float] = deque(maxlen=config.window)
        self.rewards: list[float] = []  # the whole curve, for the phase verdict
        self.reward_stds: list[float] = []
        self.kl_state = "inside"
        self.kl_inactive_said = False
        self.last_explosion: int | None = None
        self.best: float | None = None
        self.best_step = 0
        self.since_best = 0
        self.nonfinite_streak = 0
        self.nonfinite_first = 0
        self.grad_above = False
        self.grad_history: deque[float] = deque(maxlen=config.grad_norm.window)
        self.grad_warned_at: int | None = None
        self.grad_unannounced = 0
        self.best_pass_rate: float | None = None
        self.best_pass_rate_step = 0
        self.low_evals = 0  # evaluations in a row more than pass_rate_drop.max_drop below the best
        self.drop_said = False
        self.no_signal_streak = 0
        self.no_signal_said = False

    def state_dict(self) -> dict[str, Any]:
        """Everything the rules remember (histories, streaks, what was said), JSON-ready: a checkpoint
        keeps it, so a resumed run judges its next step exactly as the uninterrupted run would."""
        return {k: list(v) if isinstance(v, deque) else v for k, v in vars(self).items() if k not in ("config", "completions_per_step")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            current = getattr(self, key)
            setattr(self, key, deque(value, maxlen=current.maxlen) if isinstance(current, deque) else value)

    def observe(self, step: int, metrics: dict[str, Any]) -> None:
        """Add a good step to the histories (also how a resumed run replays metrics.jsonl)."""
        if metrics.get("eval/pass_rate") is not None:
            self.evaluate_pass_rate(step, metrics["eval/pass_rate"])
        kl = metrics.get(self.config.kl.metric)
        if kl is not None:
            self.kl_history.append(kl)
        self.grad_above = metrics["grad_norm"] > self.grad_limit()[0]  # an excursion in progress (resume included)
        self.grad_history.append(metrics["grad_norm"])
        reward = metrics["reward_mean"]
        self.reward_history.append(reward)
        self.rewards.append(reward)
        self.reward_stds.append(metrics["reward_std"])
        if len(self.rewards) < self.config.plateau.smooth:  # a partial window is too noisy to set the best
            return
        smoothed = statistics.fmean(self.rewards[-self.config.plateau.smooth:])
        if self.best is None or smoothed > self.best + self.config.plateau.min_delta:
            self.best, self.best_step, self.since_best = smoothed, step, 0
        else:
            self.since_best += 1

    def evaluate(self, step: int, metrics: dict[str, Any]) -> list[Event]:
        """The step's events (actions still None: the trainer fills in what it did)."""
        cfg = self.config
        if scaler_overflow(metrics):  # fp16: skipped and the scale halved, as planned; nothing to judge
            return []
        if not all(math.isfinite(metrics[k]) for k in ("loss", "grad_norm")):
            self.nonfinite_streak += 1
            self.nonfinite_first = self.nonfinite_first if self.nonfinite_streak > 1 else step
            return [Event(step, "nonfinite", "critical",
                          f"loss {metrics['loss']:.4g}, gradient norm {metrics['grad_norm']:.4g}: the update was skipped "
                          f"({self.nonfinite_streak} in a row, limit {cfg.nonfinite.max_consecutive})",
                          values={"loss": metrics["loss"], "grad_norm": metrics["grad_norm"],
                                  "consecutive": self.nonfinite_streak})]
        self.nonfinite_streak = 0
        events = self._kl_events(step, metrics.get(cfg.kl.metric)) if cfg.kl.enabled else []
        was_above = self.grad_above
        if cfg.collapse.enabled:
            collapsed, mu, sigma = reward_collapse(metrics["reward_mean"], self.reward_history, k=cfg.collapse.k,
                                                   margin=cfg.collapse.margin, min_history=cfg.min_history)
            if collapsed:
                reward, floor = metrics["reward_mean"], mu - cfg.collapse.k * sigma
                margin = setting_text(cfg.collapse.margin)
                d = max(digits_apart(reward, floor), digits_apart(mu - reward, cfg.collapse.margin, limit_text=margin))
                events.append(Event(step, "reward_collapse", "critical",
                                    f"reward_mean {reward:.{d}g} fell below the last {len(self.reward_history)} steps' mean "
                                    f"{mu:.{d}g} - {cfg.collapse.k:g} x std {sigma:.{d}g} = {floor:.{d}g}, and is {mu - reward:.{d}g} "
                                    f"below that mean (more than the margin {margin}): check the batch for contaminated data",
                                    values={"reward_mean": reward, "window_mean": mu, "window_std": sigma, "floor": floor,
                                            "k": cfg.collapse.k, "margin": cfg.collapse.margin}))
        limit, why = self.grad_limit()
        if cfg.grad_norm.enabled and metrics["grad_norm"] > limit and not was_above:  # an excursion starts
            events += self._grad_norm_event(step, metrics["grad_norm"], limit, why)
        if cfg.no_signal.enabled:
            events += self._no_signal_event(step, metrics)
        self.observe(step, metrics)
        if cfg.plateau.enabled and self.since_best == cfg.plateau.patience:  # once per plateau: a new best re-arms it
            events.append(self._plateau_event(step))
        return events

    def _plateau_event(self, step: int) -> Event:
        """The plateau warning, with the numbers the rule compared: a new best needs the smoothed reward
        above best + min_delta, so "now" (possibly above the best, by less than the margin) is set against that."""
        p = self.config.plateau
        now = statistics.fmean(self.rewards[-p.smooth:])
        need = self.best + p.min_delta
        d = digits_apart(now, need)
        return Event(step, "reward_plateau", "warning",
                     f"no new best smoothed reward (mean reward_mean of the last {p.smooth} steps) for {self.since_best} steps "
                     f"(patience {p.patience}): now {now:.{d}g}, not above the {need:.{d}g} a new best needs "
                     f"(best {self.best:.{d}g} at step {self.best_step} + min_delta {p.min_delta:g})",
                     values={"best": self.best, "best_step": self.best_step, "steps_since_best": self.since_best,
                             "smoothed": now, "needed": need, "min_delta": p.min_delta, "patience": p.patience, "smooth": p.smooth})

    def evaluate_pass_rate(self, step: int, pass_rate: float) -> list[Event]:
        """The `pass_rate_drop` rule on a held-out evaluation (step 0: the one before training)."""
        cfg = self.config.pass_rate_drop
        if self.best_pass_rate is None or pass_rate > self.best_pass_rate:
            self.best_pass_rate, self.best_pass_rate_step, self.low_evals, self.drop_said = pass_rate, step, 0, False
            return []
        self.low_evals = self.low_evals + 1 if pass_rate < self.best_pass_rate - cfg.max_drop else 0
        if not cfg.enabled or self.drop_said or self.low_evals < cfg.evals:
            return []
        self.drop_said = True
        drop, max_drop = self.best_pass_rate - pass_rate, setting_text(cfg.max_drop)
        d = digits_apart(drop, cfg.max_drop, limit_text=max_drop)
        return [Event(step, "pass_rate_drop", "critical",
                      f"held-out pass rate {pass_rate:.{d}g} is {drop:.{d}g} below its best {self.best_pass_rate:.{d}g} "
                      f"(step {self.best_pass_rate_step}), more than max_drop {max_drop}, for {self.low_evals} evaluations "
                      "in a row: the policy is degrading; "
                      f"its best weights are the checkpoint nearest step {self.best_pass_rate_step}",
                      values={"pass_rate": pass_rate, "best": self.best_pass_rate, "best_step": self.best_pass_rate_step,
                              "low_evals": self.low_evals})]

    def grad_limit(self) -> tuple[float, str]:
        """(the norm above which a step is an excursion, how it was set): the lower of `max` and `factor` × the
        median of the last `window` norms (once there are health.min_history of them); inf when neither applies."""
        cfg, limits = self.config.grad_norm, []
        if cfg.max is not None:
            limits.append((cfg.max, "max"))
        if cfg.factor is not None and len(self.grad_history) >= self.config.min_history:
            limits.append((cfg.factor * statistics.median(self.grad_history), "factor"))
        return min(limits) if limits else (math.inf, "")

    def _grad_norm_event(self, step: int, norm: float, limit: float, why: str) -> list[Event]:
        """A warning for an excursion above the limit, unless the last one was under `cooldown` steps ago (then it is counted)."""
        cfg = self.config.grad_norm
        if self.grad_warned_at is not None and step - self.grad_warned_at < cfg.cooldown:
            self.grad_unannounced += 1
            return []
        n = self.grad_unannounced
        since = f"; {n} more excursion{'s' * (n != 1)} since the warning at step {self.grad_warned_at}" if n else ""
        if why == "max":
            x, shown = apart(norm, cfg.max, setting=True)
            text = f"gradient norm {x} > {shown} (before clipping){since}"
        else:
            median = statistics.median(self.grad_history)
            x, shown = apart(norm, limit)
            text = (f"gradient norm {x} > {cfg.factor:g} x the median {median:.3g} of the last {len(self.grad_history)} steps = {shown} "
                    f"(before clipping){since}")
        event = Event(step, "grad_norm", "warning", text,
                      values={"grad_norm": norm, "limit": limit, "max": cfg.max, "factor": cfg.factor,
                              "unannounced_excursions": self.grad_unannounced})
        self.grad_warned_at, self.grad_unannounced = step, 0
        return [event]

    def _no_signal_event(self, step: int, metrics: dict[str, Any]) -> list[Event]:
        """A warning once per stretch of `no_signal.steps` steps in a row where nothing can be learned."""
        equal_rewards = metrics["reward_std"] <= 1e-6  # a std from sums is ~1e-9, not 0, when every reward is equal
        if not equal_rewards and metrics["grad_norm"] > 0:
            self.no_signal_streak, self.no_signal_said = 0, False
            return []
        self.no_signal_streak += 1
        if self.no_signal_said or self.no_signal_streak < self.config.no_signal.steps:
            return []
        self.no_signal_said = True
        why = (f"every reward was {metrics['reward_mean']:.4g}" if equal_rewards
               else "the gradient was 0 (every group's rewards were equal, so every advantage was 0)")
        return [Event(step, "no_signal", "warning",
                      f"no learning signal for {self.no_signal_streak} steps in a row: {why}, so the weights do not move; "
                      "check the reward (reward.* and the environment's score), or sample more diversely (rollout.temperature, group_size)",
                      values={"steps": self.no_signal_streak, "reward_mean": metrics["reward_mean"], "reward_std": metrics["reward_std"]})]

    def _kl_events(self, step: int, kl: float | None) -> list[Event]:
        cfg = self.config.kl
        if kl is None:
            if self.kl_inactive_said:
                return []
            self.kl_inactive_said = True
            return [Event(step, "kl_inactive", "info", f"no reference model, so no {cfg.metric}: the KL rules are off "
                          "(algorithm.kl.track=true measures it at one extra forward per step)")]
        values = {"kl": kl, "kl_metric": cfg.metric, "band_low": cfg.band[0], "band_high": cfg.band[1]}
        reason = kl_explosion(kl, self.kl_history, band_high=cfg.band[1], explosion_factor=cfg.explosion_factor,
                              jump_factor=cfg.jump_factor, min_history=self.config.min_history)
        side, was = kl_side(kl, cfg.band), self.kl_state
        if side == "below" and len(self.kl_history) < self.config.min_history:
            side = "inside"  # KL starts at exactly 0 (policy = reference): too low only once it has had time to move
        self.kl_state = side
        if reason and (self.last_explosion is None or step - self.last_explosion >= cfg.cooldown_steps):
            self.last_explosion = step
            median = statistics.median(self.kl_history) if self.kl_history else None
            return [Event(step, "kl_explosion", "critical", f"{cfg.metric} exploded: {reason}",
                          values={**values, "recent_median": median})]
        if side != "inside" and side != was:
            low, high = setting_text(cfg.band[0]), setting_text(cfg.band[1])
            d = digits_apart(kl, cfg.band[0], 4, limit_text=low) if side == "below" else digits_apart(kl, cfg.band[1], 4, limit_text=high)
            return [Event(step, "kl_band", "warning", f"{cfg.metric} {kl:.{d}g} is {side} the healthy band [{low}, {high}]", values=values)]
        return []

    def verdict(self) -> dict[str, Any]:
        """`phase_verdict` of the reward curve so far, with the sampling error from its reward_std."""
        half = self.reward_stds[len(self.reward_stds) // 2:]
        se = statistics.median(half) / math.sqrt(self.completions_per_step) if half else 0.0
        p = self.config.phase
        return phase_verdict(self.rewards, sampling_se=se, min_steps=p.min_steps, t_threshold=p.t_threshold,
                             min_change=p.min_change, oscillation_ratio=p.oscillation_ratio)
