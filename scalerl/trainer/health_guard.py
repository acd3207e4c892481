"""The health guard: after every step it runs the health rules (scalerl/monitor/health.py), logs the
events (events.jsonl, the console, a webhook), hands the learner the events it responds to
(`LearnerSide.respond`: scalerl/learner/recovery.py), keeps the learner's in-memory restore point
fresh (where the host has room for it: `no_room_for_restore_points`), and stops the run with a one-line
error after nonfinite.max_consecutive non-finite steps in a row. reward_collapse: the step's prompts,
completions and rewards go to collapse/step_N.jsonl."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable

import psutil
import torch
from rich.markup import escape

from scalerl.config import HealthConfig
from scalerl.distributed.context import DistContext
from scalerl.errors import ScaleRLError
from scalerl.monitor.events import Event, EventLog
from scalerl.monitor.health import HealthMonitor, scaler_overflow
from scalerl.jsonl import read_metrics
from scalerl.learner.learner import LearnerSide
from scalerl.types import ScoredBatch


def dump_samples(batch: ScoredBatch, run_dir: Path, step: int) -> str:
    """Write this rank's batch of the step to collapse/step_N.jsonl (one {prompt, completion, reward} per line)."""
    path = run_dir / "collapse" / f"step_{step}.jsonl"
    path.parent.mkdir(exist_ok=True)
    rows = zip(batch.prompts, batch.completions, batch.rewards.tolist(), batch.task_rewards.tolist())
    path.write_text("".join(json.dumps({"prompt": p, "completion": c, "reward": r, "task_reward": tr}) + "\n"
                            for p, c, r, tr in rows))
    return str(path.relative_to(run_dir))


def no_room_for_restore_points(need: int) -> str | None:
    """Why this machine keeps no restore point (None: it does): one would take over half of the host memory available
    to each of the processes of this machine (LOCAL_WORLD_SIZE), e.g. the 84 GB of a 7B model's fp32 weights and AdamW
    moments. The run then only skips a non-finite step, as with health.nonfinite.snapshot_every: 0."""
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    available = psutil.virtual_memory().available / processes
    if need <= 0.5 * available:
        return None
    return (f"health.nonfinite.snapshot_every: a restore point (the trained weights and optimizer state) takes {need / 1e9:.3g} GB "
            f"of host memory, over half of the {available / 1e9:.3g} GB available to this process: none kept, a non-finite step "
            "is only skipped (set health.nonfinite.snapshot_every: 0 to say so)")


class HealthGuard:
    """Runs the health rules after every step, applies the responses and logs the events."""

    def __init__(self, cfg: HealthConfig, learner: LearnerSide, ctx: DistContext, run_dir: Path, printer: Callable[[str], None], *,
                 completions_per_step: int, publish: Callable[[], None] = lambda: None, resume_after: int | None = None,
                 pass_rate_before: float | None = None, monitor_state: dict[str, Any] | None = None):
        """`completions_per_step`: over all ranks; `publish`: hand the learner's weights to the rollout side (after a restore)."""
        self.cfg, self.learner, self.ctx, self.run_dir, self.publish = cfg, learner, ctx, run_dir, publish
        self.monitor = HealthMonitor(cfg, completions_per_step=completions_per_step)
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
        self.snapshot_every = cfg.nonfinite.snapshot_every if cfg.enabled and cfg.nonfinite.enabled else 0
        if self.snapshot_every and (why := no_room_for_restore_points(learner.restore_point_bytes())) is not None:
            printer(escape(why))
            self.snapshot_every = 0
        if self.snapshot_every:
            learner.restore_point(resume_after or 0)

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def check(self, step: int, metrics: dict[str, Any], batch: ScoredBatch | None = None) -> dict[str, float]:
        """Evaluate the rules on the step's metrics, respond, log; returns the `health/*` metrics. `batch`: the
        step's, dumped on a reward collapse. Raises ScaleRLError after too many non-finite steps in a row (or the
        first, when disabled)."""
        cfg, ctx = self.cfg, self.ctx
        self.report_hangs(step, metrics)
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
            if self.learner.respond(event):  # kl_explosion, nonfinite (scalerl/learner/recovery.py)
                self.publish()
            if event.rule == "reward_collapse" and batch is not None:
                event.values["dump"] = dump_samples(batch, self.run_dir, step) if ctx.is_main else None
                event.action = f"dumped the step's batch to {event.values['dump']}"
            self.log.emit(event)
            if event.rule == "nonfinite" and self.monitor.nonfinite_streak >= cfg.nonfinite.max_consecutive:
                raise ScaleRLError(f"step {self.monitor.nonfinite_first}: loss or gradient norm is not finite for "
                                   f"{self.monitor.nonfinite_streak} steps in a row (to step {step}); lower optim.lr or keep optim.max_grad_norm set")
        every = self.snapshot_every
        if finite and every and step % every == 0:
            self.learner.restore_point(step)
        return self.log.metrics()

    def report_hangs(self, step: int, metrics: dict[str, Any]) -> None:
        """A `hang` event for each reward worker that answered nothing within its deadline this step (it was
        replaced, its completions got the fallback: scalerl/rewards/safe_call.py, workers.py)."""
        silent = {key[len("reward/"):-len("_hangs")]: n for key, n in metrics.items() if key.startswith("reward/") and key.endswith("_hangs")}
        for name, n in silent.items():
            if n:
                self.log.emit(Event(step, "hang", "warning", f"reward component '{name}': its worker process answered nothing within "
                                    f"the component's timeout_s ({n:g} rank(s)); the batch's completions got its fallback",
                                    action="its worker was killed and replaced", values={"part": f"reward component {name}"}))
        if metrics.get("reward_hung_workers"):
            self.log.emit(Event(step, "hang", "warning", f"a reward worker process of reward.num_workers answered nothing for "
                                f"{self.cfg.hang.deadline_s:g} s (health.hang.deadline_s); its items got the fallback "
                                f"({metrics.get('reward_failed_items', 0):g} item(s) lost this step)",
                                action="the pool's workers were killed and replaced", values={"part": "reward worker pool"}))

    def check_pass_rate(self, step: int, pass_rate: float) -> dict[str, float]:
        """The held-out pass-rate rule after an evaluation (step 0: the one before training); returns the `health/*` metrics."""
        if self.cfg.enabled:
            for event in self.monitor.evaluate_pass_rate(step, pass_rate):
                self.log.emit(event)
        return self.log.metrics()

    def finish(self, step: int) -> dict[str, Any]:
        """The phase verdict (an info event, printed) for summary.json: phase_verdict and phase_stats."""
        stats = self.monitor.verdict()
        verdict = stats.pop("verdict")
        if self.cfg.enabled:
            detail = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items())
            self.log.emit(Event(step, "phase_verdict", "info", f"reward curve: {verdict} ({detail})", values={"verdict": verdict}))
        return {"phase_verdict": verdict, "phase_stats": stats, "health_events": dict(self.log.counts)}

    def record(self, event: Event) -> None:
        """An event decided outside the rules (failing rewards: Bookkeeping.halt): events.jsonl, the console, the webhook."""
        self.log.emit(event)

    def close(self) -> None:
        self.log.close()
