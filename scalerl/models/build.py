"""The policy as a run has it: loaded in the precision mode's dtype, its matmuls prepared, LoRA adapters on; and
on-policy distillation's frozen teacher (the learner or the rollout side loads it, as algorithm.distill_teacher_placement says)."""

from __future__ import annotations

import torch

from scalerl.config import Config
from scalerl.errors import ScaleRLError
from scalerl.models.loading import load_model
from scalerl.models.lora import apply_lora
from scalerl.precision.apply import build_reference, prepare_policy, weights_dtype


def build_policy(config: Config, device: torch.device) -> torch.nn.Module:
    """The policy as the config has it: loaded in the precision mode's dtype, its matmuls prepared, LoRA adapters on.
    The learner and an asynchronous producer build theirs here, so their state dicts match key for key."""
    policy = load_model(config.model, device, weights_dtype(config.precision_policy))
    prepare_policy(policy, config.precision_policy, device)
    if config.model.lora.enabled:
        policy = apply_lora(policy, config.model.lora, config.model.gradient_checkpointing)
    return policy


def build_teacher(config: Config, policy: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """algorithm.distill_teacher as a frozen model in the reference's precision; its vocabulary must be the student's."""
    try:
        teacher = load_model(config.model.model_copy(update={"path": config.algorithm.distill_teacher, "gradient_checkpointing": False}), device)
    except ScaleRLError as err:  # load_model names model.path
        raise ScaleRLError(str(err).replace("model.path:", "algorithm.distill_teacher:", 1)) from err
    if teacher.get_output_embeddings().weight.shape[0] != policy.get_output_embeddings().weight.shape[0]:
        raise ScaleRLError(f"algorithm.distill_teacher: {config.algorithm.distill_teacher} has a vocabulary of "
                           f"{teacher.get_output_embeddings().weight.shape[0]} tokens, the student "
                           f"{policy.get_output_embeddings().weight.shape[0]}; use a teacher with the student's tokenizer")
    return build_reference(teacher, config.precision_policy)
