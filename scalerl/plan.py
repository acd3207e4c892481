"""What a run's config implies, derived once when the config is built (`Config.plan`,
`Config.precision`) and read everywhere after: the loop, the learner's epochs and micro-batches,
the lr schedule's length, the memory estimate. Nothing re-derives a batch size. No project
imports and no torch, so `scalerl --help` stays instant.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPlan:
    """One step's batch on one rank, and how the learner walks it.

    A step samples `prompts` × `group_size` = `batch_size` completions per rank; the learner makes
    `epochs` passes over them, one optimizer update per mini-batch of `mini_batch_size`
    completions, each accumulated over micro-batches of `micro_batch_size`.
    """

    prompts: int
    group_size: int
    batch_size: int
    mini_batch_size: int
    micro_batch_size: int
    epochs: int
    steps: int

    @property
    def minibatches(self) -> int:
        """Optimizer updates per epoch."""
        return self.batch_size // self.mini_batch_size

    @property
    def micro_per_mini(self) -> int:
        return self.mini_batch_size // self.micro_batch_size

    @property
    def updates_per_step(self) -> int:
        return self.epochs * self.minibatches

    @property
    def total_updates(self) -> int:
        """Optimizer updates of the whole run: the lr schedule's length."""
        return self.steps * self.updates_per_step

    @property
    def single_update(self) -> bool:
        """One update per batch: a batch sampled by the learner's current weights is then exactly
        on-policy (π_old = π_θ), and its old log-probs need no extra forward pass."""
        return self.updates_per_step == 1


def batch_plan(*, prompts: int, group_size: int, mini_batch_size: int | None, micro_batch_size: int | None,
               epochs: int, steps: int) -> BatchPlan:
    """The plan, or ValueError naming the setting that does not divide."""
    batch = prompts * group_size
    mini = mini_batch_size or batch
    micro = micro_batch_size or mini
    if batch % mini:
        raise ValueError(f"train.mini_batch_size ({mini}) must divide the batch of {batch} completions (rollout.prompts_per_step x rollout.group_size)")
    if mini % micro:
        raise ValueError(f"train.micro_batch_size ({micro}) must divide train.mini_batch_size ({mini})")
    return BatchPlan(prompts=prompts, group_size=group_size, batch_size=batch, mini_batch_size=mini,
                     micro_batch_size=micro, epochs=epochs, steps=steps)


@dataclass(frozen=True)
class PrecisionPolicy:
    """Which dtype the matrix multiplies run in and what stays float32.

    fp32: everything float32. bf16: float32 master weights and optimizer states, forward and
    backward under bfloat16 autocast (CPU and GPU). fp8: needs an H100-class GPU (refused elsewhere
    at setup). `fp32_lm_head`: log-probs from float32 logits whatever the compute dtype.
    """

    mode: str
    autocast_dtype: str | None  # a torch dtype name, e.g. "bfloat16"; None: no autocast
    fp32_lm_head: bool


def precision_policy(mode: str, *, fp32_lm_head: bool) -> PrecisionPolicy:
    autocast = {"fp32": None, "bf16": "bfloat16", "fp8": "bfloat16"}[mode]
    return PrecisionPolicy(mode=mode, autocast_dtype=autocast, fp32_lm_head=fp32_lm_head)
