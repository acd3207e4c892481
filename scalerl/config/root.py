"""The root of the run configuration, `Config`: the sections (scalerl/config/schema.py), the input rewritten
before they read it (presets, cluster presets, older spellings: scalerl/config/presets.py), what is derived
once it is built (the batch plan and the precision policy: scalerl/config/plan.py), and the checks across
sections. Loading it from YAML and `--set` is scalerl/config/load.py's.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, model_validator

from scalerl.config.plan import BatchPlan, PrecisionPolicy, batch_plan, precision_policy
from scalerl.config.presets import (
    apply_cluster_preset,
    apply_preset,
    compressed_checkpoints,
    legacy_precision,
    top_level_reward_keys,
)
from scalerl.config.schema import (
    AlgorithmConfig,
    CheckpointConfig,
    ContinualConfig,
    EnvConfig,
    EvalConfig,
    ForgettingConfig,
    GRPOConfig,
    HealthConfig,
    LogConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    ReplayConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
    _Section,
)
from scalerl.config.sft import SFTConfig


def _group_relative(algo: BaseModel) -> bool:
    """Whether the advantages are relative to the prompt's own group (0 for a group of one)."""
    return algo.name in ("grpo", "cispo", "rloo") or (algo.name == "reinforce_pp" and algo.baseline == "group")


class Config(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    preset: Literal["scalerl"] | None = Field(None, description="scalerl: the ScaleRL recipe's defaults (see PRESETS); your own keys still win.")
    cluster_preset: Literal["none", "auto", "1-4", "4-8", "8+"] = Field(
        "none", description="The source's batch and sync per cluster size (CLUSTER_PRESETS; auto: nodes from torchrun's WORLD_SIZE / "
                            "LOCAL_WORLD_SIZE): sets rollout.prompts_per_step, train.micro_batch_size and parallel.strategy; your own keys still win.")
    algorithm: AlgorithmConfig = Field(default_factory=GRPOConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    forgetting: ForgettingConfig = Field(default_factory=ForgettingConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    continual: ContinualConfig = Field(default_factory=ContinualConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)

    @model_validator(mode="before")
    @classmethod
    def _rewrite_input(cls, data: Any) -> Any:
        """The input rewritten before the sections read it (scalerl/config/presets.py), in this order: the preset,
        the cluster preset, compressed's checkpointing, then the older spellings."""
        data = apply_preset(data)
        data = apply_cluster_preset(data, os.environ)
        data = compressed_checkpoints(data)
        data = legacy_precision(data)
        return top_level_reward_keys(data)

    _plan: BatchPlan = PrivateAttr()
    _precision: PrecisionPolicy = PrivateAttr()
    _checked: int = PrivateAttr(default=0)  # id() of the object scalerl/config/checks.py checked (a copy is not checked)

    @model_validator(mode="after")
    def _derive(self) -> "Config":
        """Derive once, when the config is built: every consumer reads these, none re-derives them."""
        self._plan = batch_plan(prompts=self.rollout.prompts_per_step, group_size=self.rollout.group_size,
                                mini_batch_size=self.train.mini_batch_size, micro_batch_size=self.train.micro_batch_size,
                                epochs=self.train.epochs, steps=self.train.steps, micro_batch_tokens=self.train.micro_batch_tokens)
        pr = self.precision
        self._precision = precision_policy(pr.mode, fp8=pr.fp8, error_feedback=pr.error_feedback, reference_8bit=pr.reference_8bit,
                                           fp32_lm_head=self.model.fp32_lm_head, compute=pr.compute, fp32_residual=pr.fp32_residual)
        return self

    @model_validator(mode="after")
    def _check_objective(self) -> "Config":
        if self.algorithm.loss_agg == "prompt" and self._plan.micro_batch_size % self.rollout.group_size:
            source = "" if self.train.micro_batch_size else (", from train.mini_batch_size" if self.train.mini_batch_size else ", the batch")
            raise ValueError(f"algorithm.loss_agg=prompt needs train.micro_batch_size ({self._plan.micro_batch_size}{source}) to be a "
                             f"multiple of rollout.group_size ({self.rollout.group_size}), so that no prompt's group is split")
        if self.algorithm.kl.in_reward and self.algorithm.name != "ppo":
            raise ValueError("algorithm.kl.in_reward applies to ppo only (other objectives add the KL to the loss)")
        if self.model.lora.enabled and self.parallel.strategy == "fsdp2":
            raise ValueError("model.lora with parallel.strategy=fsdp2 is not supported yet; use parallel.strategy=ddp (the adapters are small)")
        if self.replay.kind != "none" and not _corrects_off_policy(self.algorithm):
            raise ValueError("replay needs an off-policy correction for the replayed rows: set algorithm.tis_cap (e.g. 2.0, truncated "
                             "importance sampling against their sampler log-probs), algorithm.off_policy_mask or algorithm.rollout_correction")
        if self.replay.kind != "none" and self.rollout.max_turns > 1:
            raise ValueError("replay with rollout.max_turns > 1 is not supported yet (replay stores single-turn groups); set replay.kind=none")
        if self.rollout.mode == "async":
            self._check_async()
        if self.forgetting.self_distill and self.parallel.strategy == "fsdp2":
            raise ValueError("forgetting.self_distill with parallel.strategy=fsdp2 is not supported yet (each rank samples the anchor prompts "
                             "from its whole weights); use parallel.strategy=ddp or dynamic")
        if self.forgetting.ewc and self.parallel.strategy == "fsdp2":
            raise ValueError("forgetting.ewc with parallel.strategy=fsdp2 is not supported yet (the Fisher is measured per rank on whole "
                             "weights); use parallel.strategy=ddp or dynamic")
        if self.optim.offload and self.parallel.strategy == "fsdp2":
            raise ValueError("optim.offload with parallel.strategy=fsdp2 is not supported yet (its parameters are shards; FSDP2's own "
                             "CPUOffloadPolicy is not wired); use parallel.strategy=ddp or dynamic")
        if self.optim.offload and not self._precision.fused_adamw:
            raise ValueError(f"optim.offload steps float32 AdamW on the host: precision.mode fp32 or standard, not {self.precision.mode} "
                             "(its 8-bit or bf16 moments are already a quarter or half of fp32's)")
        if self.model.lora.enabled and self.precision.mode == "aggressive":
            raise ValueError("model.lora with precision.mode=aggressive is not supported (peft wraps plain linear layers, not fp8 ones); "
                             "use precision.mode standard or compressed")
        if self.algorithm.distill_teacher is not None and self.algorithm.name == "ppo":
            raise ValueError("algorithm.distill_teacher with algorithm.name=ppo: distillation's per-token advantage replaces GAE's; use grpo, cispo, rloo or reinforce_pp")
        if self.reward.normalize_components and self.rollout.group_size == 1:
            raise ValueError("reward.normalize_components with rollout.group_size=1: a group of one has no spread to normalise by; use group_size >= 2")
        if self.rollout.group_size == 1 and _group_relative(self.algorithm):
            raise ValueError(f"rollout.group_size=1 with algorithm.name={self.algorithm.name}: each completion's baseline is its own "
                             "group's mean, so every advantage is 0 and nothing is learned; use group_size >= 2, or ppo (a critic) "
                             "or reinforce_pp with baseline=batch")
        return self

    def _check_async(self) -> None:
        if self.rollout.max_staleness > 0 and not _corrects_off_policy(self.algorithm):
            raise ValueError("rollout.mode=async samples with weights up to rollout.max_staleness versions old: set algorithm.tis_cap (e.g. "
                             "2.0, truncated importance sampling against the sampler's log-probs), algorithm.off_policy_mask or algorithm.rollout_correction, or "
                             "rollout.max_staleness=0")
        if self.replay.kind != "none":
            raise ValueError("rollout.mode=async with replay is not supported yet (the buffer would live in the producer process); "
                             "set replay.kind=none or rollout.mode=sync")

    def with_precision_mode(self, mode: str) -> "Config":
        """This config with precision.mode=`mode`, derived again: precision.mode=auto's choice, made at setup where the
        device is known (scalerl/trainer/setup.py: resolve_precision)."""
        return self.model_copy(update={"precision": self.precision.model_copy(update={"mode": mode})})._derive()

    @property
    def plan(self) -> BatchPlan:
        """Batch sizes and updates per step (scalerl/config/plan.py)."""
        return self._plan

    @property
    def precision_policy(self) -> PrecisionPolicy:
        """What weights, states and matmuls are stored and run in (scalerl/config/plan.py)."""
        return self._precision

    @property
    def batch_size(self) -> int:
        """Completions sampled per step and process."""
        return self._plan.batch_size


def _corrects_off_policy(algo) -> bool:
    """Whether the objective corrects for tokens another policy sampled: tis_cap, off_policy_mask or a rollout_correction preset."""
    return algo.tis_cap is not None or algo.off_policy_mask is not None or algo.rollout_correction is not None
