"""A frozen model whose linear layers keep their weights in int8 (the compressed mode's reference policy).

Each output row r of a weight W is stored as q_r = round(W_r · 127 / max|W_r|) in int8 with the float32
scale s_r = max|W_r| / 127, and multiplied as x · (q · s)ᵀ in the input's dtype: 1 byte per weight
instead of 2 or 4, a round-off of at most half a step, s_r / 2, per weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, float32 scale per row) of a 2-D weight."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


class Int8Linear(torch.nn.Module):
    """A frozen linear layer: int8 weight codes and per-row scales as buffers (no parameters)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        codes, scale = quantize_rows(linear.weight)
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def weight_dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.codes.float() * self.scale[:, None]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        bias = None if self.bias is None else self.bias.to(dtype)
        return F.linear(x.to(dtype), self.weight_dequantized(dtype), bias)


def quantize_linears(model: torch.nn.Module, skip: tuple[str, ...] = ("lm_head",)) -> list[str]:
    """Replace, in place, every nn.Linear whose name does not end with one of `skip` by an Int8Linear;
    the LM head stays as it is (the log-probs' last matmul). Returns the replaced names."""
    done = []
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear) and not name.endswith(skip):
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, Int8Linear(module))
            done.append(name)
    return done
