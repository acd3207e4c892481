"""The one place where the configured algorithm picks its advantage estimator and maps its
settings onto the pure objective's keyword arguments (`algorithms/objective.py:rl_objective`)."""

from __future__ import annotations

from typing import Any

import torch

from scalerl.algorithms.advantages import (
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from scalerl.algorithms.rollout_correction import RolloutCorrection
from scalerl.config import AlgorithmConfig


def outcome_advantages(algo: AlgorithmConfig, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) advantages from one scalar reward per completion (every algorithm but PPO, which uses GAE).
    Batch statistics (scale_rewards=batch, REINFORCE++) are over `rewards`: pass the global batch."""
    match algo.name:
        case "grpo" | "cispo":
            return group_advantages(rewards, group_size, scale_rewards=algo.scale_rewards, eps=algo.adv_eps)
        case "rloo":
            return rloo_advantages(rewards, group_size)
        case "reinforce_pp":
            return reinforce_pp_advantages(rewards, group_size, baseline=algo.baseline)
    raise ValueError(f"{algo.name} has no outcome-level advantage estimator")


def objective_settings(algo: AlgorithmConfig, *, max_new_tokens: int) -> dict[str, Any]:
    """The flat keyword settings of `rl_objective` for this algorithm (β is passed per step)."""
    settings: dict[str, Any] = dict(
        loss_agg=algo.loss_agg, max_new_tokens=max_new_tokens, tis_cap=algo.tis_cap, off_policy_mask=algo.off_policy_mask,
        kl_estimator=algo.kl.estimator, kl_with_ratio=algo.kl.with_ratio, entropy_coef=algo.entropy_coef,
        top_entropy_quantile=algo.top_entropy_quantile, rollout_correction=_rollout_correction(algo),
    )
    if algo.name == "cispo":
        settings.update(policy_loss="cispo", eps_max=algo.eps_max, importance_level=algo.importance_level,
                        policy_params={} if algo.eps_min is None else {"eps_min": algo.eps_min})
    else:
        settings.update(policy_loss=algo.policy_loss, policy_params=algo.policy_params, clip_eps_low=algo.clip_eps_low,
                        clip_eps_high=algo.clip_eps_high, importance_level=algo.importance_level, delta=algo.delta)
    if algo.name == "ppo":
        settings.update(vf_coef=algo.vf_coef, value_clip=algo.value_clip)
    return settings


def _rollout_correction(algo: AlgorithmConfig) -> RolloutCorrection | None:
    """The objective's rollout-correction preset with its cap and band, or None."""
    if algo.rollout_correction is None:
        return None
    return RolloutCorrection(algo.rollout_correction, cap=algo.rollout_is_cap, low=algo.rollout_rs_low, high=algo.rollout_rs_high)


def outcome_token_rewards(rewards: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """(B, T): each completion's scalar reward on its last trained token, zero elsewhere (PPO's sparse reward)."""
    columns = torch.arange(1, loss_mask.shape[1] + 1, device=loss_mask.device)  # (T,)
    last = ((loss_mask > 0) * columns).amax(1).sub(1).clamp(min=0)  # (B,) last trained column, gaps allowed (multi-turn)
    token_rewards = torch.zeros_like(loss_mask, dtype=torch.float32)
    token_rewards[torch.arange(len(rewards), device=rewards.device), last] = rewards * (loss_mask.sum(1) > 0)
    return token_rewards
