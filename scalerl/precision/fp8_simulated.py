"""Simulated FP8 linear layers: torchao's float8 "tensorwise" recipe, reproduced on any device.

The aggressive precision mode runs FP8 matmuls through torchao float8 training on H100s. This module
mimics its numerics and its memory on a CPU so both can be tested without one:

* forward operands (input activations, weights) are quantised to float8_e4m3fn, the output gradient
  in backward to float8_e5m2;
* one scale per tensor, computed fresh on every call: scale = fmax / amax(|x|) (dynamic scaling);
* the matmul runs on the dequantised values (q / scale) in the input's dtype, standing in for the
  scaled FP8 GEMM;
* only the float8 tensors and their scales are saved for backward (1 byte/element), which is the
  activation-memory saving of the real recipe;
* the bias is added in high precision, its gradient is the unquantised output gradient summed
  (torchao adds the bias outside the float8 matmul).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of a float8 dtype: 448 for e4m3fn, 57344 for e5m2."""
    return float(torch.finfo(dtype).max)


def fp8_scale(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Tensorwise scale, a float32 0-dim tensor: fmax / max(amax(|x|), 1e-12)."""
    amax = x.detach().float().abs().amax()
    return fp8_max(dtype) / amax.clamp(min=1e-12)


def quantize_fp8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with q = clamp(x · scale, -fmax, fmax) rounded to `dtype` (round to nearest even)."""
    scale = fp8_scale(x, dtype)
    fmax = fp8_max(dtype)
    return (x.detach().float() * scale).clamp(-fmax, fmax).to(dtype), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x ≈ q / scale, returned in `dtype`."""
    return (q.float() / scale).to(dtype)


class _Fp8Linear(torch.autograd.Function):
    """y = deq(q₄₃(x)) · deq(q₄₃(W))ᵀ + b in x's dtype; backward quantises dy to e5m2.

    Saved for backward: xq, wq (float8_e4m3fn) and their two float32 scales, nothing else.
    grad_x = deq(q₅₂(dy)) · deq(wq);  grad_W = deq(q₅₂(dy))ᵀ · deq(xq) over all leading dims;
    grad_b = Σ dy over leading dims.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        dtype = x.dtype
        xq, x_scale = quantize_fp8(x, E4M3)
        wq, w_scale = quantize_fp8(weight, E4M3)
        with torch.autocast(device_type=x.device.type, enabled=False):
            out = F.linear(dequantize_fp8(xq, x_scale, dtype), dequantize_fp8(wq, w_scale, dtype),
                           None if bias is None else bias.to(dtype))
        ctx.save_for_backward(xq, wq, x_scale, w_scale)
        ctx.dtypes = (dtype, weight.dtype, None if bias is None else bias.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        xq, wq, x_scale, w_scale = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        need_x, need_w, need_b = ctx.needs_input_grad
        grad_x = grad_w = grad_b = None
        with torch.autocast(device_type=grad_out.device.type, enabled=False):
            g = dequantize_fp8(*quantize_fp8(grad_out, E5M2), x_dtype)
            if need_x:
                grad_x = g.matmul(dequantize_fp8(wq, w_scale, x_dtype)).to(x_dtype)
            if need_w:
                x2d = dequantize_fp8(xq, x_scale, x_dtype).reshape(-1, xq.shape[-1])
                grad_w = g.reshape(-1, g.shape[-1]).t().matmul(x2d).to(w_dtype)
            if need_b and b_dtype is not None:
                grad_b = grad_out.reshape(-1, grad_out.shape[-1]).sum(0).to(b_dtype)
        return grad_x, grad_w, grad_b


class SimulatedFloat8Linear(nn.Linear):
    """nn.Linear whose matmul runs through simulated tensorwise FP8 (see `_Fp8Linear`).

    Under torch.autocast the input is cast to the autocast dtype first; the weight is always quantised
    from the master weight, whatever its dtype.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = x.device.type
        if torch.is_autocast_enabled(device_type):
            x = x.to(torch.get_autocast_dtype(device_type))
        return _Fp8Linear.apply(x, self.weight, self.bias)


def _convertible(name: str, module: nn.Module, skip: tuple[str, ...]) -> bool:
    """Plain nn.Linear, name not ending in a skip suffix, in/out features divisible by 16 (torchao's rule)."""
    return (type(module) is nn.Linear and not (skip and name.endswith(skip))
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def convert_to_simulated_fp8(model: nn.Module, skip: Sequence[str] = ("lm_head",)) -> list[str]:
    """Swap, in place, each convertible nn.Linear for a SimulatedFloat8Linear that shares the SAME
    Parameter objects (an optimizer built before or after the swap sees the same tensors).
    Returns the qualified names converted."""
    skip = tuple(skip)
    names = [name for name, module in model.named_modules() if name and _convertible(name, module, skip)]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, child)
        new = SimulatedFloat8Linear(old.in_features, old.out_features, bias=old.bias is not None, device="meta")
        new.weight = old.weight
        new.bias = old.bias
        new.train(old.training)
        setattr(parent, child, new)
    return names
