"""Advantage estimators over scalar per-completion rewards."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, *, scale: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """GRPO group-relative advantages (Shao et al., DeepSeekMath, 2024, §4.1.2).

        Â_i = (r_i − mean(r_group)) / (std(r_group) + eps)     if scale
        Â_i =  r_i − mean(r_group)                             otherwise (Dr. GRPO, Liu et al., 2025)

    std uses Bessel's correction (as TRL does). A group whose rewards are all equal gets Â = 0.

    Args:
        rewards: (N,) rewards, consecutive `group_size` entries belong to one prompt.
        group_size: completions per prompt; N must be a multiple of it.
    Returns:
        (N,) advantages, one per completion (broadcast to its tokens by the loss).
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size)  # (P, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(grouped[:, :1])
        centred = centred / (std + eps)
    return centred.reshape(-1)  # (N,)
