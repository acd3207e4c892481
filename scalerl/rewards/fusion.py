"""Fusing K reward components into one reward per completion: pure functions over tensors.

Scores are fused as they come from their components, with no extra normalisation here: a model
component is already on the scale its own `normalize` (none/sigmoid/batch) gives, and the
environment and functions return what they return. Give components comparable scales (e.g.
`normalize: sigmoid` for a reward model beside 0/1 verifiers), or the weights mean little.

weighted_sum:   r_i = Σ_k w_k · s_{k,i}       with the configured weights w_k.

dynamic_weight: the same sum with weights that follow sample difficulty (`dynamic_weights`).

With `reward.normalize_components` each component is first normalised within each prompt's group
(`normalize_within_groups`: GDPO, Liu et al., 2026, arXiv:2601.05242; verl's and NeMo-RL's
normalize-then-sum), so one component's scale cannot drown the others: r_i = Σ_k w_k ŝ_{k,i}.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def weighted_sum(scores: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """r_i = Σ_k w_k s_{k,i}. scores (K, B), weights (K,) → (B,)."""
    return weights.to(scores.dtype) @ scores


def normalize_within_groups(scores: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """Each component standardised within each prompt's group (GDPO's decoupled normalisation):

        ŝ_{k,i} = (s_{k,i} − mean_{j∈g(i)} s_{k,j}) / (std_{j∈g(i)} s_{k,j} + eps)       (std with Bessel's correction, as TRL)

    scores (K, B) with B = P·G completions laid out group by group → (K, B). A component that is
    constant within a group gives 0 there. The fused Σ_k w_k ŝ_k then has group mean 0; the
    advantage estimator's normalisation follows (with scale_rewards=batch, GDPO's batch step).
    """
    k, b = scores.shape
    grouped = scores.view(k, b // group_size, group_size)
    mean, std = grouped.mean(-1, keepdim=True), grouped.std(-1, keepdim=True)
    return ((grouped - mean) / (std + eps)).view(k, b)


def group_spread(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Mean over prompt groups of the within-group (population) std of each component.
    scores (K, B) with B = P·G completions laid out group by group → (K,)."""
    k, b = scores.shape
    return scores.view(k, b // group_size, group_size).std(dim=-1, unbiased=False).mean(dim=-1)


@dataclass
class DynamicState:
    """What `dynamic_weights` carries across steps (saved in checkpoints)."""

    running_mean: torch.Tensor  # (K,) EMA of each component's batch mean
    running_max: torch.Tensor  # (K,) largest score seen so far
    running_min: torch.Tensor  # (K,) smallest score seen so far
    weights: torch.Tensor  # (K,) the weights used at the last step

    def to_dict(self) -> dict[str, list[float]]:
        return {k: getattr(self, k).tolist() for k in ("running_mean", "running_max", "running_min", "weights")}

    @classmethod
    def from_dict(cls, data: dict[str, list[float]]) -> "DynamicState":
        return cls(**{k: torch.tensor(v, dtype=torch.float64) for k, v in data.items()})


def dynamic_weights(
    base: torch.Tensor, spread: torch.Tensor, batch_mean: torch.Tensor, batch_max: torch.Tensor, batch_min: torch.Tensor,
    state: DynamicState | None, *, ceiling: torch.Tensor, floor: torch.Tensor, eps: float = 0.05,
    mean_ema: float = 0.1, weight_ema: float = 0.0,
) -> tuple[torch.Tensor, DynamicState]:
    """Weights that move towards the components that still carry learning signal. All (K,):

        m_k  ← (1 − α)·m_k + α·mean_k                 running mean (α = mean_ema; m_k = mean_k at the first step)
        C_k, F_k = ceiling_k, floor_k                  configured, or (NaN given) the running max / min observed
        R_k  = C_k − F_k                               the component's range
        u_k  = spread_k / R_k                          informativeness: mean within-group std, as a share of the range
        h_k  = clamp((C_k − m_k) / R_k, 0, 1)          headroom: how far the running mean is from the ceiling
        ŵ_k  = w0_k · (ε + u_k·h_k)
        w_k  = ŵ_k / Σ_j ŵ_j · Σ_j w0_j                renormalised: the weights keep the configured total
        w_k  ← β·w_prev_k + (1 − β)·w_k                smoothing across steps (β = weight_ema; none at the first step)

    A component that no longer varies within a prompt's group (u → 0) or that sits at its ceiling
    (h → 0) falls towards weight ∝ ε·w0; one that separates a group's completions and has room to
    rise gains. A component whose range is still zero (never varied) gets u = 0, h = 1. Inputs
    `spread, batch_mean, batch_max, batch_min` are the step's statistics (over all ranks).
    """
    base, spread, batch_mean = base.double(), spread.double(), batch_mean.double()
    if state is None:
        running_mean, running_max, running_min = batch_mean, batch_max.double(), batch_min.double()
    else:
        running_mean = (1 - mean_ema) * state.running_mean + mean_ema * batch_mean
        running_max = torch.maximum(state.running_max, batch_max.double())
        running_min = torch.minimum(state.running_min, batch_min.double())
    top = torch.where(torch.isnan(ceiling.double()), running_max, ceiling.double())
    bottom = torch.where(torch.isnan(floor.double()), running_min, floor.double())
    span = top - bottom
    varied = span > 0
    safe = torch.where(varied, span, torch.ones_like(span))
    informativeness = torch.where(varied, spread / safe, torch.zeros_like(span))
    headroom = torch.where(varied, ((top - running_mean) / safe).clamp(0, 1), torch.ones_like(span))
    raw = base * (eps + informativeness * headroom)
    weights = raw / raw.sum() * base.sum()
    if state is not None and weight_ema > 0:
        weights = weight_ema * state.weights + (1 - weight_ema) * weights
    return weights, DynamicState(running_mean, running_max, running_min, weights)
