"""precision.mode=standard with precision.compute=fp16: dynamic loss scaling (scalerl/config/plan.py's
next_loss_scale, Learner.micro_step/apply_update), checked against fp32 gradients and on an overflow."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_overrides

from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.errors import ScaleRLError
from scalerl.config.plan import (
    GROWTH_INTERVAL,
    INITIAL_LOSS_SCALE,
    next_loss_scale,
    precision_policy,
)
from scalerl.trainer import loop
from scalerl.trainer.step import step_metrics

FP16 = {"precision.mode": "standard", "precision.compute": "fp16"}


def test_next_loss_scale_worked_numbers():
    assert next_loss_scale(65536.0, 7, finite=False) == (32768.0, 0)  # overflow: halve, count restarts
    assert next_loss_scale(1.0, 0, finite=False) == (1.0, 0)  # never below 1
    assert next_loss_scale(65536.0, 7, finite=True) == (65536.0, 8)
    assert next_loss_scale(65536.0, GROWTH_INTERVAL - 1, finite=True) == (131072.0, 0)  # 2000 clean updates: double


def test_fp16_is_standard_only():
    assert precision_policy("standard", compute="fp16").autocast_dtype == "float16"
    assert precision_policy("standard", compute="fp16").loss_scaling
    assert not precision_policy("standard").loss_scaling
    with pytest.raises(ValueError, match="precision.compute=fp16 applies to precision.mode=standard"):
        precision_policy("compressed", compute="fp16")


def _learner(runs, name, **extra):
    config = load_config(overrides=tiny_overrides(runs, name, **extra))
    return loop.build_roles(config, DistContext(), resume=False)[:2]


def _applied_gradient(learner, batch):
    """The gradient the optimizer steps with (after unscaling and clipping), and the step's metrics."""
    seen, step = [], learner.optimizer.step

    def recording_step(*args, **kwargs):
        seen.append(torch.cat([p.grad.flatten() for p in learner.policy.parameters()]))
        return step(*args, **kwargs)

    learner.optimizer.step = recording_step
    metrics = learner.learn(batch, 1)
    return (seen[0] if seen else None), metrics


def test_fp16_gradients_are_unscaled_and_match_fp32(runs):
    """One update under fp16 autocast with the loss times 2^16: the optimizer sees the fp32 run's gradient
    (to fp16 rounding), not 65536 times it; the scale is logged."""
    torch.manual_seed(0)
    rollout32, learner32 = _learner(runs, "fp32", **{"optim.max_grad_norm": None})
    batch = rollout32.produce(1)
    g32, _ = _applied_gradient(learner32, batch)
    _, learner16 = _learner(runs, "fp16", **{**FP16, "optim.max_grad_norm": None})
    assert learner16.state.loss_scale == INITIAL_LOSS_SCALE
    g16, metrics = _applied_gradient(learner16, batch)
    assert metrics["loss_scale"] == INITIAL_LOSS_SCALE and metrics["loss_scale_overflows"] == 0.0
    rel = ((g16 - g32).norm() / g32.norm()).item()
    assert rel < 0.02, rel  # fp16 matmuls: ~1e-3 here; an unscaled gradient would be 65536× off
    assert learner16.state.loss_scale_good == 1


def test_without_loss_scaling_small_fp16_gradients_underflow():
    """Why the scale: under fp16 autocast a loss of 1e-9 × a sum gives activation gradients below fp16's
    smallest subnormal (6e-8), which flush to zero; multiplied by 2^16 first and divided after, they survive."""
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    x = torch.randn(32, 64)

    def grad(scale: float, dtype) -> torch.Tensor:
        layer.zero_grad()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = layer(x).float().sum() * 1e-9
        (loss * scale).backward()
        return layer[0].weight.grad / scale

    ref = grad(1.0, None)
    plain, scaled = grad(1.0, torch.float16), grad(INITIAL_LOSS_SCALE, torch.float16)
    assert (plain == 0).all()  # everything underflowed
    assert ((scaled - ref).norm() / ref.norm()).item() < 0.01


def _guard(config, rollout, learner, runs):
    from scalerl.trainer.health_guard import HealthGuard

    return HealthGuard(config.health, learner, learner.ctx, runs, printer=lambda _m: None,
                       completions_per_step=config.plan.batch_size)


@pytest.mark.parametrize("health", [True, False])
def test_an_overflow_skips_the_update_halves_the_scale_and_raises_no_alarm(runs, health):
    config = load_config(overrides=tiny_overrides(runs, f"overflow-{health}", **FP16, **{"health.enabled": health}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    guard = _guard(config, rollout, learner, runs)
    learner.state.loss_scale = 1e38  # the scaled loss's gradients overflow: inf
    before = [p.detach().clone() for p in learner.policy.parameters()]
    metrics = loop.train_step(rollout, learner, 1, learner.ctx)[1]
    assert metrics["loss_scale_overflows"] == 1.0 and not math.isfinite(metrics["grad_norm"]) and math.isfinite(metrics["loss"])
    assert all(torch.equal(a, b) for a, b in zip(before, learner.policy.parameters()))  # skipped
    assert learner.state.loss_scale == 5e37 and learner.state.updates == 0
    guard.check(1, metrics)  # neither an error (health off) nor a non-finite event and snapshot restore (health on)
    assert guard.monitor.nonfinite_streak == 0
    for step in range(2, 8):  # the scale comes down by halves until the gradients fit
        guard.check(step, loop.train_step(rollout, learner, step, learner.ctx)[1])
    assert learner.state.updates >= 1 and learner.state.loss_scale < 5e37


@pytest.mark.parametrize("scale", [1.0, 1e38])
def test_a_nonfinite_loss_or_a_gradient_at_scale_one_is_not_the_scalers(runs, scale):
    """At a scale of 1 an inf gradient is the model's own, and a non-finite loss is never the scaler's:
    no overflow is excused and the usual error follows (health checks off)."""
    config = load_config(overrides=tiny_overrides(runs, f"nan-{scale}", **FP16, **{"health.enabled": False}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    batch = rollout.produce(1)
    learner.state.loss_scale = scale
    with torch.no_grad():
        learner.policy.get_output_embeddings().weight[0, 0] = float("inf")
    metrics = step_metrics(batch, learner.learn(batch, 1), learner.ctx, elapsed=1.0, rollout_s=0.5)
    assert metrics["loss_scale_overflows"] == float(scale > 1)  # the learner halves the scale either way
    with pytest.raises(ScaleRLError, match="not finite"):
        _guard(config, rollout, learner, runs).check(1, metrics)
