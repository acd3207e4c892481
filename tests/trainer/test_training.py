"""The trainer end to end on the built-in model: learning, the reference model, accumulation."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_cli, tiny_overrides
from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.monitor.metrics import read_metrics
from scalerl.trainer import loop, setup
from scalerl.trainer import step as step_module

REQUIRED = {"step", "reward_mean", "reward_std", "kl", "loss", "grad_norm", "lr", "entropy", "response_len", "tokens_per_s", "step_time_s"}


@pytest.mark.slow
def test_scalerl_train_raises_reward_and_pass_rate(runs):
    """`scalerl train` through the real CLI: reward rises, held-out pass rate rises, the run directory is complete."""
    proc = run_cli("-m", "scalerl.cli.main", "train", "--steps", "60", "--name", "learn", "--set", f"log.run_dir={runs}",
                   "--set", "rollout.prompts_per_step=8", "--set", "eval.every=30", "--set", "train.threads=2",
                   "--set", "log.console=plain", env={"OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr
    run = runs / "learn"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 61))
    assert all(REQUIRED <= r.keys() for r in rows)
    assert [r["step"] for r in rows if "eval/pass_rate" in r] == [30, 60]
    first, last = (sum(r["reward_mean"] for r in part) / len(part) for part in (rows[:20], rows[-20:]))
    assert last > first + 0.05, (first, last)  # measured here: 0.176 -> 0.257
    summary = json.loads((run / "summary.json").read_text())
    assert summary["pass_rate_after"] > summary["pass_rate_before"] + 0.1, summary  # measured: 0.325 -> 0.495
    folded = "".join(ch for ch in proc.stdout if not ch.isspace() and ch != "│")  # the table wraps long paths
    assert "runsummary" in folded and str(run) in folded
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "step_0000060" / "COMPLETE").is_file()

    # TensorBoard's own reader sees the same reward series.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tb = [e.value for e in acc.Scalars("reward_mean")]
    assert tb == pytest.approx([r["reward_mean"] for r in rows], abs=1e-6)


def _build(runs, name, **extra):
    config = load_config(overrides=tiny_overrides(runs, name, **extra))
    return loop.build_trainer(config, DistContext(), resume=False)


def test_beta_zero_never_builds_or_runs_a_reference_model(runs, monkeypatch):
    def forbidden(_policy):
        raise AssertionError("the reference model must not be built when beta = 0")

    monkeypatch.setattr(loop, "build_reference", forbidden)
    t = _build(runs, "beta0")
    assert t.reference is None
    metrics = loop.train_step(t, 1)
    assert metrics["kl"] is None and metrics["beta"] == 0.0


def test_beta_positive_uses_a_frozen_reference_and_reports_kl(runs):
    t = _build(runs, "beta", **{"algorithm.kl.beta": 0.1, "optim.lr": 1e-3})
    assert t.reference is not None and not any(p.requires_grad for p in t.reference.parameters())
    before = [p.clone() for p in t.reference.parameters()]
    first = loop.train_step(t, 1)
    second = loop.train_step(t, 2)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first update
    assert second["kl"] > 0.0  # after one update at lr 1e-3 they differ
    assert all(torch.equal(a, b) for a, b in zip(before, t.reference.parameters()))


def _one_update(runs, name, **extra):
    torch.manual_seed(0)
    t = _build(runs, name, **extra)
    loop.train_step(t, 1)
    return [p.detach().clone() for p in t.policy.parameters()]


@pytest.mark.parametrize("loss_agg", ["token", "sequence"])
def test_gradient_accumulation_matches_the_whole_batch(runs, loss_agg):
    """4 micro-batches of 4 completions give the same update as one batch of 16."""
    whole = _one_update(runs, f"whole-{loss_agg}", **{"algorithm.loss_agg": loss_agg})
    split = _one_update(runs, f"split-{loss_agg}", **{"algorithm.loss_agg": loss_agg, "train.micro_batch_size": 4})
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-5) for a, b in zip(whole, split))
    assert any(not torch.equal(a, b) for a, b in zip(whole, _one_update(runs, "other", **{"optim.lr": 1e-3})))


def test_bf16_autocast_runs_on_cpu(runs):
    t = _build(runs, "bf16", **{"train.precision": "bf16"})
    metrics = loop.train_step(t, 1)
    assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["grad_norm"] > 0


def test_nan_loss_stops_with_a_clear_error(runs, monkeypatch):
    t = _build(runs, "nan")
    original = step_module.aggregate

    def poisoned(*args, **kwargs):
        return original(*args, **kwargs) * float("nan")

    from scalerl.errors import ScaleRLError

    before = [p.detach().clone() for p in t.policy.parameters()]
    monkeypatch.setattr(step_module, "aggregate", poisoned)
    monkeypatch.setattr(loop, "build_trainer", lambda *a, **k: t)
    with pytest.raises(ScaleRLError, match="step 1: loss or gradient norm is not finite"):
        loop._train(t.config, t.ctx, resume=False)
    # the NaN gradient was never applied, and no checkpoint holds a poisoned model
    assert all(torch.equal(a, b) for a, b in zip(before, t.policy.parameters()))
    assert not (runs / "nan" / "checkpoints").exists()


def test_setup_rejects_fp8_without_an_h100():
    from scalerl.errors import ScaleRLError

    with pytest.raises(ScaleRLError, match="fp8"):
        setup.check_precision("fp8", torch.device("cpu"))
