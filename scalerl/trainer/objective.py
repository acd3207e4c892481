"""The one place where the configured algorithm picks its advantage estimator and per-token objective."""

from __future__ import annotations

import torch

from scalerl.algorithms.advantages import (
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from scalerl.algorithms.losses import cispo_objective, clipped_surrogate
from scalerl.config import AlgorithmConfig


def outcome_advantages(algo: AlgorithmConfig, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) advantages from one scalar reward per completion (every algorithm but PPO, which uses GAE)."""
    match algo.name:
        case "grpo" | "cispo":
            return group_advantages(rewards, group_size, scale_rewards=algo.scale_rewards, eps=algo.adv_eps)
        case "rloo":
            return rloo_advantages(rewards, group_size)
        case "reinforce_pp":
            return reinforce_pp_advantages(rewards, group_size, baseline=algo.baseline)
    raise ValueError(f"{algo.name} has no outcome-level advantage estimator")


def policy_objective(algo: AlgorithmConfig, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                     advantages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token objective (B, T), clipped (B, T) bool) for the configured algorithm."""
    match algo.name:
        case "cispo":
            return cispo_objective(logprobs, old_logprobs, advantages, eps_max=algo.eps_max)
        case "grpo" | "rloo" | "reinforce_pp" | "ppo":
            return clipped_surrogate(logprobs, old_logprobs, advantages,
                                     clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high)
    raise ValueError(f"unknown algorithm {algo.name!r}")


def outcome_token_rewards(rewards: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """(B, T): each completion's scalar reward on its last trained token, zero elsewhere (PPO's sparse reward)."""
    columns = torch.arange(1, loss_mask.shape[1] + 1, device=loss_mask.device)  # (T,)
    last = ((loss_mask > 0) * columns).amax(1).sub(1).clamp(min=0)  # (B,) last trained column, gaps allowed (multi-turn)
    token_rewards = torch.zeros_like(loss_mask, dtype=torch.float32)
    token_rewards[torch.arange(len(rewards), device=rewards.device), last] = rewards * (loss_mask.sum(1) > 0)
    return token_rewards


def count_units(loss_mask: torch.Tensor, level: str, group_ids: torch.Tensor) -> torch.Tensor:
    """How many tokens, completions or prompts (with at least one trained token) a batch holds:
    the denominator of `aggregate` at that level. 0-dim tensor."""
    has_tokens = loss_mask.sum(1) > 0  # (B,)
    match level:
        case "token":
            return loss_mask.sum()
        case "sequence":
            return has_tokens.sum()
        case "prompt":
            return torch.tensor(group_ids[has_tokens].unique().numel(), device=loss_mask.device)
    raise ValueError(f"unknown loss aggregation {level!r}")
