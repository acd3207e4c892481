"""The trainer end to end on the built-in model: learning, the reference model, accumulation."""

from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import run_cli, tiny_overrides
from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.jsonl import read_metrics
from scalerl.learner import build as learner_build
from scalerl.trainer import loop
from scalerl.learner import learner as learner_module

THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2  # a pytest-xdist worker has one core of the two

REQUIRED = {"step", "reward_mean", "reward_std", "kl", "loss", "grad_norm", "lr", "entropy", "response_len", "tokens_per_s", "step_time_s"}


@pytest.mark.slow
def test_scalerl_train_raises_reward_and_pass_rate(runs):
    """`scalerl train` through the real CLI: reward rises, held-out pass rate rises, the run directory is complete."""
    proc = run_cli("-m", "scalerl.cli.main", "train", "--steps", "60", "--name", "learn", "--set", f"log.run_dir={runs}",
                   "--set", "rollout.prompts_per_step=8", "--set", "eval.every=30", "--set", f"train.threads={THREADS}",
                   "--set", "log.console=plain", env={"OMP_NUM_THREADS": str(THREADS)})
    assert proc.returncode == 0, proc.stderr
    run = runs / "learn"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 61))
    assert all(REQUIRED <= r.keys() for r in rows)
    assert [r["step"] for r in rows if "eval/pass_rate" in r] == [30, 60]
    # The work each step did, which the time estimate prices (scalerl/predict/time_estimate.py).
    for r in rows:
        assert r["completions"] == 8 * 8 and r["time/rollout_s"] + r["time/learn_s"] == pytest.approx(r["step_time_s"])
        width, rem = divmod(r["sampled_positions"], r["completions"])  # completions x the longest one
        assert rem == 0 and r["tokens"] / r["completions"] <= width <= 8 and r["trained_positions"] > r["sampled_positions"]
        # the HF engine's decode growth per cached position (`scalerl plan`), wherever 3+ decode steps followed the first
        assert ("time/decode_s_per_position" in r) == (width >= 4), r
    assert all(a["time/elapsed_s"] < b["time/elapsed_s"] for a, b in zip(rows, rows[1:]))
    first, last = (sum(r["reward_mean"] for r in part) / len(part) for part in (rows[:20], rows[-20:]))
    assert last > first + 0.05, (first, last)  # measured here: 0.176 -> 0.257
    summary = json.loads((run / "summary.json").read_text())
    assert summary["time_upper_at_10pct_s"] >= summary["time_estimate_at_10pct_s"] > 0
    assert summary["pass_rate_after"] > summary["pass_rate_before"] + 0.1, summary  # measured: 0.325 -> 0.495
    assert summary["eval_metric"] == "pass rate"  # the arithmetic environment has a verifier
    folded = "".join(ch for ch in proc.stdout if not ch.isspace() and ch != "│")  # the table wraps long paths
    assert "runsummary" in folded and "held-outpassrate" in folded and str(run) in folded
    assert "scalerlreportDIR(therunononeHTMLpage),scalerlevalDIR,scalerlexportDIR--outOUT" in folded  # what to do next
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "step_0000060" / "COMPLETE").is_file()

    # TensorBoard's own reader sees the same reward series.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    tb = [e.value for e in acc.Scalars("reward_mean")]
    assert tb == pytest.approx([r["reward_mean"] for r in rows], abs=1e-6)


def _build(runs, name, **extra):
    config = load_config(overrides=tiny_overrides(runs, name, **extra))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    return rollout, learner


def test_beta_zero_never_builds_or_runs_a_reference_model(runs, monkeypatch):
    def forbidden(*_args):
        raise AssertionError("the reference model must not be built when beta = 0")

    monkeypatch.setattr(learner_build, "build_reference", forbidden)
    rollout, learner = _build(runs, "beta0")
    assert learner.reference is None
    metrics = loop.train_step(rollout, learner, 1, learner.ctx)[1]
    assert metrics["kl"] is None and metrics["beta"] == 0.0


def test_beta_positive_uses_a_frozen_reference_and_reports_kl(runs):
    rollout, learner = _build(runs, "beta", **{"algorithm.kl.beta": 0.1, "optim.lr": 1e-3})
    assert learner.reference is not None and not any(p.requires_grad for p in learner.reference.parameters())
    before = [p.clone() for p in learner.reference.parameters()]
    first = loop.train_step(rollout, learner, 1, learner.ctx)[1]
    second = loop.train_step(rollout, learner, 2, learner.ctx)[1]
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first update
    assert second["kl"] > 0.0  # after one update at lr 1e-3 they differ
    assert all(torch.equal(a, b) for a, b in zip(before, learner.reference.parameters()))


def _one_update(runs, name, sizes: list | None = None, **extra):
    """The policy's weights after one step; `sizes` receives each micro-batch's row count."""
    torch.manual_seed(0)
    rollout, learner = _build(runs, name, **extra)
    if sizes is not None:
        real = learner.micro_step
        learner.micro_step = lambda rollout_, t, micro, *a: sizes.append(micro.size) or real(rollout_, t, micro, *a)
    loop.train_step(rollout, learner, 1, learner.ctx)[1]
    return [p.detach().clone() for p in learner.policy.parameters()]


@pytest.mark.parametrize("loss_agg", ["token", "sequence"])
def test_gradient_accumulation_matches_the_whole_batch(runs, loss_agg):
    """4 micro-batches of 4 completions give the same update as one batch of 16.

    AdamW's first step is lr·g/(|g|+eps): at the default eps it is ±lr whatever the gradient's scale
    (a wrongly scaled sum would pass) and a gradient near 0 turns round-off into a sign flip (kernels
    differ between machines). With eps 1 and no clipping the step is ≈ lr·g, so the comparison sees
    the gradient itself."""
    linear = {"algorithm.loss_agg": loss_agg, "optim.eps": 1.0, "optim.max_grad_norm": None, "optim.lr": 1e-2}
    whole = _one_update(runs, f"whole-{loss_agg}", **linear)
    split = _one_update(runs, f"split-{loss_agg}", **linear, **{"train.micro_batch_size": 4})
    assert all(torch.allclose(a, b, atol=1e-7, rtol=1e-5) for a, b in zip(whole, split))
    # by tokens (train.micro_batch_tokens): rows sorted by length, packed under the budget, padding columns dropped;
    # 40 tokens cuts the 16 rows (prompts of 5-7 tokens, completions of 3-4) into 5 micro-batches of 2-4 rows, 100 into 2
    for budget in (40, 100):
        sizes = []
        by_tokens = _one_update(runs, f"tokens{budget}-{loss_agg}", **linear, **{"train.micro_batch_tokens": budget}, sizes=sizes)
        assert 1 < len(sizes) and len(set(sizes)) > 1 and sum(sizes) == 16, sizes
        assert all(torch.allclose(a, b, atol=1e-7, rtol=1e-5) for a, b in zip(whole, by_tokens)), budget
    assert any(not torch.allclose(a, b, atol=1e-7, rtol=1e-5) for a, b in zip(whole, _one_update(runs, "other", **{**linear, "optim.lr": 2e-2})))


@pytest.mark.parametrize("epochs, mini, micro", [(1, None, None), (3, None, None), (2, 8, 4), (2, 4, None)])
def test_optimizer_steps_are_epochs_times_mini_batches(runs, monkeypatch, epochs, mini, micro):
    """Each update sees exactly one mini-batch's rows, epochs x (16 / mini) updates per step."""
    rollout, learner = _build(runs, f"count-{epochs}-{mini}-{micro}", **{"train.epochs": epochs, "train.mini_batch_size": mini,
                                                                       "train.micro_batch_size": micro})
    rows_per_update, seen = [], []
    real_step, real_micro = learner.optimizer.step, learner.micro_step

    def counting_micro(rollout_, t, rows, *a, **k):
        seen.append(rows.size)
        return real_micro(rollout_, t, rows, *a, **k)

    def counting_step(*a, **k):
        rows_per_update.append(sum(seen))
        seen.clear()
        return real_step(*a, **k)

    monkeypatch.setattr(learner.optimizer, "step", counting_step)
    monkeypatch.setattr(learner, "micro_step", counting_micro)
    loop.train_step(rollout, learner, 1, learner.ctx)[1]
    batch, mini_size = 16, mini or 16
    assert rows_per_update == [mini_size] * (epochs * batch // mini_size)
    assert learner.state.updates == epochs * batch // mini_size
    # the lr schedule runs over every update of the run: steps x epochs x mini-batches
    assert learner.plan.total_updates == 6 * epochs * batch // mini_size


def test_lr_schedule_runs_per_update_with_warm_up_and_decay(runs, monkeypatch):
    rollout, learner = _build(runs, "lr", **{"optim.lr": 0.1, "optim.warmup_steps": 2, "optim.schedule": "linear",
                                             "train.steps": 3, "train.epochs": 2})
    applied, real = [], learner.optimizer.step
    monkeypatch.setattr(learner.optimizer, "step", lambda *a, **k: applied.append(learner.optimizer.param_groups[0]["lr"]) or real(*a, **k))
    logged = [loop.train_step(rollout, learner, step, learner.ctx)[1]["lr"] for step in (1, 2, 3)]
    # 3 steps x 2 epochs = 6 updates: 0.1 x [1/2, 2/2 (warm-up), then linear 1 - k/3 for k = 0..3]
    assert applied == pytest.approx([0.05, 0.1, 0.1, 0.1 * 2 / 3, 0.1 / 3, 0.0])
    assert logged == pytest.approx([0.05, 0.1, 0.1 / 3])  # a step's `lr` is its first update's


def test_on_policy_is_derived_from_versions_not_assumed(runs, monkeypatch):
    """Versions, not assumptions: a batch sampled before the last update is off-policy (staleness 1), and its
    tokens are weighted by π_old / π_sampler with π_old = the weights before the update. Learned once, those are
    the weights the training forward runs with, so no separate π_old forward runs, fresh batch or stale; learned
    for two epochs, π_old is computed first."""
    rollout, learner = _build(runs, "versions", **{"optim.lr": 1e-2, "algorithm.tis_cap": 1.05})
    calls = []
    real = learner.frozen_forward
    monkeypatch.setattr(learner, "frozen_forward", lambda model, *a, **k: calls.append(model) or real(model, *a, **k))
    fresh, stale = rollout.produce(1), rollout.produce(2)  # both sampled by version 0
    assert fresh.policy_version == stale.policy_version == learner.version == 0
    metrics = learner.learn(fresh, 1)
    assert metrics["on_policy"] == 1.0 and metrics["staleness"] == 0.0 and calls == []
    assert metrics["ratio_mean"] == pytest.approx(1.0) and abs(metrics["sampler_kl"]) < 1e-5
    old = real(learner.policy_forward, stale.rollout)  # π_old: the weights after the first update
    metrics = learner.learn(stale, 2)
    assert metrics["on_policy"] == 0.0 and metrics["staleness"] == 1.0 and calls == []
    assert metrics["ratio_mean"] == pytest.approx(1.0)  # π_θ / π_old at the step's only update
    mask = stale.rollout.completion_mask.float()
    drift = float(((stale.rollout.sampler_logprobs - old) * mask).sum() / mask.sum())
    assert metrics["sampler_kl"] == pytest.approx(drift, abs=1e-6) and abs(drift) > 1e-4
    assert metrics["tis_clip_frac"] > 0  # some stale tokens' π_old / π_sampler above the cap
    rollout.sync_weights(None, learner.version)
    assert rollout.produce(3).policy_version == 2
    _, twice = _build(runs, "epochs", **{"train.epochs": 2})
    calls.clear()
    own = twice.frozen_forward
    monkeypatch.setattr(twice, "frozen_forward", lambda model, *a, **k: calls.append(model) or own(model, *a, **k))
    twice.learn(rollout.produce(4), 1)
    assert calls == [twice.policy_forward]


def _matmul_dtypes(fn, vocab: int):
    """{(dtype, is the LM head)} of every matrix multiply that runs inside fn(), as the kernels saw them
    (after autocast); the LM head's are those whose output has `vocab` columns (forward) or rows/columns (backward)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = set()
    mm = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default,
          torch.ops.aten.matmul.default, torch.ops.aten.linear.default}

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in mm:
                tensors = [a for a in args if isinstance(a, torch.Tensor)] + [out]
                seen.add((args[-1].dtype if func == torch.ops.aten.addmm.default else args[0].dtype,
                          any(vocab in t.shape[-2:] for t in tensors)))
            return out

    with Record():
        fn()
    return seen


@pytest.mark.parametrize("mode, fp32_head, expected", [
    ("standard", True, {(torch.bfloat16, False), (torch.float32, True)}),  # bf16 everywhere but the FP32 LM head
    ("standard", False, {(torch.bfloat16, False), (torch.bfloat16, True)}),
    ("compressed", True, {(torch.bfloat16, False), (torch.float32, True)}),
    ("fp32", True, {(torch.float32, False), (torch.float32, True)}),
])
def test_precision_policy_sets_the_dtype_the_matmuls_run_in(runs, mode, fp32_head, expected):
    """Fails if a bf16 mode silently computes in fp32, or if the FP32 LM head is only a cast after a bf16 matmul."""
    rollout, learner = _build(runs, f"dtype-{mode}-{fp32_head}", **{"precision.mode": mode, "model.fp32_lm_head": fp32_head})
    batch = rollout.produce(1)
    vocab = learner.policy.config.vocab_size
    assert _matmul_dtypes(lambda: learner.learn(batch, 1), vocab) == expected  # every forward and backward matmul of the update
    assert _matmul_dtypes(lambda: rollout.produce(2), vocab) == expected  # sampling runs in the same precision, head included
    master = torch.bfloat16 if mode == "compressed" else torch.float32
    assert all(p.dtype == master for p in learner.policy.parameters())
    assert torch.isfinite(torch.tensor(learner.lr())) and learner.state.updates == 1


def test_config_is_frozen_and_health_responses_live_in_learner_state(runs):
    from pydantic import ValidationError

    config = load_config(overrides=tiny_overrides(runs, "frozen"))
    with pytest.raises(ValidationError):
        config.optim.lr = 1.0
    _, learner = _build(runs, "state", **{"optim.max_grad_norm": None})
    lr = learner.lr()
    assert learner.scale_lr(0.5) == pytest.approx((lr, lr / 2))
    state = learner.state_dict()
    assert state["lr_scale"] == 0.5 and state["max_grad_norm"] is None and "kl_controller" in state


def test_nan_loss_stops_with_a_clear_error(runs, monkeypatch):
    rollout, learner = _build(runs, "nan")
    original = learner_module.rl_objective

    def poisoned(*args, **kwargs):
        loss, diagnostics = original(*args, **kwargs)
        return loss * float("nan"), diagnostics

    from scalerl.errors import ScaleRLError

    before = [p.detach().clone() for p in learner.policy.parameters()]
    monkeypatch.setattr(learner_module, "rl_objective", poisoned)
    monkeypatch.setattr(loop, "build_roles", lambda *a, **k: (rollout, learner, runs / "nan"))
    config = load_config(overrides=tiny_overrides(runs, "nan"))
    with pytest.raises(ScaleRLError, match="step 1: loss or gradient norm is not finite"):
        loop.train(config)
    # the NaN gradient was never applied, and no checkpoint holds a poisoned model
    assert all(torch.equal(a, b) for a, b in zip(before, learner.policy.parameters()))
    assert not (runs / "nan" / "checkpoints").exists()


def test_setup_rejects_fp8_without_an_h100():
    from scalerl.errors import ScaleRLError
    from scalerl.config.plan import precision_policy
    from scalerl.precision.apply import check_precision

    with pytest.raises(ScaleRLError, match="H100-class"):
        check_precision(precision_policy("aggressive", fp8="auto"), torch.device("cpu"))
    check_precision(precision_policy("aggressive", fp8="simulated"), torch.device("cpu"))  # the CPU path is allowed


def test_frozen_log_probs_by_tokens_equal_by_rows(runs):
    """π_old's and π_ref's log-probs (`frozen_forward`) cut by a token budget, each micro-batch trimmed of its padding and
    put back in row order, equal the whole batch's on every completion token."""
    import dataclasses

    rollout, learner = _build(runs, "frozen-tokens", **{"train.micro_batch_tokens": 40})
    batch = rollout.produce(1).rollout
    by_tokens = learner.frozen_forward(learner.policy_forward, batch)
    learner.plan = dataclasses.replace(learner.plan, micro_batch_tokens=None)
    whole = learner.frozen_forward(learner.policy_forward, batch)
    real = batch.completion_mask.bool()
    assert len(learner.micro_batches(batch, slice(0, len(batch)))) == 1
    assert torch.allclose(by_tokens[real], whole[real], atol=1e-5) and whole[real].abs().min() > 0
