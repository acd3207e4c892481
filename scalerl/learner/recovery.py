"""The learner's responses to health events (`scalerl/monitor/health.py` finds them, the training job's
health guard passes them to `Learner.respond`):

- kl_explosion: β × kl.beta_factor (on top of any schedule, `KLController.boost`) and every later
  learning rate × kl.lr_factor (`Learner.scale_lr`), kept for the rest of the run in the learner's
  state, which checkpoints save.
- nonfinite: the update was already skipped (`Learner.apply_update`); restore the last in-memory
  restore point of model and optimizer (the job then hands the restored weights to the rollout side),
  and turn gradient clipping on at 1.0 if it was off (learner state; the config stays as written).

The restore point is a CPU copy of the trained weights of the policy (and critic) and the optimizer
state, taken every nonfinite.snapshot_every good steps: with AdamW about 3 × the fp32 bytes of the
trained parameters in host RAM (12 MB for the 1M-parameter built-in model, ~84 GB for a 7B model
trained in full; LoRA's frozen base is not copied). Where one would take over half of the host memory
available to the process, none is kept and the start says so (scalerl/trainer/health_guard.py), as
with snapshot_every: 0, which keeps only the skip. The lr schedule, β and the data position are not
rolled back.
"""

from __future__ import annotations

from typing import Any

from scalerl.config import HealthKLConfig
from scalerl.monitor.events import Event


def cool_kl(learner: Any, event: Event, kl: HealthKLConfig) -> None:
    """Raise β and cut every later learning rate of `learner` (a Learner); the event says by how much."""
    step = event.step
    beta_old = learner.kl_ctl.beta_at(step + 1)
    learner.kl_ctl.boost(kl.beta_factor, kl.min_beta)
    beta_new = learner.kl_ctl.beta_at(step + 1)
    lr_old, lr_new = learner.scale_lr(kl.lr_factor)
    event.values.update(beta_old=beta_old, beta_new=beta_new, lr_old=lr_old, lr_new=lr_new)
    event.action = (f"beta {beta_old:.4g} -> {beta_new:.4g} (x{kl.beta_factor:g}, floor {kl.min_beta:g}), "
                    f"lr {lr_old:.3g} -> {lr_new:.3g} (x{kl.lr_factor:g}) from the next step on")


def recover(learner: Any, event: Event) -> bool:
    """Back to `learner`'s restore point (when it keeps one) and clipping on; True when the weights changed."""
    actions = ["skipped the update"]
    restored = learner.kept_snapshot is not None
    if restored:
        learner.restore(learner.kept_snapshot)
        actions.append(f"restored the model and optimizer of step {learner.snapshot_step}")
    event.values["restored_step"] = learner.snapshot_step if restored else None
    if learner.state.max_grad_norm is None:
        learner.state.max_grad_norm = 1.0
        actions.append("turned gradient clipping on (optim.max_grad_norm = 1.0)")
    event.values.update(precision=learner.precision.mode, max_grad_norm=learner.state.max_grad_norm)
    event.message += f"; precision {learner.precision.mode}"
    event.action = "; ".join(actions)
    return restored
