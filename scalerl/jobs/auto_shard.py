"""`scalerl auto-shard`: profile how fast each parameter moves, write dynamic sharding's `param_groups`.

The run's own config trains K steps in one process (a scratch run folder). For every parameter
tensor it records, per update, the relative step ‖Δθ‖/‖θ‖ (how fast the weights drift, which is
what two replicas that do not synchronise drift apart by) and the gradient change rate
‖g_t − g_{t−1}‖/‖g_{t−1}‖ (reported beside it). The rule: a tensor is synchronised every
`interval` steps, the largest of the allowed intervals (2, 5, 10 by default) for which
interval × its mean relative step ≤ 2 × the fastest tensor's mean relative step, i.e. no tensor
drifts between two synchronisations more than the fastest one does in two steps.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from scalerl.config import Config


@dataclass
class TensorProfile:
    name: str
    numel: int
    bytes: int
    relative_step: float  # mean over updates of ‖Δθ‖ / ‖θ‖
    gradient_change: float  # mean over consecutive updates of ‖g_t − g_{t−1}‖ / ‖g_{t−1}‖


def profile(config: Config, steps: int) -> list[TensorProfile]:
    """Train `steps` steps of `config` in one process (a scratch run folder) and measure every policy tensor."""
    from scalerl.distributed.context import DistContext
    from scalerl.trainer.loop import build_roles, train_step

    with tempfile.TemporaryDirectory() as scratch:
        config = config.model_copy(update={"log": config.log.model_copy(update={"run_dir": Path(scratch), "name": "auto-shard"})})
        rollout, learner, _ = build_roles(config, DistContext(), resume=False, overwrite=True)
        named = [(n, p) for n, p in learner.policy.named_parameters() if p.requires_grad]
        steps_sum, changes_sum = dict.fromkeys((n for n, _ in named), 0.0), dict.fromkeys((n for n, _ in named), 0.0)
        counts = {"updates": 0, "changes": 0}
        previous: dict[str, torch.Tensor] = {}
        real_step = learner.optimizer.step

        def measured_step(*args: Any, **kwargs: Any) -> Any:
            before = {n: p.detach().clone() for n, p in named}
            grads = {n: p.grad.detach().clone() for n, p in named if p.grad is not None}
            out = real_step(*args, **kwargs)
            for n, p in named:
                steps_sum[n] += ((p.detach() - before[n]).norm() / before[n].norm().clamp_min(1e-12)).item()
                if n in previous and n in grads:
                    changes_sum[n] += ((grads[n] - previous[n]).norm() / previous[n].norm().clamp_min(1e-12)).item()
            counts["changes"] += bool(previous)
            previous.update(grads)
            counts["updates"] += 1
            return out

        learner.optimizer.step = measured_step
        try:
            for step in range(1, steps + 1):
                train_step(rollout, learner, step, learner.ctx)
        finally:
            rollout.close()
    updates, changes = max(counts["updates"], 1), max(counts["changes"], 1)
    return [TensorProfile(n, p.numel(), p.numel() * p.element_size(), steps_sum[n] / updates, changes_sum[n] / changes)
            for n, p in named]


def assign_intervals(profiles: list[TensorProfile], intervals: tuple[int, ...] = (2, 5, 10)) -> dict[str, int]:
    """{tensor name: sync interval} by the rule of the module docstring."""
    fastest = max(p.relative_step for p in profiles)
    allowed = sorted(intervals)
    out = {}
    for p in profiles:
        fits = [k for k in allowed if k * p.relative_step <= allowed[0] * fastest]
        out[p.name] = max(fits) if fits else allowed[0]
    return out


def communication_fraction(profiles: list[TensorProfile], interval: dict[str, int]) -> float:
    """Bytes averaged per step under these intervals over the bytes of a full gradient sync per step."""
    total = sum(p.bytes for p in profiles)
    return sum(p.bytes / interval[p.name] for p in profiles) / total


def param_groups_yaml(profiles: list[TensorProfile], interval: dict[str, int], steps: int) -> str:
    """The `parallel:` section (exact parameter names as patterns), with the report as comments."""
    groups = []
    for k in sorted(set(interval.values())):
        names = [p.name for p in profiles if interval[p.name] == k]
        groups.append({"name": f"every_{k}", "params": names, "sync_interval": k})
    report = report_lines(profiles, interval, steps)
    body = yaml.safe_dump({"parallel": {"strategy": "dynamic", "param_groups": groups}}, sort_keys=False, width=1000)
    return "".join(f"# {line}\n" for line in report) + body


def report_lines(profiles: list[TensorProfile], interval: dict[str, int], steps: int) -> list[str]:
    fastest = max(profiles, key=lambda p: p.relative_step)
    lines = [f"scalerl auto-shard: {len(profiles)} tensors profiled over {steps} steps; fastest {fastest.name} "
             f"(mean relative step {fastest.relative_step:.2e}); a tensor syncs every k steps, the largest k of "
             f"{sorted(set(interval.values()) | {2, 5, 10})} with k x its relative step <= 2 x the fastest's"]
    for k in sorted(set(interval.values())):
        members = [p for p in profiles if interval[p.name] == k]
        size = sum(p.bytes for p in members)
        steps_mean = sum(p.relative_step for p in members) / len(members)
        change = [p.gradient_change for p in members if math.isfinite(p.gradient_change)]
        lines.append(f"every {k:>2} steps: {len(members):>3} tensors, {size / 2**20:8.2f} MiB, mean relative step {steps_mean:.2e}, "
                     f"mean gradient change {sum(change) / max(len(change), 1):.2f}")
    lines.append(f"communication per step: {communication_fraction(profiles, interval):.1%} of a full gradient sync "
                 "(before the full synchronisations at the first and last step, evaluations and checkpoints)")
    return lines
