"""The training job: build the two roles, then step → evaluate → log → checkpoint until done, resumable.
`train(config)` is what `scalerl train` calls; one step itself is in `step.py`.

    build_roles → RolloutWorker (scalerl/rollout/worker.py) and Learner (scalerl/trainer/learner.py)
    train_step  → rollout.produce → learner.learn → rollout.sync_weights
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from scalerl.checks import check_config
from scalerl.config import Config
from scalerl.distributed.context import DistContext, init_distributed, shutdown
from scalerl.distributed.pair_link import check_transport
from scalerl.models.loading import load_tokenizer
from scalerl.monitor.console import RunConsole
from scalerl.monitor.metrics import MetricsLogger, NullLogger
from scalerl.monitor.sinks import build_sinks
from scalerl.precision.apply import check_precision, describe
from scalerl.predict.time_estimate import TimeEstimator
from scalerl.resume_config import record_resumed_config
from scalerl.rewards.sources import env_has_verifier
from scalerl.rollout.worker import RolloutWorker
from scalerl.trainer import checkpoint as ckpt
from scalerl.trainer.async_rollout import AsyncRollout, ProducerProcess
from scalerl.trainer.core_share import CoreShare
from scalerl.trainer.evaluation import pass_rate
from scalerl.trainer.learner import Learner
from scalerl.trainer.recovery import HealthGuard
from scalerl.trainer.setup import (
    build_forgetting,
    build_learner,
    build_policy,
    build_rollout,
    check_offload,
    check_run_dir,
    prepare_run_dir,
    seed_everything,
    set_threads,
    what_ran,
)
from scalerl.trainer.signals import GracefulStop, Stopped
from scalerl.trainer.step import publish_weights, train_step
from scalerl.types import SamplingParams, derive_seed

__all__ = ["build_roles", "train", "train_step"]


def build_roles(config: Config, ctx: DistContext, resume: bool, overwrite: bool = False,
                producer: ProducerProcess | None = None) -> tuple[RolloutWorker, Learner, Path]:
    """The rollout side and the learner around one policy (shared in this process), and the run directory.
    `producer`: where an async run's producer runs (default: a process spawned beside this one)."""
    run_dir = check_run_dir(config, resume, overwrite)  # first: a refused resume or reuse loads nothing
    set_threads(config.train.threads)
    seed_everything(config.train.seed + ctx.rank)
    check_precision(config.precision_policy, ctx.device)
    check_offload(config, ctx.device)
    asynchronous = config.rollout.mode == "async"
    if asynchronous:
        check_transport(config.rollout.weight_transport, ctx.device, "learner")
    tokenizer = load_tokenizer(config.model)
    policy = build_policy(config, ctx.device)
    # only once the model loaded: a run that cannot start leaves nothing, and resolved.yaml says what it loaded
    prepare_run_dir(config, ctx, run_dir, resume, what_ran(config, ctx, policy))
    policy.train()
    learner = build_learner(config, ctx, policy, build_forgetting(config, ctx, policy, tokenizer))
    # async: batches come from a producer process, with rollout.engine there; this worker only evaluates, on the
    # learner's own modules (the HF engine: nothing to sync, no second vLLM engine and KV cache in this process)
    rollout = build_rollout(config, ctx, run_dir, policy, tokenizer, learner.autocast,
                            gather=lambda: learner.parallel.gathered(learner.policy_forward), engine="hf" if asynchronous else None)
    if asynchronous:
        rollout = AsyncRollout(rollout, config, run_dir, producer)
        publish_weights(rollout, learner)
    return rollout, learner, run_dir


def evaluate(config: Config, rollout: RolloutWorker, step: int) -> float:
    """The held-out pass rate after `step` steps: greedy, or mean@eval.samples at eval.temperature. Sampled
    evaluations draw with per-task seeds of their own, (train.seed, step, task), so they are reproducible,
    the same at any world size, and leave the training's draws untouched."""
    ev, ro = config.eval, config.rollout
    tasks = rollout.env.eval_tasks()[: ev.max_tasks]
    params = SamplingParams(max_new_tokens=ev.max_new_tokens or ro.max_new_tokens, temperature=ev.temperature,
                            top_p=ro.top_p, top_k=ro.top_k, n=ev.samples)
    seeds = [derive_seed(config.train.seed, "eval", step, i) for i in range(len(tasks))] if ev.temperature > 0 else None
    scorer = None if env_has_verifier(config.env.name) else rollout.rewards.scorer  # no verifier: the mean fused reward
    return pass_rate(rollout.env, tasks, rollout.sampler, rollout.tokenizer, params, seeds, ctx=rollout.ctx,
                     batch_size=ev.batch_size, max_turns=ro.max_turns, scorer=scorer, encode=rollout.encode)


def save(config: Config, rollout: RolloutWorker, learner: Learner, run_dir: Path, step: int, state: dict[str, Any]) -> None:
    ckpt.save_checkpoint(run_dir / "checkpoints", step, ctx=learner.ctx, model=learner.policy, tokenizer=rollout.tokenizer,
                         optimizer=learner.optimizer, rng={"torch": torch.get_rng_state()}, extra_modules=learner.extra_modules(),
                         tensors=learner.extra_tensors(),
                         rank_files=(lambda folder: rollout.replay.save(folder, learner.ctx.rank)) if rollout.replay else None,
                         trainer_state={**state, "rollout": rollout.state_dict(), "learner": learner.state_dict()},
                         keep_last=config.checkpoint.keep_last)


def restore(rollout: RolloutWorker, learner: Learner, run_dir: Path, warn: Callable[[str], None] = print) -> dict[str, Any]:
    """Load the newest intact checkpoint (damaged ones are set aside with a warning); returns its
    trainer state ({'step': 0} when there is none)."""
    root = run_dir / "checkpoints"
    if learner.ctx.is_main:
        ckpt.remove_partial(root)
    learner.ctx.barrier()
    def load(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:  # all of it, so any damage is caught here
        state, rng = ckpt.load_checkpoint(folder, ctx=learner.ctx, model=learner.policy, optimizer=learner.optimizer,
                                          extra_modules=learner.extra_modules(), tensors=learner.extra_tensors())
        learner.load_state_dict(state.pop("learner"))
        rollout.load_state_dict(state.pop("rollout"))
        if rollout.replay is not None:
            rollout.replay.load(folder, learner.ctx.rank)
        return state, rng

    loaded = ckpt.load_newest_intact(root, learner.ctx, load, warn)
    if loaded is None:
        return {"step": 0}
    state, rng = loaded
    publish_weights(rollout, learner)
    if rng is not None:
        torch.set_rng_state(rng["torch"])
    else:  # a rank the saving run did not have: a stream of its own, from the seed, the rank and the step
        torch.manual_seed(derive_seed(rollout.seed, "rank", learner.ctx.rank, state["step"]))
    return state


def train(config: Config, *, resume: bool = False, overwrite: bool = False, producer: ProducerProcess | None = None) -> dict[str, Any]:
    """Run (or resume) a training job; returns the summary that is also written to summary.json.
    SIGTERM or SIGINT: finish the step, save a checkpoint, raise `Stopped` (scalerl/trainer/signals.py)."""
    check_config(config)
    ctx = init_distributed(config.train.device)
    try:
        with GracefulStop() as stop:
            return _train(config, ctx, resume, overwrite, stop, producer)
    finally:
        shutdown(ctx)


def _train(config: Config, ctx: DistContext, resume: bool, overwrite: bool, stop: GracefulStop,
           producer: ProducerProcess | None = None) -> dict[str, Any]:
    rollout, learner, run_dir = build_roles(config, ctx, resume, overwrite, producer)
    try:
        return _run(config, ctx, rollout, learner, run_dir, resume, stop)
    finally:
        rollout.close()
        learner.close()  # before destroy_process_group: nothing of the learner's may keep the group alive


def _run(config: Config, ctx: DistContext, rollout: RolloutWorker, learner: Learner, run_dir: Path, resume: bool,
         stop: GracefulStop) -> dict[str, Any]:
    warn = (lambda line: print(line, file=sys.stderr)) if ctx.is_main else (lambda line: None)
    state = restore(rollout, learner, run_dir, warn) if resume else {"step": 0}
    start_step = state["step"]
    if resume and start_step >= config.train.steps:  # finished: its summary stays as it was
        return finished_summary(run_dir, start_step, ctx)
    if resume and ctx.is_main:
        record_resumed_config(config, run_dir, start_step)
    logger = (MetricsLogger(run_dir, tensorboard=config.log.tensorboard, resume_after=start_step if resume else None,
                            sinks=build_sinks(config, run_dir))
              if ctx.is_main else NullLogger())
    console = RunConsole(config.log.console if ctx.is_main else "none", config.train.steps, start_step)
    console.print(describe(learner.precision, learner.policy, learner.component_bytes(expected=True), offload=config.optim.offload))
    if ctx.active:
        console.print(learner.parallel.describe())
    if resume:
        console.print(f"resumed from step {start_step} in {run_dir}")
    if start_step == 0 and (line := learner.start_forgetting()):
        console.print(line)
    health = HealthGuard(config.health, rollout, learner, run_dir, console.print, resume_after=start_step if resume else None,
                         pass_rate_before=state.get("pass_rate_before"), monitor_state=state.pop("health", None))
    wall_start = time.perf_counter()
    try:
        if "pass_rate_before" not in state:
            state["pass_rate_before"] = evaluate(config, rollout, 0)
            health.check_pass_rate(0, state["pass_rate_before"])  # the best so far starts at the untrained model's
        state["last_pass_rate"] = console.pass_rate = state.get("last_pass_rate", state["pass_rate_before"])
        eta = TimeEstimator(config.train.steps, start_step, config.eval.every, config.checkpoint.every, config.checkpoint.save_final,
                            # a multi-turn completion holds the environment's replies too: no cap known
                            max_new_tokens=config.rollout.max_new_tokens if config.rollout.max_turns == 1 else 0)
        times = _steps(config, rollout, learner, run_dir, state, health, eta, logger, console, wall_start, stop)
        phase = health.finish(config.train.steps)
    finally:
        health.close()
        console.close()
        logger.close()
    summary = {
        "pass_rate_before": state["pass_rate_before"],
        "pass_rate_after": state["last_pass_rate"],
        "steps": config.train.steps,
        "wall_time_s": time.perf_counter() - wall_start,
        **times,  # train_time_s, loop_time_s, eval_time_s, checkpoint_time_s, tokens_per_s
        "run_dir": str(run_dir),
        **phase,  # phase_verdict, phase_stats, health_events
    }
    summary.update(eta.summary(summary["wall_time_s"]))  # how good the live time estimate made at 10% was
    if ctx.is_main:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    console.summary(summary)
    return summary


def finished_summary(run_dir: Path, step: int, ctx: DistContext) -> dict[str, Any]:
    """Resuming a run that already reached train.steps: nothing to do; its summary.json is returned unchanged."""
    if ctx.is_main:
        print(f"{run_dir} already finished at step {step}; nothing to do (continue it with --set train.steps=N, N > {step})")
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {"steps": step, "run_dir": str(run_dir)}


def _steps(config: Config, rollout: RolloutWorker, learner: Learner, run_dir: Path, state: dict[str, Any], health: HealthGuard,
           eta: TimeEstimator, logger, console, wall_start: float, stop: GracefulStop) -> dict[str, float]:
    """step → health → evaluate → log → checkpoint, from the state's step to the last; returns the time totals.
    A stop request (a signal) is honoured between steps: checkpoint the last finished step, raise `Stopped`."""
    start_step = saved = state["step"]
    share = CoreShare() if config.train.threads is None else None  # threads unset: leave other processes their cores
    train_time, train_tokens = state.get("train_time_s", 0.0), state.get("train_tokens", 0)
    loop_start, eval_time, save_time = time.perf_counter(), 0.0, 0.0

    def checkpoint(step: int) -> None:
        nonlocal saved
        save(config, rollout, learner, run_dir, step, {**{k: v for k, v in state.items() if k != "step"}, "health": health.state_dict()})
        saved = step

    for step in range(start_step + 1, config.train.steps + 1):
        if (signum := stop.requested(learner.ctx)) is not None:
            if saved != step - 1:
                learner.parallel.synchronize(learner.optimizer)  # replicas that sync by groups may differ mid-interval
                checkpoint(step - 1)
            raise Stopped(signum, step - 1, str(run_dir / "checkpoints" / f"step_{step - 1:07d}") if step > 1 else None)
        threads = share.update() if share is not None else torch.get_num_threads()
        metrics = train_step(rollout, learner, step)
        final = step == config.train.steps
        evaluating = final or bool(config.eval.every and step % config.eval.every == 0)
        saving = bool(config.checkpoint.every and step % config.checkpoint.every == 0) or (final and config.checkpoint.save_final)
        # replicas that average by groups (dynamic sharding) agree on the first and last step and before an evaluation
        # or a save; a save keeps one optimizer state too
        metrics.update(learner.parallel.end_of_step(step, step == 1 or evaluating or saving, learner.optimizer, moments=saving))
        metrics["threads"] = threads
        train_time += metrics["step_time_s"]
        train_tokens += metrics["tokens"]
        metrics.update(health.check(step, metrics))  # events and responses (scalerl/trainer/recovery.py)
        if evaluating:
            eval_start = time.perf_counter()
            state["last_pass_rate"] = metrics["eval/pass_rate"] = evaluate(config, rollout, step)
            metrics["eval_time_s"] = time.perf_counter() - eval_start
            eval_time += metrics["eval_time_s"]
            metrics.update(health.check_pass_rate(step, state["last_pass_rate"]))
        metrics["time/elapsed_s"] = elapsed = time.perf_counter() - wall_start
        if (total_s := eta.update(step, metrics, elapsed_s=elapsed, save_time_total_s=save_time)) is not None:
            metrics["time/estimated_total_s"], metrics["time/remaining_s"] = total_s, total_s - elapsed
        logger.log(step, metrics)
        console.step(step, metrics)
        state.update(step=step, train_time_s=train_time, train_tokens=train_tokens)
        if saving:
            save_start = time.perf_counter()
            checkpoint(step)
            save_time += time.perf_counter() - save_start
    return {"train_time_s": train_time, "loop_time_s": time.perf_counter() - loop_start - eval_time - save_time,  # steps and logging only
            "eval_time_s": eval_time, "checkpoint_time_s": save_time, "tokens_per_s": train_tokens / max(train_time, 1e-9)}
