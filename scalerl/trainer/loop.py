"""The training loop: sample → score → advantages → old/ref log-probs → minibatch epochs → log →
checkpoint. `train(config)` is what `scalerl train` calls."""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalerl.algorithms.advantages import group_advantages
from scalerl.algorithms.losses import grpo_loss
from scalerl.config import Config
from scalerl.distributed.context import DistContext, init_distributed, shutdown
from scalerl.envs.registry import build_env
from scalerl.envs.scoring import score_rollout
from scalerl.errors import ScaleRLError
from scalerl.models.loading import load_model, load_tokenizer
from scalerl.models.logprobs import completion_logprobs
from scalerl.monitor.console import RunConsole
from scalerl.monitor.metrics import MetricsLogger, NullLogger
from scalerl.rollout.base import Rollout, Sampler, SamplingParams
from scalerl.trainer import checkpoint as ckpt
from scalerl.trainer.data import PromptStream
from scalerl.trainer.evaluation import greedy_pass_rate
from scalerl.trainer.optim import build_optimizer, build_scheduler
from scalerl.trainer.setup import (build_reference, build_sampler, check_offload, check_precision, prepare_run_dir,
                                   seed_everything, set_threads)


@dataclass
class Trainer:
    """Everything a step needs, built once by `build_trainer`."""

    config: Config
    ctx: DistContext
    run_dir: Path
    tokenizer: Any
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    env: Any
    stream: PromptStream
    sampler: Sampler
    optimizer: torch.optim.Optimizer
    scheduler: Any
    generator: torch.Generator
    autocast_dtype: torch.dtype | None

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.ctx.device.type, dtype=self.autocast_dtype)


def build_trainer(config: Config, ctx: DistContext, resume: bool) -> Trainer:
    set_threads(config.train.threads)
    seed_everything(config.train.seed + ctx.rank)
    autocast_dtype = check_precision(config.train.precision, ctx.device)
    check_offload(config, ctx.device)
    tokenizer = load_tokenizer(config.model)
    policy = load_model(config.model, ctx.device)
    run_dir = prepare_run_dir(config, ctx, resume)
    policy.train()
    # β = 0 (and no tracking) never builds or runs a reference model.
    reference = build_reference(policy) if config.algorithm.kl.needs_reference else None
    env = build_env(config.env.name, config.env.args)
    stream = PromptStream(env.train_tasks(), config.rollout.prompts_per_step, rank=ctx.rank, world_size=ctx.world_size,
                          seed=config.train.seed, shuffle=config.env.shuffle)
    optimizer = build_optimizer(policy, config.optim, ctx.device)
    batch, mini = config.batch_size, config.train.mini_batch_size or config.batch_size
    scheduler = build_scheduler(optimizer, config.optim, config.train.steps * config.train.epochs * (batch // mini))
    generator = torch.Generator(device=ctx.device).manual_seed(config.train.seed * 1_000_003 + ctx.rank)
    sampler = build_sampler(config, policy, tokenizer, ctx.device)
    return Trainer(config, ctx, run_dir, tokenizer, policy, reference, env, stream, sampler, optimizer, scheduler,
                   generator, autocast_dtype)


@torch.no_grad()
def frozen_logprobs(t: Trainer, model: torch.nn.Module, batch: Rollout, micro: int) -> torch.Tensor:
    """Log-probs of `batch` under a model that is not being trained right now, micro-batch by micro-batch."""
    parts = []
    for start in range(0, len(batch), micro):
        with t.autocast():
            lp, _ = completion_logprobs(model, batch.select(slice(start, start + micro)),
                                        temperature=t.config.rollout.temperature, fp32_head=t.config.model.fp32_lm_head)
        parts.append(lp.float())
    return torch.cat(parts)


def optimize(t: Trainer, batch: Rollout, advantages: torch.Tensor, old_lp: torch.Tensor | None,
             ref_lp: torch.Tensor | None) -> dict[str, float]:
    """`epochs` passes over the batch, one optimizer step per mini-batch, accumulating micro-batches."""
    cfg, algo = t.config, t.config.algorithm
    mini = cfg.train.mini_batch_size or len(batch)
    micro = cfg.train.micro_batch_size or mini
    sums: dict[str, float] = {}
    n_updates = 0
    for _ in range(cfg.train.epochs):
        for m0 in range(0, len(batch), mini):
            rows = slice(m0, m0 + mini)
            # The normaliser is the token (or sequence) count of the mini-batch over all ranks,
            # computed once: each micro-batch divides its sum by it, and gradients are summed
            # across micro-batches and ranks, which gives exactly the gradient of the whole batch.
            mask = batch.completion_mask[rows]
            count = mask.sum() if algo.loss_agg == "token" else torch.tensor(mask.shape[0])
            normalizer = t.ctx.sum(count.double()).item()
            step_loss, stats_acc = 0.0, {}
            for u0 in range(m0, m0 + mini, micro):
                mb = batch.select(slice(u0, u0 + micro))
                with t.autocast():
                    lp, entropy = completion_logprobs(t.policy, mb, temperature=cfg.rollout.temperature,
                                                      fp32_head=cfg.model.fp32_lm_head, with_entropy=True)
                lp = lp.float()
                loss, stats = grpo_loss(
                    lp, lp.detach() if old_lp is None else old_lp[u0: u0 + micro], advantages[u0: u0 + micro], mb.completion_mask,
                    clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high,
                    ref_logprobs=None if ref_lp is None else ref_lp[u0: u0 + micro], beta=algo.kl.beta,
                    kl_estimator=algo.kl.estimator, loss_agg=algo.loss_agg, normalizer=normalizer,
                )
                loss.backward()
                step_loss += loss.item()
                m = mb.completion_mask.bool()
                stats["entropy"] = entropy[m].mean() if m.any() else entropy.new_tensor(0.0)
                for k, v in stats.items():
                    stats_acc[k] = stats_acc.get(k, 0.0) + v.item() * micro / mini
            t.ctx.sum_gradients(t.policy)
            max_norm = cfg.optim.max_grad_norm or math.inf
            grad_norm = torch.nn.utils.clip_grad_norm_(t.policy.parameters(), max_norm).item()
            if math.isfinite(grad_norm):  # a NaN/Inf gradient never reaches the weights; the loop stops on it
                t.optimizer.step()
                t.scheduler.step()
            t.optimizer.zero_grad(set_to_none=True)
            for k, v in {"loss": step_loss, "grad_norm": grad_norm, **stats_acc}.items():
                sums[k] = sums.get(k, 0.0) + v
            n_updates += 1
    return {k: v / n_updates for k, v in sums.items()}


def train_step(t: Trainer) -> dict[str, Any]:
    cfg = t.config
    start = time.perf_counter()
    lr = t.scheduler.get_last_lr()[0]
    tasks = t.stream.next_batch()
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                            top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, n=cfg.rollout.group_size)
    batch = t.sampler.sample([t.tokenizer(task.prompt)["input_ids"] for task in tasks], params, t.generator)
    batch.rewards = score_rollout(t.env, tasks, batch, t.tokenizer).to(t.ctx.device)
    advantages = group_advantages(batch.rewards, cfg.rollout.group_size, scale=cfg.algorithm.scale_rewards,
                                  eps=cfg.algorithm.adv_eps)  # (B,)
    micro = cfg.train.micro_batch_size or cfg.train.mini_batch_size or len(batch)
    # One update on a freshly sampled batch is exactly on-policy: π_old = π_θ (detached) and the
    # extra forward pass for old log-probs would only recompute the same numbers.
    single_update = cfg.train.epochs == 1 and (cfg.train.mini_batch_size or len(batch)) == len(batch)
    old_lp = None if single_update else frozen_logprobs(t, t.policy, batch, micro)
    ref_lp = frozen_logprobs(t, t.reference, batch, micro) if t.reference is not None else None
    stats = optimize(t, batch, advantages, old_lp, ref_lp)
    t.sampler.sync_weights()

    n_tokens = int(batch.completion_mask.sum())
    elapsed = time.perf_counter() - start
    global_stats = t.ctx.sum(torch.tensor([float(batch.rewards.sum()), float(batch.rewards.square().sum()), len(batch),
                                           n_tokens, float(batch.truncated.sum())], dtype=torch.float64))
    r_sum, r_sq, n, tokens, truncated = global_stats.tolist()
    mean = r_sum / n
    return {
        "reward_mean": mean,
        "reward_std": math.sqrt(max(r_sq / n - mean * mean, 0.0)),
        "kl": stats.get("kl"),  # KL(π_θ ‖ π_ref), null when no reference model is loaded
        "beta": cfg.algorithm.kl.beta,
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
    }


def evaluate(t: Trainer) -> float:
    cfg = t.config
    tasks = t.env.eval_tasks()[: cfg.eval.max_tasks]
    return greedy_pass_rate(t.env, tasks, t.sampler, t.tokenizer, ctx=t.ctx, batch_size=cfg.eval.batch_size,
                            max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens)


def save(t: Trainer, step: int, state: dict[str, Any]) -> None:
    rng = {"torch": torch.get_rng_state(), "sampling": t.generator.get_state()}
    ckpt.save_checkpoint(t.run_dir / "checkpoints", step, ctx=t.ctx, model=t.policy, tokenizer=t.tokenizer,
                         optimizer=t.optimizer, scheduler=t.scheduler, rng=rng,
                         trainer_state={"data": t.stream.state_dict(), **state}, keep_last=t.config.checkpoint.keep_last)


def restore(t: Trainer) -> dict[str, Any]:
    """Load the newest complete checkpoint; returns its trainer state ({'step': 0} when there is none)."""
    root = t.run_dir / "checkpoints"
    if t.ctx.is_main:
        ckpt.remove_partial(root)
    t.ctx.barrier()
    folder = ckpt.latest_checkpoint(root)
    if folder is None:
        return {"step": 0}
    state, rng = ckpt.load_checkpoint(folder, ctx=t.ctx, model=t.policy, optimizer=t.optimizer, scheduler=t.scheduler)
    t.stream.load_state_dict(state["data"])
    torch.set_rng_state(rng["torch"])
    t.generator.set_state(rng["sampling"])
    return state


def train(config: Config, *, resume: bool = False) -> dict[str, Any]:
    """Run (or resume) a training job; returns the summary that is also written to summary.json."""
    ctx = init_distributed(config.train.device)
    try:
        return _train(config, ctx, resume)
    finally:
        shutdown(ctx)


def _train(config: Config, ctx: DistContext, resume: bool) -> dict[str, Any]:
    t = build_trainer(config, ctx, resume)
    state = restore(t) if resume else {"step": 0}
    start_step = state["step"]
    logger = (MetricsLogger(t.run_dir, tensorboard=config.log.tensorboard, resume_after=start_step if resume else None)
              if ctx.is_main else NullLogger())
    console = RunConsole(config.log.console if ctx.is_main else "none", config.train.steps, start_step)
    if resume:
        console.print(f"resumed from step {start_step} in {t.run_dir}")
    wall_start = time.perf_counter()
    train_time, train_tokens = state.get("train_time_s", 0.0), state.get("train_tokens", 0)
    if "pass_rate_before" not in state:
        state["pass_rate_before"] = evaluate(t)
    last_eval = console.pass_rate = state.get("last_pass_rate", state["pass_rate_before"])
    loop_start, eval_time, save_time = time.perf_counter(), 0.0, 0.0
    try:
        for step in range(start_step + 1, config.train.steps + 1):
            metrics = train_step(t)
            train_time += metrics["step_time_s"]
            train_tokens += metrics["tokens"]
            if not all(math.isfinite(metrics[k]) for k in ("loss", "grad_norm")):
                raise ScaleRLError(f"step {step}: loss or gradient norm is not finite; lower optim.lr or keep optim.max_grad_norm set")
            if step == config.train.steps or (config.eval.every and step % config.eval.every == 0):
                eval_start = time.perf_counter()
                last_eval = metrics["eval/pass_rate"] = evaluate(t)
                metrics["eval_time_s"] = time.perf_counter() - eval_start
                eval_time += metrics["eval_time_s"]
            logger.log(step, metrics)
            console.step(step, metrics)
            state.update(step=step, train_time_s=train_time, train_tokens=train_tokens, last_pass_rate=last_eval)
            final = step == config.train.steps
            if (config.checkpoint.every and step % config.checkpoint.every == 0) or (final and config.checkpoint.save_final):
                save_start = time.perf_counter()
                save(t, step, {k: v for k, v in state.items() if k != "step"})
                save_time += time.perf_counter() - save_start
        loop_time = time.perf_counter() - loop_start - eval_time - save_time  # steps and logging only
    finally:
        console.close()
        logger.close()
    summary = {
        "pass_rate_before": state["pass_rate_before"],
        "pass_rate_after": last_eval,
        "steps": config.train.steps,
        "wall_time_s": time.perf_counter() - wall_start,
        "train_time_s": train_time,
        "loop_time_s": loop_time,
        "eval_time_s": eval_time,
        "checkpoint_time_s": save_time,
        "tokens_per_s": train_tokens / max(train_time, 1e-9),
        "run_dir": str(t.run_dir),
    }
    if ctx.is_main:
        (t.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    console.summary(summary)
    return summary
