"""The memory modes: 8-bit states and error feedback against float32, the int8 reference, bytes per
component against the estimator, and a short training in each mode."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("bitsandbytes", reason="precision.mode=compressed needs bitsandbytes (the test extra installs it)")

from conftest import tiny_overrides  # noqa: E402
from scalerl.config import load_config  # noqa: E402
from scalerl.distributed.context import DistContext  # noqa: E402
from scalerl.precision.adamw import BLOCK, CompactAdamW, Quantized8bit  # noqa: E402
from scalerl.precision.int8_reference import Int8Linear, quantize_rows  # noqa: E402
from scalerl.predict.memory import estimate_memory, shape_of_model_path  # noqa: E402
from scalerl.trainer import loop  # noqa: E402


def test_quantized_state_worked_numbers():
    # two blocks: the first's absmax 0.5, the second's 2.0; the signed map holds +1 exactly (its most negative
    # code is -0.993, its smallest 2e-5), so the largest positive value comes back exactly, the rest within a step
    x = torch.zeros(2 * BLOCK)
    x[0], x[1], x[2] = 0.5, -0.5, 0.2
    x[BLOCK], x[BLOCK + 1] = -2.0, 0.001
    q = Quantized8bit(x, signed=True)
    q.set(x)
    y = q.get()
    assert q.codes.dtype == torch.uint8 and q.codes.numel() == 2 * BLOCK
    assert q.state.absmax.tolist() == [0.5, 2.0]
    assert y[0] == 0.5 and y[3:BLOCK].abs().max() < 0.5 * 1e-4 and abs(y[1] + 0.5) < 0.5 * 0.01 and abs(y[BLOCK] + 2) < 2 * 0.01
    assert abs(y[2] - 0.2) < 0.2 * 0.02 and abs(y[BLOCK + 1] - 0.001) < 0.001 * 0.2
    torch.manual_seed(0)
    z = torch.randn(10_000) * 1e-3
    q = Quantized8bit(z, signed=True)
    q.set(z)
    assert (q.get() - z).norm() / z.norm() < 0.015  # measured 0.012


def _fit(opt_factory, dtype, steps=300):
    """A quadratic fitted by AdamW at lr 1e-4 from weights of size 0.02: most updates are below half a bf16 ulp."""
    torch.manual_seed(0)
    w0, target = torch.randn(4096) * 0.02, torch.randn(4096) * 0.02
    w = torch.nn.Parameter(w0.clone().to(dtype))
    opt = opt_factory([w])
    for _ in range(steps):
        opt.zero_grad()
        ((w.float() - target) ** 2).sum().backward()
        opt.step()
    return w0, w.detach().float()


@pytest.mark.parametrize("moments", ["8bit", "bfloat16"])
def test_error_feedback_keeps_bf16_weights_on_the_fp32_path(moments):
    w0, ref = _fit(lambda p: torch.optim.AdamW(p, lr=1e-4), torch.float32)
    deviation = {}
    for ef in (True, False):
        _, w = _fit(lambda p: CompactAdamW(p, lr=1e-4, moments=moments, error_feedback=ef), torch.bfloat16)
        deviation[ef] = ((w - ref).norm() / (ref - w0).norm()).item()
    # measured: 0.013 (8bit) / 0.012 (bf16) with error feedback, 0.44 / 0.43 without it
    assert deviation[True] < 0.03 and deviation[False] > 0.3, deviation


def test_compact_adamw_with_fp32_weights_matches_torch_adamw():
    """bf16 moments on float32 weights (no error feedback needed): the same update to the moments' rounding."""
    _, ref = _fit(lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1), torch.float32, steps=20)
    _, w = _fit(lambda p: CompactAdamW(p, lr=1e-3, weight_decay=0.1, moments="bfloat16"), torch.float32, steps=20)
    assert torch.allclose(w, ref, atol=2e-4) and not torch.equal(w, ref)


def test_compact_adamw_state_survives_a_checkpoint_bitwise():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(300, dtype=torch.bfloat16))
    b = torch.nn.Parameter(a.detach().clone())
    opt_a, opt_b = CompactAdamW([a], lr=1e-2), CompactAdamW([b], lr=1e-2)
    for _ in range(3):
        a.grad = torch.randn(300, dtype=torch.bfloat16)
        opt_a.step()
    packed = opt_a.state_dict()
    assert packed["state"][0]["exp_avg"]["codes"].dtype == torch.uint8  # stored as codes, not floats
    b.data.copy_(a.data)
    opt_b.load_state_dict(packed)
    g = torch.randn(300, dtype=torch.bfloat16)
    a.grad, b.grad = g.clone(), g.clone()
    opt_a.step()
    opt_b.step()
    assert torch.equal(a, b)


def test_int8_reference_worked_numbers():
    lin = torch.nn.Linear(3, 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.5, -0.25, 0.1], [0.0, 0.0, 2.54]]))
    codes, scale = quantize_rows(lin.weight)
    # row 0: scale 0.5/127; 0.25/s = 63.5 → 64 (half to even), 0.1/s = 25.4 → 25; row 1: scale 0.02, 2.54/0.02 = 127
    assert codes.tolist() == [[127, -64, 25], [0, 0, 127]] and scale.tolist() == pytest.approx([0.5 / 127, 0.02])
    q = Int8Linear(lin)
    x = torch.tensor([[1.0, 1.0, 1.0]])
    assert q(x).tolist()[0] == pytest.approx([(127 - 64 + 25) * 0.5 / 127, 2.54], rel=1e-6)
    assert not list(q.parameters())  # frozen: buffers only


def _build(runs, name, **extra):
    config = load_config(overrides=tiny_overrides(runs, name, **extra))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    return config, rollout, learner


@pytest.mark.parametrize("mode, extra", [
    ("fp32", {}), ("standard", {}), ("compressed", {}), ("compressed", {"precision.reference_8bit": True}),
    ("aggressive", {"precision.fp8": "simulated"}),
])
def test_bytes_per_component_match_the_estimator_exactly(runs, mode, extra):
    config, rollout, learner = _build(runs, f"bytes-{mode}-{len(extra)}", **{"precision.mode": mode, "algorithm.kl.beta": 0.04, **extra})
    expected_at_start = learner.component_bytes(expected=True)
    learner.learn(rollout.produce(1), 1)  # allocates the optimizer's states
    measured = learner.component_bytes()
    assert measured == expected_at_start
    est = estimate_memory(shape_of_model_path("builtin"), precision=mode, micro_batch=1, prompt_len=1, completion_len=1,
                          rollout_sequences=1, reference=True, reference_8bit=config.precision.reference_8bit)
    assert {k: est[k] for k in measured} == measured
    fp32 = 1_063_808 * 4
    ratio = sum(measured.values()) / (5 * fp32)  # against fp32 weights + grads + two moments + reference
    # standard: fp32 weights, grads and moments, the reference in bf16
    assert ratio == pytest.approx({"fp32": 1.0, "standard": 0.9, "compressed": 0.45 if not extra else 0.40,
                                   "aggressive": 0.55}[mode], abs=0.01), ratio


@pytest.mark.parametrize("mode, extra", [("standard", {}), ("standard", {"precision.compute": "fp16"}),
                                         ("compressed", {"precision.reference_8bit": True}),
                                         ("aggressive", {"precision.fp8": "simulated"})])
def test_each_mode_trains(runs, mode, extra):
    """Six steps with a KL term: finite losses, the weights move, the KL to the (int8) reference is small and positive."""
    _, rollout, learner = _build(runs, f"train-{mode}", **{"precision.mode": mode, "algorithm.kl.beta": 0.04, "optim.lr": 1e-3, **extra})
    before = [p.detach().clone() for p in learner.policy.parameters()]
    rows = [loop.train_step(rollout, learner, step, learner.ctx)[1] for step in range(1, 7)]
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in rows)
    moved = sum(not torch.equal(a, b) for a, b in zip(before, learner.policy.parameters()))
    assert moved == len(before)
    assert 0 <= rows[0]["kl"] < 0.05 and rows[-1]["kl"] > 0
