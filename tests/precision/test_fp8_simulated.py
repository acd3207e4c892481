"""Simulated FP8 (torchao tensorwise recipe) on CPU: the numbers, the saved-tensor storage, the swap."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scalerl.precision.fp8_simulated import (
    E4M3,
    E5M2,
    SimulatedFloat8Linear,
    _Fp8Linear,
    convert_to_simulated_fp8,
    dequantize_fp8,
    fp8_max,
    quantize_fp8,
)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_worked_numbers_e4m3_and_e5m2():
    assert (fp8_max(E4M3), fp8_max(E5M2)) == (448.0, 57344.0)
    x = torch.tensor([1.0, -0.5, 0.3, 2.0])
    q, scale = quantize_fp8(x, E4M3)
    assert q.dtype == E4M3 and scale.dtype == torch.float32 and scale.dim() == 0 and scale.item() == 224.0
    # x·224 = 224, -112, 67.2, 448. e4m3 has 8 steps per binade: step 16 in [128, 256), step 8 in [64, 128),
    # so 224, -112 and 448 (the max) are exact and 67.2 rounds to 64 (|67.2-64| = 3.2 < |72-67.2| = 4.8).
    assert q.float().tolist() == [224.0, -112.0, 64.0, 448.0]
    expected = torch.tensor([224.0, -112.0, 64.0, 448.0]) / torch.tensor(224.0)
    assert torch.equal(dequantize_fp8(q, scale), expected)
    assert dequantize_fp8(q, scale).tolist()[2] == torch.tensor(64 / 224, dtype=torch.float32).item()
    # e5m2: scale 57344/2 = 28672; 0.3·28672 = 8601.6, step 2048 in [8192, 16384) → 8192.
    q5, s5 = quantize_fp8(x, E5M2)
    assert s5.item() == 28672.0 and q5.float().tolist() == [28672.0, -14336.0, 8192.0, 57344.0]
    assert dequantize_fp8(q5, s5, torch.bfloat16).dtype == torch.bfloat16


def test_relative_round_off_bound_and_full_range():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    for dtype, bound in ((E4M3, 2.0**-4), (E5M2, 2.0**-3)):
        q, scale = quantize_fp8(x, dtype)
        assert q.float().abs().max().item() == fp8_max(dtype)  # the scale uses the whole range
        normal = (x * scale).abs() >= torch.finfo(dtype).tiny  # 2^-6 (e4m3), 2^-14 (e5m2)
        rel = ((dequantize_fp8(q, scale) - x).abs() / x.abs())[normal]
        assert normal.sum() > 4000
        assert rel.max().item() <= bound
        assert rel.max().item() > bound / 2  # really rounded to 3 (2) mantissa bits, not more


def _operands(requires_grad: bool = True):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, 32, generator=gen).requires_grad_(requires_grad)
    w = (torch.randn(16, 32, generator=gen) / 32**0.5).requires_grad_()
    b = torch.randn(16, generator=gen).requires_grad_()
    return x, w, b, torch.randn(4, 8, 16, generator=gen)


def test_fp8_linear_forward_and_grads_vs_fp32():
    x, w, b, g_out = _operands()
    out = _Fp8Linear.apply(x, w, b)
    (out * g_out).sum().backward()
    x_ref, w_ref, b_ref = (t.detach().clone().requires_grad_() for t in (x, w, b))
    ref = F.linear(x_ref, w_ref, b_ref)
    (ref * g_out).sum().backward()

    # forward: exactly the hand-computed quantise → dequantise → F.linear
    by_hand = F.linear(dequantize_fp8(*quantize_fp8(x, E4M3)), dequantize_fp8(*quantize_fp8(w, E4M3)), b)
    assert torch.equal(out, by_hand)
    # backward: dy in e5m2, operands from the saved e4m3 tensors
    g = dequantize_fp8(*quantize_fp8(g_out, E5M2))
    torch.testing.assert_close(x.grad, g @ dequantize_fp8(*quantize_fp8(w, E4M3)), rtol=1e-5, atol=1e-6)
    gw = g.reshape(-1, 16).t() @ dequantize_fp8(*quantize_fp8(x, E4M3)).reshape(-1, 32)
    torch.testing.assert_close(w.grad, gw, rtol=1e-5, atol=1e-5)

    for got, want in ((out, ref), (x.grad, x_ref.grad), (w.grad, w_ref.grad)):
        assert _rel(got, want) < 0.1
        assert not torch.equal(got, want)  # quantisation really happened
    # the bias is added in high precision (as torchao does): its gradient is the unquantised Σ dy
    torch.testing.assert_close(b.grad, b_ref.grad)
    assert b.grad.dtype == b.dtype and w.grad.dtype == w.dtype and x.grad.dtype == x.dtype


def test_fp8_linear_respects_needs_input_grad():
    x, w, b, g_out = _operands(requires_grad=False)
    b.requires_grad_(False)
    (_Fp8Linear.apply(x, w, b) * g_out).sum().backward()
    assert x.grad is None and b.grad is None and w.grad is not None
    _Fp8Linear.apply(x, w, None).sum().backward()  # no bias at all


def test_saved_tensors_are_float8():
    layer = SimulatedFloat8Linear(32, 16)
    x = torch.randn(4, 8, 32, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.dtype, t.shape)) or t, lambda t: t):
        layer(x).sum().backward()
    big = [(dtype, shape) for dtype, shape in saved if dtype.is_floating_point and shape.numel() > 1]
    assert sorted(big, key=lambda s: s[1].numel()) == [(E4M3, torch.Size([16, 32])), (E4M3, torch.Size([4, 8, 32]))]
    assert all(shape.numel() <= 1 for dtype, shape in saved if dtype == torch.float32)  # only the scales


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=96, max_position_embeddings=64, attn_implementation="eager")
    return LlamaForCausalLM(config)


def test_convert_llama_shares_parameters_and_trains():
    model = _tiny_llama()
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref_logits = model(tokens).logits
    ids_before = [id(p) for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # built BEFORE the swap

    names = convert_to_simulated_fp8(model)
    projs = {f"model.layers.{i}.{part}" for i in range(2) for part in
             ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert set(names) == projs and all(type(model.get_submodule(n)) is SimulatedFloat8Linear for n in names)
    assert type(model.lm_head) is nn.Linear
    assert [id(p) for p in model.parameters()] == ids_before

    with torch.no_grad():
        logits = model(tokens).logits
    assert _rel(logits, ref_logits) < 0.1 and not torch.equal(logits, ref_logits)

    losses = []
    for _ in range(20):
        loss = model(tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_convert_skips_names_and_odd_shapes():
    model = nn.Sequential(nn.Linear(32, 16), nn.Linear(16, 10), nn.Linear(10, 16))
    model.add_module("head", nn.Linear(16, 16))
    assert convert_to_simulated_fp8(model, skip=("head",)) == ["0"]
    assert [type(m) for m in model] == [SimulatedFloat8Linear, nn.Linear, nn.Linear, nn.Linear]
    assert convert_to_simulated_fp8(nn.Sequential(nn.Linear(16, 16, bias=False)), skip=()) == ["0"]


def test_autocast_bf16_output():
    layer = SimulatedFloat8Linear(32, 16)
    x = torch.randn(4, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    assert _rel(out, F.linear(x, layer.weight, layer.bias)) < 0.1
    out.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
