"""One training step: the rollout side produces a scored batch, the learner learns from it, the
rollout side receives the new weights. Then one flat metrics dict.

    train_step → rollout.produce (scalerl/rollout/worker.py) → learner.learn (scalerl/learner/learner.py)
               → publish_weights → step_metrics
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from scalerl.learner.learner import LearnerSide
from scalerl.rollout.base import RolloutSide
from scalerl.distributed.context import DistContext
from scalerl.types import ScoredBatch


def train_step(rollout: RolloutSide, learner: LearnerSide, step: int, ctx: DistContext) -> tuple[ScoredBatch, dict[str, Any]]:
    """The step's batch and its metrics."""
    start = time.perf_counter()
    batch = rollout.produce(step)  # sample → score → filter
    produced = time.perf_counter()
    stats = learner.learn(batch, step)  # advantages → old/ref log-probs → epochs of updates
    publish_weights(rollout, learner)
    return batch, step_metrics(batch, stats, ctx, elapsed=time.perf_counter() - start, rollout_s=produced - start)


def publish_weights(rollout: RolloutSide, learner: LearnerSide) -> None:
    """Hand the learner's current weights and version to the rollout side (only the version when the
    sampler runs the learner's own modules)."""
    rollout.sync_weights(None if rollout.shares_weights else learner.weights(), learner.version)


def step_metrics(batch: ScoredBatch, stats: dict[str, float], ctx, *, elapsed: float, rollout_s: float) -> dict[str, Any]:
    """One flat dict per step; batch statistics are summed over ranks first. `rollout_s`: the part of
    `elapsed` spent producing the batch (the rest is learning and publishing the weights)."""
    rewards, rollout = batch.rewards, batch.rollout
    # The work the step's cost grows with (scalerl/predict/time_estimate.py): positions the sampler
    # decoded (completions x the longest one) and the padded prompt + completion positions the learner runs.
    sampled, trained = rollout.completion_ids.numel(), rollout.prompt_ids.numel() + rollout.completion_ids.numel()
    sums = ctx.sum(torch.tensor([float(rewards.sum()), float(rewards.square().sum()), len(batch), batch.generated_tokens,
                                 float(rollout.truncated.sum()), float(batch.task_rewards.sum()), sampled, trained], dtype=torch.float64))
    r_sum, r_sq, n, tokens, truncated, task_sum, sampled, trained = sums.tolist()
    mean = r_sum / n
    metrics = {
        "reward_mean": mean,
        "reward_std": math.sqrt(max(r_sq / n - mean * mean, 0.0)),
        "kl": stats.get("kl"),  # KL(π_θ ‖ π_ref), null when no reference model is loaded
        "kl_seq": stats.get("kl_seq"),
        "beta": stats["beta"],
        "loss": stats["loss"],
        "grad_norm": stats["grad_norm"],
        "lr": stats["lr"],
        "entropy": stats["entropy"],
        "clip_frac": stats["clip_frac"],
        "approx_kl": stats["approx_kl"],
        "response_len": tokens / n,
        "truncated_frac": truncated / n,
        "tokens": int(tokens),
        "tokens_per_s": tokens / elapsed,
        "step_time_s": elapsed,
        "time/rollout_s": rollout_s,  # sample, score, filter
        "time/learn_s": elapsed - rollout_s,  # advantages, old/ref log-probs, the epochs, publishing the weights
        "completions": int(n),
        "sampled_positions": int(sampled),
        "trained_positions": int(trained),
        "task_reward_mean": task_sum / n,  # the environment's own verdict, before fusion, caps and penalties
        "policy_version": batch.policy_version,
        "staleness": stats["staleness"],  # learner versions the batch was behind when learned (0: synchronous)
        **{k: stats[k] for k in ("value_loss", "kl_before", "kl_guard_scale", "tis_clip_frac", "sampler_kl", "off_policy_masked_frac", "sft/loss",
                                   "ewc/loss", "loss_scale", "loss_scale_overflows", "entropy_coef", "sapo_gate", "vespo_phi", "gmpo_ratio",
                                   "cov_frac", "top_entropy_frac", "distill/reverse_kl", "self_distill/reverse_kl", "value_clip_frac") if k in stats},
        **{k: v for k, v in stats.items() if k.startswith("rollout_corr/")},
        **batch.metrics,
    }
    return metrics
