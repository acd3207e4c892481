"""One training step: sample → score → filter → advantages and old/ref log-probs → minibatch
epochs → metrics. Everything here reads the `Trainer` built by `scalerl/trainer/loop.py`."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalerl.algorithms.advantages import gae, whiten
from scalerl.algorithms.kl import kl_estimate, measured_kl
from scalerl.algorithms.kl_control import KLController
from scalerl.algorithms.losses import (
    aggregate,
    policy_stats,
    truncated_is_weights,
    value_loss,
)
from scalerl.config import Config
from scalerl.distributed.context import DistContext
from scalerl.models.logprobs import completion_forward
from scalerl.rewards.scorer import RewardScorer
from scalerl.rollout.base import Rollout, Sampler, SamplingParams
from scalerl.rollout.multiturn import sample_episodes
from scalerl.trainer.data import PromptStream
from scalerl.trainer.objective import (
    count_units,
    outcome_advantages,
    outcome_token_rewards,
    policy_objective,
)
from scalerl.trainer.reward_step import RewardDefences, score_batch


@dataclass
class StepSamples:
    """One step's prompts, completions and rewards (row i of the batch), as text."""

    prompts: list[str]
    completions: list[str]
    rewards: torch.Tensor  # (B,) what the update used
    task_rewards: torch.Tensor  # (B,) the environment's own score


@dataclass
class Trainer:
    """Everything a step needs, built once by `loop.build_trainer`."""

    config: Config
    ctx: DistContext
    run_dir: Path
    tokenizer: Any
    policy: torch.nn.Module
    reference: torch.nn.Module | None  # None unless a KL term, KL tracking or the KL guard needs it
    critic: torch.nn.Module | None  # PPO: a ValueModel (separate) or a ValueHead on the policy (head)
    scorer: RewardScorer | None  # reward.components (or reward.model alone); None: the environment's reward
    defences: RewardDefences  # reward workers, cap, diversity penalty (see reward_step.py)
    env: Any
    stream: PromptStream
    sampler: Sampler
    optimizer: torch.optim.Optimizer
    scheduler: Any
    kl_ctl: KLController
    generator: torch.Generator
    autocast_dtype: torch.dtype | None
    last_samples: StepSamples | None = None  # the last step's batch, for the health monitor's collapse dump

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.ctx.device.type, dtype=self.autocast_dtype)

    @property
    def value_head(self) -> bool:
        return self.config.algorithm.name == "ppo" and self.config.algorithm.critic == "head"


@dataclass
class Targets:
    """What the update regresses towards, computed once per step before any weight changes."""

    advantages: torch.Tensor  # (B,) per completion, or (B, T) per token (PPO)
    old_logprobs: torch.Tensor | None  # (B, T); None: exactly on-policy, use the detached current log-probs
    ref_logprobs: torch.Tensor | None  # (B, T)
    old_values: torch.Tensor | None = None  # (B, T), PPO
    returns: torch.Tensor | None = None  # (B, T), PPO


def _micro_slices(n: int, size: int):
    return [slice(i, i + size) for i in range(0, n, size)]


@torch.no_grad()
def frozen_forward(t: Trainer, model: torch.nn.Module, batch: Rollout, micro: int, *, values: bool = False) -> torch.Tensor:
    """Log-probs (or, with `values`, critic values) of `batch` under weights that are not being
    updated right now, micro-batch by micro-batch. (B, T)."""
    parts = []
    for rows in _micro_slices(len(batch), micro):
        mb = batch.select(rows)
        with t.autocast():
            if values:
                parts.append(critic_values(t, mb).float())
            else:
                parts.append(completion_forward(model, mb, temperature=t.config.rollout.temperature,
                                                fp32_head=t.config.model.fp32_lm_head).logprobs.float())
    return torch.cat(parts)


def critic_values(t: Trainer, batch: Rollout, hidden: torch.Tensor | None = None) -> torch.Tensor:
    """V_t for every completion token, (B, T)."""
    if not t.value_head:
        return t.critic(batch)
    if hidden is None:
        hidden = completion_forward(t.policy, batch, temperature=t.config.rollout.temperature, with_hidden=True).hidden
    return t.critic(hidden)


def prepare_targets(t: Trainer, batch: Rollout, beta: float) -> Targets:
    cfg, algo = t.config, t.config.algorithm
    micro = cfg.train.micro_batch_size or cfg.train.mini_batch_size or len(batch)
    # One update on a freshly sampled batch is exactly on-policy: π_old = π_θ (detached) and the
    # extra forward pass for old log-probs would only recompute the same numbers. PPO needs them
    # anyway when the KL goes into its reward.
    single_update = cfg.train.epochs == 1 and (cfg.train.mini_batch_size or len(batch)) == len(batch)
    ref_lp = frozen_forward(t, t.reference, batch, micro) if t.reference is not None else None
    if algo.name != "ppo":
        old_lp = None if single_update else frozen_forward(t, t.policy, batch, micro)
        return Targets(outcome_advantages(algo, batch.rewards, cfg.rollout.group_size), old_lp, ref_lp)
    old_lp = frozen_forward(t, t.policy, batch, micro)
    old_values = frozen_forward(t, t.policy, batch, micro, values=True)
    mask = batch.completion_mask
    token_rewards = outcome_token_rewards(batch.rewards, mask)  # (B, T)
    if algo.kl.in_reward and ref_lp is not None and beta > 0:  # classic RLHF: r_t − β·(log π_old − log π_ref)
        token_rewards = token_rewards - beta * (old_lp - ref_lp) * mask
    advantages, returns = gae(token_rewards, old_values, mask, gamma=algo.gamma, lam=algo.lam)
    if algo.whiten_advantages:
        advantages = whiten(advantages, mask)
    return Targets(advantages, old_lp, ref_lp, old_values, returns)


def optimize(t: Trainer, batch: Rollout, targets: Targets, beta: float, lr_scale: float = 1.0) -> dict[str, float]:
    """`epochs` passes over the batch, one optimizer step per mini-batch, accumulating micro-batches."""
    cfg, algo = t.config, t.config.algorithm
    mini = cfg.train.mini_batch_size or len(batch)
    micro = cfg.train.micro_batch_size or mini
    sums: dict[str, float] = {}
    for _ in range(cfg.train.epochs):
        for mini_rows in _micro_slices(len(batch), mini):
            # The normaliser is the count of tokens (or completions, or prompts) of the mini-batch
            # over all ranks, computed once: each micro-batch divides its sum by it, and gradients
            # are summed across micro-batches and ranks, giving exactly the whole batch's gradient.
            part = batch.select(mini_rows)
            normalizer = t.ctx.sum(count_units(part.completion_mask, algo.loss_agg, part.group_ids).double()).item()
            step_stats: dict[str, float] = {"loss": 0.0}
            for rows in _micro_slices(len(batch), micro)[mini_rows.start // micro: mini_rows.stop // micro]:
                diagnostics = micro_step(t, batch.select(rows), targets, rows, beta, normalizer)
                step_stats["loss"] += diagnostics.pop("loss")  # already normalised by the whole mini-batch
                for k, v in diagnostics.items():  # diagnostics are averaged over micro-batches
                    step_stats[k] = step_stats.get(k, 0.0) + v * micro / mini
            step_stats["grad_norm"] = apply_update(t, lr_scale)
            for k, v in step_stats.items():
                sums[k] = sums.get(k, 0.0) + v
    n_updates = cfg.train.epochs * (len(batch) // mini)
    return {k: v / n_updates for k, v in sums.items()}


def micro_step(t: Trainer, mb: Rollout, targets: Targets, rows: slice, beta: float, normalizer: float) -> dict[str, float]:
    """Forward and backward of one micro-batch; returns its detached diagnostics."""
    cfg, algo = t.config, t.config.algorithm
    with t.autocast():
        fwd = completion_forward(t.policy, mb, temperature=cfg.rollout.temperature, fp32_head=cfg.model.fp32_lm_head,
                                 with_entropy=True, with_hidden=t.value_head)
    logprobs = fwd.logprobs.float()
    old = logprobs.detach() if targets.old_logprobs is None else targets.old_logprobs[rows]
    per_token, clipped = policy_objective(algo, logprobs, old, targets.advantages[rows])  # (B, T)
    if algo.tis_cap is not None:  # truncated importance sampling against the sampler's own log-probs
        per_token = per_token * truncated_is_weights(old, mb.sampler_logprobs, cap=algo.tis_cap)
    kl = None
    if targets.ref_logprobs is not None:
        kl = kl_estimate(logprobs, targets.ref_logprobs[rows], algo.kl.estimator)  # (B, T)
        if beta > 0 and not algo.kl.in_reward:
            per_token = per_token + beta * kl
    if algo.entropy_coef:
        per_token = per_token - algo.entropy_coef * fwd.entropy
    vloss = None
    if targets.returns is not None:
        values = critic_values(t, mb, fwd.hidden)
        vloss = value_loss(values, targets.old_values[rows], targets.returns[rows], clip_eps=algo.value_clip)
        per_token = per_token + algo.vf_coef * vloss
    mask = mb.completion_mask
    loss = aggregate(per_token, mask, algo.loss_agg, normalizer, group_ids=mb.group_ids)
    loss.backward()

    m = mask.bool()
    stats = {k: v.item() for k, v in policy_stats(logprobs.detach(), old, clipped, mask).items()}
    stats["loss"] = loss.item()
    stats["entropy"] = fwd.entropy.detach()[m].mean().item() if m.any() else 0.0
    if kl is not None:
        stats["kl"] = measured_kl(kl.detach(), mask, "token")
        stats["kl_seq"] = measured_kl(kl.detach(), mask, "sequence")
    if vloss is not None:
        stats["value_loss"] = vloss.detach()[m].mean().item() if m.any() else 0.0
    return stats


def apply_update(t: Trainer, lr_scale: float) -> float:
    """Sum gradients over ranks, clip, step (skipped when the gradient is not finite); returns the norm."""
    t.ctx.sum_gradients(t.policy)
    if t.critic is not None:  # a separate value model, or a value head that lives outside the policy module
        t.ctx.sum_gradients(t.critic)
    params = [p for group in t.optimizer.param_groups for p in group["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, t.config.optim.max_grad_norm or math.inf).item()
    if math.isfinite(grad_norm):  # a NaN/Inf gradient never reaches the weights (then see trainer/recovery.py)
        for group in t.optimizer.param_groups:
            group["lr"] *= lr_scale  # the KL guard's damping; the scheduler sets the next lr afresh
        t.optimizer.step()
        t.scheduler.step()
    t.optimizer.zero_grad(set_to_none=True)
    return grad_norm


def filter_batch(t: Trainer, tasks: list, batch: Rollout) -> dict[str, float]:
    """Zero-variance filtering (mask out groups whose rewards are all equal) and no-positive-
    resampling (retire prompts whose group pass rate reached the threshold). Masking instead of
    dropping keeps every rank's batch the same shape, so collectives stay in step."""
    algo, G = t.config.algorithm, t.config.rollout.group_size
    grouped = batch.rewards.view(-1, G)  # (P, G)
    metrics: dict[str, float] = {}
    if algo.zero_variance_filter:
        flat = (grouped == grouped[:, :1]).all(dim=1)  # (P,)
        batch.completion_mask = batch.completion_mask * (~flat).repeat_interleave(G).unsqueeze(1).to(batch.completion_mask.dtype)
        flat_groups, groups = t.ctx.sum(torch.tensor([float(flat.sum()), float(len(flat))])).tolist()
        metrics["zero_variance_frac"] = flat_groups / groups
    if algo.retire_pass_rate is not None:
        done = [tasks[g].prompt for g in range(len(tasks)) if grouped[g].mean().item() >= algo.retire_pass_rate]
        t.stream.retire(t.ctx.gather_lists(done))
        metrics["retired_prompts"] = float(len(t.stream.retired))
    return metrics


def train_step(t: Trainer, step: int) -> dict[str, Any]:
    cfg = t.config
    start = time.perf_counter()
    lr, beta = t.scheduler.get_last_lr()[0], t.kl_ctl.beta_at(step)
    tasks = t.stream.next_batch()
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                            top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, n=cfg.rollout.group_size)
    batch, completions = sample_episodes(t.sampler, t.env, tasks, t.tokenizer, params, t.generator, max_turns=cfg.rollout.max_turns)
    batch.rewards, task_rewards, reward_metrics = score_batch(t, step, tasks, batch, completions)
    t.last_samples = StepSamples([tasks[g].prompt for g in batch.group_ids.tolist()], [c.text for c in completions],
                                 batch.rewards, task_rewards)
    n_tokens = int(batch.completion_mask.sum())  # generated tokens, before any filtering
    extra = {**reward_metrics, **filter_batch(t, tasks, batch)}
    targets = prepare_targets(t, batch, beta)
    lr_scale = 1.0
    if cfg.algorithm.kl.max_kl is not None:  # the guard: KL(π_θ ‖ π_ref) on this batch before the update
        current = batch.sampler_logprobs if targets.old_logprobs is None else targets.old_logprobs
        kl = kl_estimate(current, targets.ref_logprobs, cfg.algorithm.kl.estimator)
        pre_kl = measured_kl(kl, batch.completion_mask, cfg.algorithm.kl.level)
        lr_scale = min(1.0, cfg.algorithm.kl.max_kl / pre_kl) if pre_kl > 0 else 1.0
        extra.update(kl_before=pre_kl, kl_guard_scale=lr_scale)
    stats = optimize(t, batch, targets, beta, lr_scale)
    if "kl" in stats:
        t.kl_ctl.update(stats["kl" if cfg.algorithm.kl.level == "token" else "kl_seq"], n_steps=len(batch) * t.ctx.world_size)
    t.sampler.sync_weights()
    return step_metrics(t, batch, task_rewards, n_tokens, stats, extra, lr=lr, beta=beta, elapsed=time.perf_counter() - start)


def step_metrics(t: Trainer, batch: Rollout, task_rewards: torch.Tensor, n_tokens: int, stats: dict, extra: dict,
                 *, lr: float, beta: float, elapsed: float) -> dict[str, Any]:
    """One flat dict per step; batch statistics are summed over ranks first."""
    sums = t.ctx.sum(torch.tensor([float(batch.rewards.sum()), float(batch.rewards.square().sum()), len(batch), n_tokens,
                                   float(batch.truncated.sum()), float(task_rewards.sum())], dtype=torch.float64))
    r_sum, r_sq, n, tokens, truncated, task_sum = sums.tolist()
    mean = r_sum / n
    metrics = {
        "reward_mean": mean,
        "reward_std": math.sqrt(max(r_sq / n - mean * mean, 0.0)),
        "kl": stats.get("kl"),  # KL(π_θ ‖ π_ref), null when no reference model is loaded
        "kl_seq": stats.get("kl_seq"),
        "beta": beta,
        "loss": stats["loss"],
        "grad_norm": stats["grad_norm"],
        "lr": lr,
        "entropy": stats["entropy"],
        "clip_frac": stats["clip_frac"],
        "approx_kl": stats["approx_kl"],
        "response_len": tokens / n,
        "truncated_frac": truncated / n,
        "tokens": int(tokens),
        "tokens_per_s": tokens / elapsed,
        "step_time_s": elapsed,
        "task_reward_mean": task_sum / n,  # the environment's own verdict, before fusion, caps and penalties
        **extra,
    }
    if "value_loss" in stats:
        metrics["value_loss"] = stats["value_loss"]
    return metrics
