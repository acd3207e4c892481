"""What the trainer does about health events (`scalerl/monitor/health.py` finds them):

- kl_explosion: β × kl.beta_factor (on top of any schedule, `KLController.boost`) and every later
  learning rate × kl.lr_factor (`Learner.scale_lr`), kept for the rest of the run in the learner's
  state, which checkpoints save.
- nonfinite: the update was already skipped (`Learner.apply_update`); restore the last in-memory
  snapshot of model and optimizer (and hand the restored weights to the rollout side), turn
  gradient clipping on at 1.0 if it was off (learner state; the config stays as written), and stop
  with a one-line error after nonfinite.max_consecutive such steps in a row.
- reward_collapse: dump the step's prompts, completions and rewards to collapse/step_N.jsonl.

The snapshot is a CPU copy of the policy (and critic) weights and the optimizer state, taken
every nonfinite.snapshot_every good steps: with AdamW about 3 × the fp32 parameter bytes of host
RAM (12 MB for the 1M-parameter built-in model, ~84 GB for a 7B model: set snapshot_every: 0
there, which keeps only the skip). The lr schedule, β and the data position are not rolled back.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch
from rich.markup import escape

from scalerl.config import HealthConfig
from scalerl.errors import ScaleRLError
from scalerl.monitor.events import Event, EventLog
from scalerl.monitor.health import HealthMonitor, scaler_overflow
from scalerl.jsonl import read_metrics
from scalerl.types import ScoredBatch
from scalerl.rollout.worker import RolloutWorker
from scalerl.trainer.learner import Learner
from scalerl.trainer.step import publish_weights


def dump_samples(batch: ScoredBatch, run_dir: Path, step: int) -> str:
    """Write this rank's batch of the step to collapse/step_N.jsonl (one {prompt, completion, reward} per line)."""
    path = run_dir / "collapse" / f"step_{step}.jsonl"
    path.parent.mkdir(exist_ok=True)
    rows = zip(batch.prompts, batch.completions, batch.rewards.tolist(), batch.task_rewards.tolist())
    path.write_text("".join(json.dumps({"prompt": p, "completion": c, "reward": r, "task_reward": tr}) + "\n"
                            for p, c, r, tr in rows))
    return str(path.relative_to(run_dir))


class HealthGuard:
    """Runs the health rules after every step, applies the responses and logs the events."""

    def __init__(self, cfg: HealthConfig, rollout: RolloutWorker, learner: Learner, run_dir: Path, printer: Callable[[str], None], *,
                 resume_after: int | None = None, pass_rate_before: float | None = None, monitor_state: dict[str, Any] | None = None):
        self.cfg, self.rollout, self.learner, self.run_dir, ctx = cfg, rollout, learner, run_dir, learner.ctx
        self.monitor = HealthMonitor(cfg, completions_per_step=learner.plan.batch_size * ctx.world_size)
        self.log = EventLog(run_dir, write=ctx.is_main, printer=lambda m: printer(escape(m)),
                            webhook_url=self.cfg.webhook_url, webhook_timeout_s=self.cfg.webhook_timeout_s,
                            resume_after=resume_after)
        if monitor_state is not None:  # the rules' memory as the checkpoint saved it: the windows continue exactly
            self.monitor.load_state_dict(monitor_state)
        elif resume_after and (run_dir / "metrics.jsonl").exists():  # a checkpoint from before that: replay the log
            if pass_rate_before is not None:
                self.monitor.evaluate_pass_rate(0, pass_rate_before)
            for row in read_metrics(run_dir):
                if row["step"] <= resume_after and row["loss"] is not None and row["grad_norm"] is not None:
                    self.monitor.observe(row["step"], row)
        keep = self.cfg.enabled and self.cfg.nonfinite.enabled and self.cfg.nonfinite.snapshot_every
        self.snapshot = learner.snapshot() if keep else None
        self.snapshot_step = resume_after or 0

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def check(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        """Evaluate the rules on the step's metrics, respond, log; returns the `health/*` metrics.
        Raises ScaleRLError after too many non-finite steps in a row (or the first, when disabled)."""
        cfg, ctx = self.cfg, self.learner.ctx
        finite = all(math.isfinite(metrics[k]) for k in ("loss", "grad_norm")) or scaler_overflow(metrics)
        if not cfg.enabled or (not finite and not cfg.nonfinite.enabled):
            if not finite:  # the bad update was not applied
                raise ScaleRLError(f"step {step}: loss or gradient norm is not finite; lower optim.lr or keep optim.max_grad_norm set")
            self.monitor.observe(step, metrics)  # for the phase verdict only
            return {}
        # The loss and KL are this rank's; their mean over ranks makes every rank take the same decisions.
        kl_key = cfg.kl.metric
        local = [metrics["loss"], metrics[kl_key] if metrics.get(kl_key) is not None else 0.0]
        mean_loss, mean_kl = (ctx.sum(torch.tensor(local, dtype=torch.float64)) / ctx.world_size).tolist()
        judged = {**metrics, "loss": mean_loss, kl_key: mean_kl if metrics.get(kl_key) is not None else None}
        for event in self.monitor.evaluate(step, judged):
            if event.rule == "kl_explosion":
                self._cool_kl(step, event)
            elif event.rule == "nonfinite":
                self._recover(step, event)
            elif event.rule == "reward_collapse" and self.rollout.last_batch is not None:
                event.values["dump"] = dump_samples(self.rollout.last_batch, self.run_dir, step) if ctx.is_main else None
                event.action = f"dumped the step's batch to {event.values['dump']}"
            self.log.emit(event)
            if event.rule == "nonfinite" and self.monitor.nonfinite_streak >= cfg.nonfinite.max_consecutive:
                raise ScaleRLError(f"step {self.monitor.nonfinite_first}: loss or gradient norm is not finite for "
                                   f"{self.monitor.nonfinite_streak} steps in a row (to step {step}); lower optim.lr or keep optim.max_grad_norm set")
        every = cfg.nonfinite.snapshot_every
        if finite and every and step % every == 0:
            self.snapshot, self.snapshot_step = self.learner.snapshot(), step
        return self.log.metrics()

    def check_pass_rate(self, step: int, pass_rate: float) -> dict[str, float]:
        """The held-out pass-rate rule after an evaluation (step 0: the one before training); returns the `health/*` metrics."""
        if self.cfg.enabled:
            for event in self.monitor.evaluate_pass_rate(step, pass_rate):
                self.log.emit(event)
        return self.log.metrics()

    def _cool_kl(self, step: int, event: Event) -> None:
        learner, kl = self.learner, self.cfg.kl
        beta_old = learner.kl_ctl.beta_at(step + 1)
        learner.kl_ctl.boost(kl.beta_factor, kl.min_beta)
        beta_new = learner.kl_ctl.beta_at(step + 1)
        lr_old, lr_new = learner.scale_lr(kl.lr_factor)
        event.values.update(beta_old=beta_old, beta_new=beta_new, lr_old=lr_old, lr_new=lr_new)
        event.action = (f"beta {beta_old:.4g} -> {beta_new:.4g} (x{kl.beta_factor:g}, floor {kl.min_beta:g}), "
                        f"lr {lr_old:.3g} -> {lr_new:.3g} (x{kl.lr_factor:g}) from the next step on")

    def _recover(self, step: int, event: Event) -> None:
        learner, rollout = self.learner, self.rollout
        actions = ["skipped the update"]
        if self.snapshot is not None:
            learner.restore(self.snapshot)
            publish_weights(rollout, learner)
            actions.append(f"restored the model and optimizer of step {self.snapshot_step}")
        event.values["restored_step"] = self.snapshot_step if self.snapshot is not None else None
        if learner.state.max_grad_norm is None:
            learner.state.max_grad_norm = 1.0
            actions.append("turned gradient clipping on (optim.max_grad_norm = 1.0)")
        event.values.update(precision=learner.precision.mode, max_grad_norm=learner.state.max_grad_norm)
        event.message += f"; precision {learner.precision.mode}"
        event.action = "; ".join(actions)

    def finish(self, step: int) -> dict[str, Any]:
        """The phase verdict (an info event, printed) for summary.json: phase_verdict and phase_stats."""
        stats = self.monitor.verdict()
        verdict = stats.pop("verdict")
        if self.cfg.enabled:
            detail = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items())
            self.log.emit(Event(step, "phase_verdict", "info", f"reward curve: {verdict} ({detail})", values={"verdict": verdict}))
        return {"phase_verdict": verdict, "phase_stats": stats, "health_events": dict(self.log.counts)}

    def close(self) -> None:
        self.log.close()
