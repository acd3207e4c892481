"""The training job: build everything, then step → evaluate → log → checkpoint until done, resumable.
`train(config)` is what `scalerl train` calls; one step itself is in `step.py`."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import torch

from scalerl.algorithms.kl_control import KLController
from scalerl.config import Config
from scalerl.distributed.context import DistContext, init_distributed, shutdown
from scalerl.envs.registry import build_env
from scalerl.models.loading import load_model, load_tokenizer
from scalerl.monitor.console import RunConsole
from scalerl.monitor.metrics import MetricsLogger, NullLogger
from scalerl.monitor.sinks import build_sinks
from scalerl.predict.time_estimate import TimeEstimator
from scalerl.rewards.sources import env_has_verifier
from scalerl.rollout.base import SamplingParams
from scalerl.trainer import checkpoint as ckpt
from scalerl.trainer.data import PromptStream
from scalerl.trainer.evaluation import pass_rate
from scalerl.trainer.optim import build_optimizer, build_scheduler
from scalerl.trainer.recovery import HealthGuard
from scalerl.trainer.reward_step import build_reward_defences
from scalerl.trainer.setup import (
    build_critic,
    build_reference,
    build_sampler,
    build_scorer,
    check_offload,
    check_precision,
    prepare_run_dir,
    seed_everything,
    set_threads,
)
from scalerl.trainer.step import Trainer, train_step


def build_trainer(config: Config, ctx: DistContext, resume: bool) -> Trainer:
    set_threads(config.train.threads)
    seed_everything(config.train.seed + ctx.rank)
    autocast_dtype = check_precision(config.train.precision, ctx.device)
    check_offload(config, ctx.device)
    tokenizer = load_tokenizer(config.model)
    policy = load_model(config.model, ctx.device)
    run_dir = prepare_run_dir(config, ctx, resume)
    policy.train()
    algo = config.algorithm
    # β = 0 with a fixed schedule (and no tracking or guard) never builds or runs a reference model.
    reference = build_reference(policy) if algo.kl.needs_reference else None
    critic = build_critic(config, policy, ctx.device) if algo.name == "ppo" else None
    scorer = build_scorer(config, ctx.device)
    env = build_env(config.env.name, config.env.args)
    stream = PromptStream(env.train_tasks(), config.rollout.prompts_per_step, rank=ctx.rank, world_size=ctx.world_size,
                          seed=config.train.seed, shuffle=config.env.shuffle)
    groups = [(policy, config.optim.lr)]
    if critic is not None:
        groups.append((critic, algo.critic_lr or config.optim.lr))
    optimizer = build_optimizer(groups, config.optim, ctx.device)
    batch, mini = config.batch_size, config.train.mini_batch_size or config.batch_size
    scheduler = build_scheduler(optimizer, config.optim, config.train.steps * config.train.epochs * (batch // mini))
    kl = algo.kl
    kl_ctl = KLController(schedule=kl.schedule, beta=kl.beta, total_steps=config.train.steps, target_kl=kl.target_kl,
                          horizon=kl.horizon, beta_min=kl.beta_min, beta_target=kl.beta_target)
    generator = torch.Generator(device=ctx.device).manual_seed(config.train.seed * 1_000_003 + ctx.rank)
    sampler = build_sampler(config, policy, tokenizer, ctx.device)
    defences = build_reward_defences(config, env, ctx.device)
    return Trainer(config, ctx, run_dir, tokenizer, policy, reference, critic, scorer, defences, env, stream, sampler,
                   optimizer, scheduler, kl_ctl, generator, autocast_dtype)


EVAL_STREAM = 1  # tags the evaluation generators' seeds apart from any other stream


def evaluate(t: Trainer, step: int) -> float:
    """The held-out pass rate after `step` steps: greedy, or mean@eval.samples at eval.temperature. Sampled
    evaluations draw from their own generator, seeded by (train.seed, step), so they are reproducible and
    leave the training's sampling stream (and a resumed run's) untouched."""
    cfg = t.config
    tasks = t.env.eval_tasks()[: cfg.eval.max_tasks]
    params = SamplingParams(max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens, temperature=cfg.eval.temperature,
                            top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k, n=cfg.eval.samples)
    generator = None
    if cfg.eval.temperature > 0:
        seed = np.random.SeedSequence([cfg.train.seed, step, t.ctx.rank, EVAL_STREAM]).generate_state(1)[0]
        generator = torch.Generator(device=t.ctx.device).manual_seed(int(seed))
    scorer = None if env_has_verifier(cfg.env.name) else t.scorer  # no verifier: the mean fused reward
    return pass_rate(t.env, tasks, t.sampler, t.tokenizer, params, generator, ctx=t.ctx, batch_size=cfg.eval.batch_size,
                     max_turns=cfg.rollout.max_turns, scorer=scorer)


def save(t: Trainer, step: int, state: dict[str, Any]) -> None:
    rng = {"torch": torch.get_rng_state(), "sampling": t.generator.get_state()}
    extra = {"critic": t.critic.state_dict()} if t.critic is not None else {}
    ckpt.save_checkpoint(t.run_dir / "checkpoints", step, ctx=t.ctx, model=t.policy, tokenizer=t.tokenizer,
                         optimizer=t.optimizer, scheduler=t.scheduler, rng=rng, extra_weights=extra,
                         trainer_state={**state, "data": t.stream.state_dict(), "kl_controller": t.kl_ctl.state_dict(),
                                        "reward_defences": t.defences.state_dict(),
                                        **({"reward_scorer": t.scorer.state_dict()} if t.scorer is not None else {})},
                         keep_last=t.config.checkpoint.keep_last)


def restore(t: Trainer) -> dict[str, Any]:
    """Load the newest complete checkpoint; returns its trainer state ({'step': 0} when there is none)."""
    root = t.run_dir / "checkpoints"
    if t.ctx.is_main:
        ckpt.remove_partial(root)
    t.ctx.barrier()
    folder = ckpt.latest_checkpoint(root)
    if folder is None:
        return {"step": 0}
    extra = {"critic": t.critic} if t.critic is not None else {}
    state, rng = ckpt.load_checkpoint(folder, ctx=t.ctx, model=t.policy, optimizer=t.optimizer, scheduler=t.scheduler,
                                      extra_modules=extra)
    t.stream.load_state_dict(state["data"])
    t.kl_ctl.load_state_dict(state["kl_controller"])
    if t.scorer is not None and "reward_scorer" in state:  # dynamic fusion weights continue where they were
        t.scorer.load_state_dict(state["reward_scorer"])
    t.defences.load_state_dict(state.get("reward_defences", {}))
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
    logger = (MetricsLogger(t.run_dir, tensorboard=config.log.tensorboard, resume_after=start_step if resume else None,
                            sinks=build_sinks(config, t.run_dir))
              if ctx.is_main else NullLogger())
    console = RunConsole(config.log.console if ctx.is_main else "none", config.train.steps, start_step)
    if resume:
        console.print(f"resumed from step {start_step} in {t.run_dir}")
    health = HealthGuard(t, console.print, resume_after=start_step if resume else None, pass_rate_before=state.get("pass_rate_before"))
    wall_start = time.perf_counter()
    train_time, train_tokens = state.get("train_time_s", 0.0), state.get("train_tokens", 0)
    if "pass_rate_before" not in state:
        state["pass_rate_before"] = evaluate(t, 0)
        health.check_pass_rate(0, state["pass_rate_before"])  # the best so far starts at the untrained model's
    last_eval = console.pass_rate = state.get("last_pass_rate", state["pass_rate_before"])
    loop_start, eval_time, save_time = time.perf_counter(), 0.0, 0.0
    eta = TimeEstimator(config.train.steps, start_step, config.eval.every, config.checkpoint.every, config.checkpoint.save_final)
    try:
        for step in range(start_step + 1, config.train.steps + 1):
            metrics = train_step(t, step)
            train_time += metrics["step_time_s"]
            train_tokens += metrics["tokens"]
            metrics.update(health.check(step, metrics))  # events and responses (scalerl/trainer/recovery.py)
            if step == config.train.steps or (config.eval.every and step % config.eval.every == 0):
                eval_start = time.perf_counter()
                last_eval = metrics["eval/pass_rate"] = evaluate(t, step)
                metrics["eval_time_s"] = time.perf_counter() - eval_start
                eval_time += metrics["eval_time_s"]
                metrics.update(health.check_pass_rate(step, last_eval))
            elapsed = time.perf_counter() - wall_start
            if (total_s := eta.update(step, elapsed_s=elapsed, step_time_s=metrics["step_time_s"], eval_time_s=metrics.get("eval_time_s"),
                                      save_time_total_s=save_time)) is not None:
                metrics["time/estimated_total_s"], metrics["time/remaining_s"] = total_s, total_s - elapsed
            logger.log(step, metrics)
            console.step(step, metrics)
            state.update(step=step, train_time_s=train_time, train_tokens=train_tokens, last_pass_rate=last_eval)
            final = step == config.train.steps
            if (config.checkpoint.every and step % config.checkpoint.every == 0) or (final and config.checkpoint.save_final):
                save_start = time.perf_counter()
                save(t, step, {k: v for k, v in state.items() if k != "step"})
                save_time += time.perf_counter() - save_start
        loop_time = time.perf_counter() - loop_start - eval_time - save_time  # steps and logging only
        phase = health.finish(config.train.steps)
    finally:
        t.defences.close()
        health.close()
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
        **phase,  # phase_verdict, phase_stats, health_events
    }
    summary.update(eta.summary(summary["wall_time_s"]))  # how good the live time estimate made at 10% was
    if ctx.is_main:
        (t.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    console.summary(summary)
    return summary
