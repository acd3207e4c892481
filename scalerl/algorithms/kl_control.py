"""The KL coefficient β over training: fixed, adaptive (a target-KL controller), or progressive
(a fixed three-phase schedule). This is the only stateful piece of the KL penalty; the penalty
itself is `kl.kl_estimate` times β inside the loss.
"""

from __future__ import annotations

import math

SCHEDULES = ("fixed", "adaptive", "progressive")


def progressive_beta(step: int, total_steps: int, *, beta_init: float, beta_min: float, beta_target: float) -> float:
    """Progressive β schedule, three phases over T = total_steps (ScaleRL seed document 000, §2.2):

        t < 0.1 T:          β_t = β_init · (1 + 0.5 · sin(t / 100))
        0.1 T ≤ t < 0.6 T:  β_t = max(β_min, β_init · sqrt(t / T))
        t ≥ 0.6 T:          β_t = β_min + (β_target − β_min) · (t / T)²

    t = step is 0-based. The formulas are taken as written, so β jumps at both phase boundaries
    (in general; the jump is the right-hand value minus the left-hand limit):

        at t = 0.1 T:  max(β_min, β_init · sqrt(0.1)) − β_init · (1 + 0.5 · sin(T / 1000))
        at t = 0.6 T:  β_min + 0.36 · (β_target − β_min) − max(β_min, β_init · sqrt(0.6))

    E.g. β_init = 0.1, β_min = 0.01, β_target = 0.05, T = 1000: β falls from ≈ 0.1421 (the limit;
    0.1418 at t = 99) to 0.0316 at t = 100, and from ≈ 0.0775 to 0.0244 at t = 600. The sine makes
    phase one oscillate with a period of 200π ≈ 628 steps; it rises throughout only when phase one
    ends before the first peak, t = 50π ≈ 157, i.e. T ≤ 1570.
    """
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    t, T = step, total_steps
    if t < 0.1 * T:
        return beta_init * (1.0 + 0.5 * math.sin(t / 100.0))
    if t < 0.6 * T:
        return max(beta_min, beta_init * math.sqrt(t / T))
    return beta_min + (beta_target - beta_min) * (t / T) ** 2


def adaptive_beta_update(beta: float, measured_kl: float, *, target_kl: float, horizon: int, n_steps: int = 1) -> float:
    """Adaptive KL controller (Ziegler et al., 2019, "Fine-tuning language models from human
    preferences", §2.2):

        e = clip(KL / KL_target − 1, −0.2, 0.2)
        β ← β · (1 + e · n / H)

    KL above target raises β, below lowers it; each update changes β by at most 0.2 n / H.
    `n_steps` is n (steps, or samples as in the paper, since the last update), `horizon` is H.
    """
    if target_kl <= 0 or horizon <= 0:
        raise ValueError(f"target_kl and horizon must be positive, got {target_kl} and {horizon}")
    error = min(max(measured_kl / target_kl - 1.0, -0.2), 0.2)
    return beta * (1.0 + error * n_steps / horizon)


class KLController:
    """β for each training step, under one of the three schedules.

    fixed: β throughout. progressive: `progressive_beta` with β_init = β. adaptive: starts at β
    and moves with `update` after each step's measured KL; its current β is the state that a
    checkpoint must save.

    On top of every schedule sits the health monitor's boost (`boost`): the step's β is
    max(scale · β_schedule, floor); scale starts at 1 and floor at 0, so an untouched
    controller gives the schedule's β exactly. Both are saved in `state_dict`.
    """

    def __init__(
        self,
        *,
        schedule: str,
        beta: float,
        total_steps: int,
        target_kl: float = 0.1,
        horizon: int = 10000,
        beta_min: float = 0.0,
        beta_target: float = 0.0,
    ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown KL schedule {schedule!r}; use fixed, adaptive or progressive")
        if schedule == "progressive" and total_steps <= 0:
            raise ValueError(f"the progressive KL schedule needs total_steps > 0, got {total_steps}")
        if schedule == "adaptive" and (target_kl <= 0 or horizon <= 0):
            raise ValueError(f"the adaptive KL schedule needs target_kl, horizon > 0, got {target_kl}, {horizon}")
        self.schedule = schedule
        self.beta = beta  # the current β for "adaptive", the constant or β_init otherwise
        self.total_steps = total_steps
        self.target_kl = target_kl
        self.horizon = horizon
        self.beta_min = beta_min
        self.beta_target = beta_target
        self.scale = 1.0  # the health monitor's multiplier of the scheduled β
        self.floor = 0.0  # and its lower bound (raised from 0 by the first boost)

    def beta_at(self, step: int) -> float:
        """β for the 1-based training step `step`."""
        if step < 1:
            raise ValueError(f"training steps are 1-based, got {step}")
        if self.schedule == "progressive":
            scheduled = progressive_beta(
                step - 1, self.total_steps, beta_init=self.beta, beta_min=self.beta_min, beta_target=self.beta_target
            )
        else:
            scheduled = self.beta
        return max(self.scale * scheduled, self.floor)

    def boost(self, factor: float, min_beta: float) -> None:
        """The KL-explosion response: scale ← scale · factor, floor ← max(floor · factor, min_beta).

        The step's β becomes max(factor · β, min_beta) whatever the schedule; the floor exists
        because factor · 0 = 0 would leave a β = 0 run (KL only tracked) without any penalty.
        """
        self.scale *= factor
        self.floor = max(self.floor * factor, min_beta)

    def update(self, measured_kl: float, n_steps: int = 1) -> None:
        """Feed the KL measured at the last step (adaptive only; a no-op for the others)."""
        if self.schedule == "adaptive":
            self.beta = adaptive_beta_update(
                self.beta, measured_kl, target_kl=self.target_kl, horizon=self.horizon, n_steps=n_steps
            )

    def state_dict(self) -> dict:
        return {"schedule": self.schedule, "beta": self.beta, "scale": self.scale, "floor": self.floor}

    def load_state_dict(self, state: dict) -> None:
        """Restore the adaptive β and the health boost. For fixed and progressive, β comes from the
        config and the step, so it is not restored (a changed β in the config takes effect on resume)."""
        if state["schedule"] != self.schedule:
            raise ValueError(f"checkpoint has KL schedule {state['schedule']!r}, config has {self.schedule!r}")
        if self.schedule == "adaptive":
            self.beta = float(state["beta"])
        # The health boost always persists; checkpoints written before it existed have none.
        self.scale, self.floor = float(state.get("scale", 1.0)), float(state.get("floor", 0.0))
