"""Dynamic reward cap: clip rewards that jump above what recent steps produced (a reward-hacking
defence, SPEC §3).

At step t, with W_t the raw (uncapped) rewards of the last `window` steps *before* t:

    c_t = Q_q(W_t)                       the q-quantile of W_t, linear interpolation
    r_i ← min(r_i, c_t)                  for every reward of step t
    W_{t+1} = last `window` steps of W_t ∪ {raw rewards of step t}

Q_q of sorted values x_0 ≤ … ≤ x_{n−1} is x_⌊h⌋ + (h − ⌊h⌋)(x_⌈h⌉ − x_⌊h⌋) with h = q·(n − 1)
(`torch.quantile`'s default, numpy's "linear"). While fewer than `warmup_steps` steps are in the
window there is no cap (c_t = +∞, logged as null). Because the window keeps the *raw* rewards, the
cap rises with a genuinely improving reward distribution, about `window` steps behind; a single
step whose rewards spike far above the history is clipped to the history's high quantile.

Meant for continuous rewards (reward models, fused components). With binary 0/1 rewards it is
harmful: when fewer than 1 − q of recent samples succeeded, c_t = 0 and every success is erased.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch


def quantile_cap(history: torch.Tensor, q: float) -> float:
    """Q_q(history): the q-quantile with linear interpolation (see the module docstring)."""
    return torch.quantile(history.double(), q).item()


class RewardCap:
    """The running-quantile cap above, stateful across steps; `state_dict` is JSON-serialisable."""

    def __init__(self, *, quantile: float = 0.95, window: int = 20, warmup_steps: int = 5):
        if not 0 < quantile <= 1 or window < 1 or not 1 <= warmup_steps <= window:
            raise ValueError(f"need 0 < quantile <= 1, window >= 1 and 1 <= warmup_steps <= window; "
                             f"got quantile={quantile}, window={window}, warmup_steps={warmup_steps}")
        self.quantile, self.window, self.warmup_steps = quantile, window, warmup_steps
        self._steps: deque[list[float]] = deque(maxlen=window)

    @property
    def cap(self) -> float:
        """c_t for the next step: +inf until `warmup_steps` steps are in the window."""
        if len(self._steps) < self.warmup_steps:
            return math.inf
        return quantile_cap(torch.tensor([r for step in self._steps for r in step], dtype=torch.float64), self.quantile)

    def __call__(self, rewards: torch.Tensor, *, step_rewards: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float | None]]:
        """(min(r, c_t), metrics), then push the step's raw rewards into the window.

        rewards: (B,) this process's rewards. `step_rewards`: the whole step's raw rewards over all
        ranks (default `rewards`); pass them so every rank keeps the same window and cap.
        Metrics: `reward_cap` (c_t, None before warm-up) and `reward_capped_frac` (share of this
        process's rewards strictly above c_t).
        """
        cap = self.cap
        above = rewards > cap  # (B,)
        capped = rewards.clamp(max=cap) if math.isfinite(cap) else rewards
        raw = rewards if step_rewards is None else step_rewards
        self._steps.append([float(r) for r in raw.detach().reshape(-1).tolist()])
        metrics = {"reward_cap": cap if math.isfinite(cap) else None,
                   "reward_capped_frac": float(above.float().mean()) if len(rewards) else 0.0}
        return capped, metrics

    def state_dict(self) -> dict[str, Any]:
        return {"quantile": self.quantile, "window": self.window, "steps": [list(s) for s in self._steps]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the window; the quantile and window length come from the current config (a
        shorter window keeps the newest steps)."""
        self._steps = deque((list(map(float, s)) for s in state["steps"]), maxlen=self.window)
