"""Adaptive entropy bonus: the coefficient c_H of rl_objective's −c_H · H steered toward a target
entropy (TRL 1.16's GRPOConfig entropy_target / entropy_coef_delta / entropy_coef_min / _max; the
same bang-bang rule as the entropy control of Skywork-OR1, He et al., 2025, §3.2.3)."""

from __future__ import annotations


def next_entropy_coef(coef: float, entropy: float, *, target: float, step: float, high: float, low: float = 0.0) -> float:
    """The coefficient after an update whose trained tokens had mean entropy `entropy`:

        c ← min(c + step, high)   if H ≤ target      (entropy too low: push it up harder)
        c ← max(c − step, low)    otherwise
    """
    return min(coef + step, high) if entropy <= target else max(coef - step, low)


def applied_entropy_coef(coef: float, last_entropy: float | None, target: float) -> float:
    """The coefficient the next update applies: c while the last measured entropy is at or below the
    target, 0 above it (TRL applies the bonus only then); c before any measurement."""
    return coef if last_entropy is None or last_entropy <= target else 0.0
