"""What the trainer does about health events (`scalerl/monitor/health.py` finds them):

- kl_explosion: β × kl.beta_factor (on top of any schedule, `KLController.boost`) and the base
  learning rate × kl.lr_factor, kept for the rest of the run (the scheduler's base_lrs, which
  checkpoints save).
- nonfinite: the update was already skipped (`step.apply_update`); restore the last in-memory
  snapshot of model and optimizer, turn gradient clipping on at 1.0 if it was off, and stop with
  a one-line error after nonfinite.max_consecutive such steps in a row.
- reward_collapse: dump the step's prompts, completions and rewards to collapse/step_N.jsonl.

The snapshot is a CPU copy of the policy (and critic) weights and the optimizer state, taken
every nonfinite.snapshot_every good steps: with AdamW about 3 × the fp32 parameter bytes of host
RAM (12 MB for the 1M-parameter built-in model, ~84 GB for a 7B model: set snapshot_every: 0
there, which keeps only the skip). The lr schedule, β and the data position are not rolled back.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from rich.markup import escape

from scalerl.errors import ScaleRLError
from scalerl.monitor.events import Event, EventLog
from scalerl.monitor.health import HealthMonitor
from scalerl.monitor.metrics import read_metrics
from scalerl.trainer.step import Trainer


def cpu_copy(obj: Any) -> Any:
    """A deep copy with every tensor cloned to the CPU (state dicts nest dicts and lists)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj


@dataclass
class Snapshot:
    step: int
    policy: dict[str, torch.Tensor]
    critic: dict[str, torch.Tensor] | None
    optimizer: dict[str, Any]


def take_snapshot(t: Trainer, step: int) -> Snapshot:
    critic = cpu_copy(t.critic.state_dict()) if t.critic is not None else None
    return Snapshot(step, cpu_copy(t.policy.state_dict()), critic, cpu_copy(t.optimizer.state_dict()))


def restore_snapshot(t: Trainer, snap: Snapshot) -> None:
    """Load the snapshot's weights and optimizer state, keeping today's lr (schedule and health cuts)."""
    t.policy.load_state_dict(snap.policy)
    if t.critic is not None:
        t.critic.load_state_dict(snap.critic)
    t.optimizer.load_state_dict(snap.optimizer)
    for group, lr in zip(t.optimizer.param_groups, t.scheduler.get_last_lr()):
        group["lr"] = lr
    t.sampler.sync_weights()


def scale_lr(t: Trainer, factor: float) -> tuple[float, float]:
    """base_lr ← factor · base_lr in every group of the LambdaLR (so every later lr is scaled too),
    and the current lr with it; returns the policy's (old, new) lr."""
    old = t.scheduler.get_last_lr()[0]
    t.scheduler.base_lrs = [lr * factor for lr in t.scheduler.base_lrs]
    for group in t.optimizer.param_groups:
        group["lr"] *= factor
    # get_last_lr() (the next step's `lr` metric) reads this; the next scheduler.step() recomputes it from base_lrs.
    t.scheduler._last_lr = [group["lr"] for group in t.optimizer.param_groups]
    return old, t.scheduler.get_last_lr()[0]


def dump_samples(t: Trainer, step: int) -> str:
    """Write this rank's batch of the step to collapse/step_N.jsonl (one {prompt, completion, reward} per line)."""
    path = t.run_dir / "collapse" / f"step_{step}.jsonl"
    path.parent.mkdir(exist_ok=True)
    s = t.last_samples
    rows = zip(s.prompts, s.completions, s.rewards.tolist(), s.task_rewards.tolist())
    path.write_text("".join(json.dumps({"prompt": p, "completion": c, "reward": r, "task_reward": tr}) + "\n"
                            for p, c, r, tr in rows))
    return str(path.relative_to(t.run_dir))


class HealthGuard:
    """Runs the health rules after every step, applies the responses and logs the events."""

    def __init__(self, t: Trainer, printer: Callable[[str], None], *, resume_after: int | None = None,
                 pass_rate_before: float | None = None):
        self.t, self.cfg = t, t.config.health
        self.monitor = HealthMonitor(self.cfg, completions_per_step=t.config.batch_size * t.ctx.world_size)
        self.log = EventLog(t.run_dir, write=t.ctx.is_main, printer=lambda m: printer(escape(m)),
                            webhook_url=self.cfg.webhook_url, webhook_timeout_s=self.cfg.webhook_timeout_s,
                            resume_after=resume_after)
        if resume_after and (t.run_dir / "metrics.jsonl").exists():  # the windows continue where the run left off
            if pass_rate_before is not None:
                self.monitor.evaluate_pass_rate(0, pass_rate_before)
            for row in read_metrics(t.run_dir):
                if row["step"] <= resume_after and row["loss"] is not None and row["grad_norm"] is not None:
                    self.monitor.observe(row["step"], row)
        keep = self.cfg.enabled and self.cfg.nonfinite.enabled and self.cfg.nonfinite.snapshot_every
        self.snapshot = take_snapshot(t, resume_after or 0) if keep else None

    def check(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        """Evaluate the rules on the step's metrics, respond, log; returns the `health/*` metrics.
        Raises ScaleRLError after too many non-finite steps in a row (or the first, when disabled)."""
        t, cfg = self.t, self.cfg
        finite = all(math.isfinite(metrics[k]) for k in ("loss", "grad_norm"))
        if not cfg.enabled or (not finite and not cfg.nonfinite.enabled):
            if not finite:  # the bad update was not applied
                raise ScaleRLError(f"step {step}: loss or gradient norm is not finite; lower optim.lr or keep optim.max_grad_norm set")
            self.monitor.observe(step, metrics)  # for the phase verdict only
            return {}
        # The loss and KL are this rank's; their mean over ranks makes every rank take the same decisions.
        kl_key = cfg.kl.metric
        local = [metrics["loss"], metrics[kl_key] if metrics.get(kl_key) is not None else 0.0]
        mean_loss, mean_kl = (t.ctx.sum(torch.tensor(local, dtype=torch.float64)) / t.ctx.world_size).tolist()
        judged = {**metrics, "loss": mean_loss, kl_key: mean_kl if metrics.get(kl_key) is not None else None}
        for event in self.monitor.evaluate(step, judged):
            if event.rule == "kl_explosion":
                self._cool_kl(step, event)
            elif event.rule == "nonfinite":
                self._recover(step, event)
            elif event.rule == "reward_collapse" and t.last_samples is not None:
                event.values["dump"] = dump_samples(t, step) if t.ctx.is_main else None
                event.action = f"dumped the step's batch to {event.values['dump']}"
            self.log.emit(event)
            if event.rule == "nonfinite" and self.monitor.nonfinite_streak >= cfg.nonfinite.max_consecutive:
                raise ScaleRLError(f"step {self.monitor.nonfinite_first}: loss or gradient norm is not finite for "
                                   f"{self.monitor.nonfinite_streak} steps in a row (to step {step}); lower optim.lr or keep optim.max_grad_norm set")
        every = cfg.nonfinite.snapshot_every
        if finite and every and step % every == 0:
            self.snapshot = take_snapshot(t, step)
        return self.log.metrics()

    def check_pass_rate(self, step: int, pass_rate: float) -> dict[str, float]:
        """The held-out pass-rate rule after an evaluation (step 0: the one before training); returns the `health/*` metrics."""
        if self.cfg.enabled:
            for event in self.monitor.evaluate_pass_rate(step, pass_rate):
                self.log.emit(event)
        return self.log.metrics()

    def _cool_kl(self, step: int, event: Event) -> None:
        t, kl = self.t, self.cfg.kl
        beta_old = t.kl_ctl.beta_at(step + 1)
        t.kl_ctl.boost(kl.beta_factor, kl.min_beta)
        beta_new = t.kl_ctl.beta_at(step + 1)
        lr_old, lr_new = scale_lr(t, kl.lr_factor)
        event.values.update(beta_old=beta_old, beta_new=beta_new, lr_old=lr_old, lr_new=lr_new)
        event.action = (f"beta {beta_old:.4g} -> {beta_new:.4g} (x{kl.beta_factor:g}, floor {kl.min_beta:g}), "
                        f"lr {lr_old:.3g} -> {lr_new:.3g} (x{kl.lr_factor:g}) from the next step on")

    def _recover(self, step: int, event: Event) -> None:
        t = self.t
        actions = ["skipped the update"]
        if self.snapshot is not None:
            restore_snapshot(t, self.snapshot)
            actions.append(f"restored the model and optimizer of step {self.snapshot.step}")
        event.values["restored_step"] = self.snapshot.step if self.snapshot is not None else None
        if t.config.optim.max_grad_norm is None:
            t.config.optim.max_grad_norm = 1.0
            actions.append("turned gradient clipping on (optim.max_grad_norm = 1.0)")
        event.values.update(precision=t.config.train.precision, max_grad_norm=t.config.optim.max_grad_norm)
        event.message += f"; precision {t.config.train.precision}"
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
