"""Optimizer and learning-rate schedule (the learner sets each update's lr from `lr_factor`)."""

from __future__ import annotations

import math

import torch

from scalerl.config import OptimConfig
from scalerl.config.plan import PrecisionPolicy
from scalerl.precision.apply import build_adamw


def build_optimizer(groups: list[tuple[torch.nn.Module, float]], config: OptimConfig, precision: PrecisionPolicy,
                    device: torch.device) -> torch.optim.Optimizer:
    """AdamW over (module, lr) groups (the policy, and a critic with its own lr): torch's fused kernel for
    float32 weights and moments, the precision mode's CompactAdamW otherwise (scalerl/precision/adamw.py); with
    `offload`, the fused kernel on host copies (scalerl/precision/offload.py)."""
    param_groups = [{"params": [p for p in module.parameters() if p.requires_grad], "lr": lr} for module, lr in groups]
    return build_adamw(param_groups, precision, lr=config.lr, betas=config.betas, eps=config.eps,
                       weight_decay=config.weight_decay, device=device, offload=config.offload)


def lr_factor(step: int, total: int, config: OptimConfig) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based) of `total`.

    Linear warm-up over `warmup_steps` (step s uses (s+1)/warmup), then constant, linear or cosine
    decay that reaches `min_lr_ratio` at the last step, `total - 1`.
    """
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - config.warmup_steps) / max(1, total - 1 - config.warmup_steps))
    decay = 1.0 - progress if config.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * decay
