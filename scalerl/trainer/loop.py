"""The training job: `train(config)` is what `scalerl train` and the Python API call.

    build_roles (setup.py)          the rollout side and the learner around one policy, the run folder
    restore (persist.py)            on --resume: the newest intact checkpoint
    each step:
      train_step (step.py)          rollout.produce → learner.learn → publish the weights → metrics
      learner.end_of_step           replicas that sync lazily agree before an evaluation or a save
      book.checked                  health rules and responses (health_guard.py)
      rollout.evaluate              the held-out pass rate, every eval.every steps and at the end
      book.log / book.save          metrics, console, time estimate; a checkpoint every checkpoint.every
SIGTERM or SIGINT: the step finishes, a checkpoint is written, `Stopped` is raised (signals.py).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Mapping

from scalerl.config import Config
from scalerl.config.checks import check_once
from scalerl.distributed.context import init_distributed, shutdown
from scalerl.errors import RewardsFailing
from scalerl.models.loading import load_tokenizer
from scalerl.rollout.async_rollout import ProducerProcess
from scalerl.trainer.bookkeeping import Bookkeeping, finished_summary
from scalerl.trainer.persist import restore
from scalerl.trainer.run_lock import RunLock
from scalerl.trainer.setup import build_roles
from scalerl.trainer.signals import GracefulStop
from scalerl.trainer.step import train_step

__all__ = ["build_roles", "train", "train_step"]


def train(config: Config, *, resume: bool = False, overwrite: bool = False, producer: ProducerProcess | None = None,
          reward_funcs: Mapping[str, Callable] | None = None) -> dict[str, Any]:
    """Run (or resume) a training job; returns the summary that is also written to summary.json.
    `producer`: where an async run's producer runs (default: a process beside this one; a Ray actor under
    `scalerl launch --ray`); `reward_funcs`: the Python API's reward callables (scalerl/api/), by the NAME of
    the reward components that name them `function: python:NAME`."""
    check_once(config, reward_funcs)
    ctx = init_distributed(config.train.device, config.health.hang.deadline_s)
    try:
        with GracefulStop() as stop, RunLock() as lock:  # one run per folder, for the run's life (run_lock.py)
            rollout, learner, run_dir = build_roles(config, ctx, resume, overwrite, producer, reward_funcs, lock)
            try:
                warn = (lambda line: print(line, file=sys.stderr)) if ctx.is_main else (lambda line: None)
                state = restore(rollout, learner, ctx, run_dir, config.train.seed, warn) if resume else {"step": 0}
                if state["step"] >= config.train.steps:  # finished: its summary stays as it was
                    return finished_summary(run_dir, state["step"], ctx)
                with Bookkeeping(config, ctx, rollout, learner, run_dir, load_tokenizer(config.model), state, resume) as book:
                    if "pass_rate_before" not in state:
                        book.evaluated(0, rollout.evaluate(0))
                    for step in range(state["step"] + 1, config.train.steps + 1):
                        if (signum := stop.requested(ctx)) is not None:
                            book.stop(signum, step - 1)  # checkpoints the last finished step, raises Stopped
                        threads = book.threads()
                        try:
                            batch, metrics = train_step(rollout, learner, step, ctx)
                        except RewardsFailing as failing:  # reward.failures: checkpoint, a critical event, one line
                            book.halt(step - 1, failing)
                        final = step == config.train.steps
                        evaluating = final or bool(config.eval.every and step % config.eval.every == 0)
                        saving = (bool(config.checkpoint.every and step % config.checkpoint.every == 0)
                                  or (final and config.checkpoint.save_final))
                        # replicas that average by groups (dynamic sharding) agree on the first and last step and before an
                        # evaluation or a save; a save keeps one optimizer state too
                        metrics.update(learner.end_of_step(step, agree=step == 1 or evaluating or saving, saving=saving))
                        metrics["threads"] = threads
                        metrics.update(book.checked(step, metrics, batch))
                        if evaluating:
                            start = time.perf_counter()
                            pass_rate = rollout.evaluate(step)
                            metrics.update(book.evaluated(step, pass_rate, time.perf_counter() - start))
                        book.log(step, metrics)
                        if saving:
                            book.save(step)
                    book.finish()
                return book.summary()
            finally:
                rollout.close()
                learner.close()
                # nothing may hold the process group when shutdown destroys it (scalerl/distributed/context.py)
                rollout = learner = book = None  # noqa: F841
    finally:
        shutdown(ctx)
