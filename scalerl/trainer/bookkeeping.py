"""What the training job keeps around its steps: the metrics log and console, the health guard, the
time estimate, the step and time totals, checkpoints and the final summary. `loop.train` calls it
between the two roles' work; it decides nothing about learning."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from scalerl.config import Config, dump_config
from scalerl.config.resume import record_resumed_config
from scalerl.distributed.context import DistContext
from scalerl.distributed.watchdog import Hung, peer_silent
from scalerl.errors import RewardsFailing, Stopped
from scalerl.learner.learner import LearnerSide
from scalerl.monitor.console import RunConsole
from scalerl.monitor.events import Event
from scalerl.monitor.metrics import MetricsLogger, NullLogger
from scalerl.monitor.sinks import build_sinks
from scalerl.predict.time_estimate import TimeEstimator
from scalerl.rewards.dump import write_eval_samples
from scalerl.rewards.sources import env_has_verifier
from scalerl.rollout.base import RolloutSide
from scalerl.trainer import checkpoint as ckpt
from scalerl.trainer.core_share import CoreShare
from scalerl.trainer.health_guard import HealthGuard
from scalerl.trainer.persist import save
from scalerl.trainer.step import publish_weights
from scalerl.types import ScoredBatch


def hang_action(checkpoints: Path) -> str:
    """What a run stopped by a silent part says it kept: the newest complete checkpoint on disk, what --resume loads.
    Not the last save this process returned from: a peer stopped right after a checkpoint's files were complete
    leaves this rank waiting in the save's closing barrier, with that checkpoint intact."""
    newest = ckpt.latest_checkpoint(checkpoints)
    return (f"the run stopped; its last checkpoint is {newest} (continue with --resume)" if newest is not None
            else "the run stopped before any checkpoint was written")


class Bookkeeping:
    def __init__(self, config: Config, ctx: DistContext, rollout: RolloutSide, learner: LearnerSide, run_dir: Path,
                 tokenizer: Any, state: dict[str, Any], resume: bool):
        """`state`: the job's state ({'step': 0} for a new run, the checkpoint's on resume)."""
        self.config, self.ctx, self.rollout, self.learner, self.run_dir, self.tokenizer = config, ctx, rollout, learner, run_dir, tokenizer
        self.state, start = state, state["step"]
        self.saved = start
        if resume and ctx.is_main:
            record_resumed_config(config, run_dir, start)
        resumed = start if resume else None
        self.logger = (MetricsLogger(run_dir, tensorboard=config.log.tensorboard, resume_after=resumed, sinks=build_sinks(config, run_dir))
                       if ctx.is_main else NullLogger())
        self.console = RunConsole(config.log.console if ctx.is_main else "none", config.train.steps, start,
                                  eval_label="pass" if env_has_verifier(config.env.name) else "eval")
        for line in learner.start(fresh=start == 0):
            self.console.print(line)
        if resume:
            self.console.print(f"resumed from step {start} in {run_dir}")
        self.health = HealthGuard(config.health, learner, ctx, run_dir, self.console.print,
                                  completions_per_step=config.plan.batch_size * ctx.world_size,
                                  publish=lambda: publish_weights(rollout, learner), resume_after=resumed,
                                  pass_rate_before=state.get("pass_rate_before"), monitor_state=state.pop("health", None))
        self.eta = TimeEstimator(config.train.steps, start, config.eval.every, config.checkpoint.every, config.checkpoint.save_final,
                                 # a multi-turn completion holds the environment's replies too: no cap known
                                 max_new_tokens=config.rollout.max_new_tokens if config.rollout.max_turns == 1 else 0)
        self.share = CoreShare() if config.train.threads is None else None  # threads unset: leave other processes their cores
        self.wall_start = self.loop_start = time.perf_counter()
        self.times = {"train_time_s": state.get("train_time_s", 0.0), "eval_time_s": 0.0, "checkpoint_time_s": 0.0}
        self.tokens = state.get("train_tokens", 0)
        self.phase: dict[str, Any] = {}
        if "pass_rate_before" in state:  # resumed after the first evaluation
            self.console.pass_rate = state.setdefault("last_pass_rate", state["pass_rate_before"])

    def __enter__(self) -> "Bookkeeping":
        return self

    def __exit__(self, kind: Any, err: BaseException | None, trace: Any) -> None:
        try:
            if err is not None:
                self.stopped_by(err)
        finally:
            # after a failed write (a read-only or full disk) closing fails again: the first fault is the one reported
            with contextlib.suppress(OSError) if kind is not None else contextlib.nullcontext():
                try:
                    self.health.close()
                    self.console.close()
                finally:
                    self.logger.close()

    def stopped_by(self, err: BaseException) -> None:
        """A part that stopped answering (`Hung`; a collective that timed out waiting for a peer rank): an event,
        a checkpoint of the last finished step where one can still be written (one process: a collective with a
        silent peer would wait again), then the one-line error saying so. Anything else passes through unchanged."""
        hang = self.config.health.hang
        hung = err if isinstance(err, Hung) else peer_silent(err, self.ctx.rank, self.ctx.world_size, hang.deadline_s)
        if hung is None:
            return
        step = self.state["step"]
        if not self.ctx.active and step > self.saved:
            self.save(step)
        action = hang_action(self.run_dir / "checkpoints")
        self.health.log.emit(Event(step + 1, "hang", "critical", str(hung), action=action, values={"part": hung.part,
                                                                                                     "deadline_s": hang.deadline_s}))
        raise Hung(f"{hung}; {action}", part=hung.part) from err

    def evaluated(self, step: int, pass_rate: float, seconds: float = 0.0) -> dict[str, float]:
        """Record a held-out pass rate (step 0: the untrained model's); returns the step's eval and health metrics."""
        if step == 0:  # before the first step: not part of the loop's times
            self.state["pass_rate_before"] = pass_rate
            self.loop_start = time.perf_counter()
        self.state["last_pass_rate"] = self.console.pass_rate = pass_rate
        self.times["eval_time_s"] += seconds
        self.show_samples(step)
        if step == 0:
            self.logger.before({"eval/pass_rate": pass_rate})  # TensorBoard's eval curve starts at the untrained model
            return self.health.check_pass_rate(0, pass_rate)  # the best so far starts at the untrained model's
        return {"eval/pass_rate": pass_rate, "eval_time_s": seconds, **self.health.check_pass_rate(step, pass_rate)}

    def show_samples(self, step: int) -> None:
        """A few of the evaluation's completions (special tokens dropped): on the console, in TensorBoard's text tab and
        in samples/eval_step_NNNNNN.jsonl (rank 0's)."""
        samples = getattr(self.rollout, "last_eval_samples", None)
        if not samples or not self.ctx.is_main:
            return
        write_eval_samples(self.run_dir, step, samples)
        lines = [f"{s['prompt'][-60:]!r} -> {s['completion'][:80]!r} (score {s['score']:.3g})" for s in samples]
        self.logger.text(step, "eval/samples", "\n\n".join(lines))
        for line in lines:
            self.console.print(f"eval sample (step {step}): {line}")

    def threads(self) -> int:
        return self.share.update() if self.share is not None else torch.get_num_threads()

    def checked(self, step: int, metrics: dict[str, Any], batch: ScoredBatch) -> dict[str, float]:
        """The health rules on the step's metrics (events, responses: scalerl/trainer/health_guard.py)."""
        self.times["train_time_s"] += metrics["step_time_s"]
        self.tokens += metrics["tokens"]
        return self.health.check(step, metrics, batch)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        metrics["time/elapsed_s"] = elapsed = time.perf_counter() - self.wall_start
        if (total_s := self.eta.update(step, metrics, elapsed_s=elapsed, save_time_total_s=self.times["checkpoint_time_s"])) is not None:
            metrics["time/estimated_total_s"], metrics["time/remaining_s"] = total_s, total_s - elapsed
        self.logger.log(step, metrics)
        self.console.step(step, metrics)
        self.state.update(step=step, train_time_s=self.times["train_time_s"], train_tokens=self.tokens)

    def save(self, step: int) -> None:
        start = time.perf_counter()
        state = {**{k: v for k, v in self.state.items() if k != "step"}, "health": self.health.state_dict()}
        save(self.rollout, self.learner, self.ctx, self.run_dir, step, self.tokenizer, state, self.config.checkpoint.keep_last,
             dump_config(self.config))
        self.saved = step
        self.times["checkpoint_time_s"] += time.perf_counter() - start

    def stop(self, signum: int, step: int) -> None:
        """A signal between steps: checkpoint the last finished step (unless it is saved), raise `Stopped`."""
        if self.saved != step:
            self.learner.end_of_step(step, agree=True, saving=True)  # replicas that sync by groups may differ mid-interval
            self.save(step)
        raise Stopped(signum, step, str(self.run_dir / "checkpoints" / f"step_{step:07d}") if step > 0 else None)

    def halt(self, step: int, failing: RewardsFailing) -> None:
        """Rewards failing in the step after `step` (reward.failures): checkpoint `step` (unless it is saved), record a
        critical `reward_failures` event, raise the one-line error saying what was kept."""
        if step > 0 and self.saved != step:
            self.learner.end_of_step(step, agree=True, saving=True)
            self.save(step)
        kept = (f"the checkpoint of step {step} is saved: fix the reward, then resume with --resume" if step > 0
                else "no step had finished, nothing to save: fix the reward and start again")
        self.health.record(Event(step + 1, "reward_failures", "critical", str(failing), action="stopped the run",
                                 values={"component": failing.component, "share": failing.share}))
        raise RewardsFailing(f"{failing}; {kept}", failing.component, failing.share) from None

    def finish(self) -> None:
        """After the last step: the reward curve's phase verdict (an info event)."""
        self.phase = self.health.finish(self.config.train.steps)

    def summary(self) -> dict[str, Any]:
        """summary.json (after the logs closed): pass rates, times, throughput, the phase verdict and health event counts."""
        t = self.times
        loop_s = time.perf_counter() - self.loop_start - t["eval_time_s"] - t["checkpoint_time_s"]  # steps and logging only
        summary = {"pass_rate_before": self.state["pass_rate_before"], "pass_rate_after": self.state["last_pass_rate"],
                   "steps": self.config.train.steps, "wall_time_s": time.perf_counter() - self.wall_start,
                   "train_time_s": t["train_time_s"], "loop_time_s": loop_s, "eval_time_s": t["eval_time_s"],
                   "checkpoint_time_s": t["checkpoint_time_s"], "tokens_per_s": self.tokens / max(t["train_time_s"], 1e-9),
                   "run_dir": str(self.run_dir), **self.phase,
                   # what eval/pass_rate measures: the environment's verifier, or the fused reward where it has none
                   "eval_metric": "pass rate" if env_has_verifier(self.config.env.name) else "mean reward"}
        summary.update(self.eta.summary(summary["wall_time_s"]))  # how good the live time estimate made at 10% was
        if self.ctx.is_main:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        self.console.summary(summary)
        return summary


def finished_summary(run_dir: Path, step: int, ctx: DistContext) -> dict[str, Any]:
    """Resuming a run that already reached train.steps: nothing to do; its summary.json is returned unchanged."""
    if ctx.is_main:
        print(f"{run_dir} already finished at step {step}; nothing to do (continue it with --set train.steps=N, N > {step})",
              file=sys.stdout)
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {"steps": step, "run_dir": str(run_dir)}
