"""The policy as a run has it: loaded in the precision mode's dtype, its matmuls prepared, LoRA adapters on."""

from __future__ import annotations

import torch

from scalerl.config import Config
from scalerl.models.loading import load_model
from scalerl.models.lora import apply_lora
from scalerl.precision.apply import prepare_policy, weights_dtype


def build_policy(config: Config, device: torch.device) -> torch.nn.Module:
    """The policy as the config has it: loaded in the precision mode's dtype, its matmuls prepared, LoRA adapters on.
    The learner and an asynchronous producer build theirs here, so their state dicts match key for key."""
    policy = load_model(config.model, device, weights_dtype(config.precision_policy))
    prepare_policy(policy, config.precision_policy, device)
    if config.model.lora.enabled:
        policy = apply_lora(policy, config.model.lora, config.model.gradient_checkpointing)
    return policy
