"""AdamW for bf16 weights: moments in bf16 or 8 bits, and error feedback of the weight update's rounding.

One update of parameter w (stored bf16) with gradient g, as torch.optim.AdamW, computed in float32:

    m ← β1·m + (1 − β1)·g          v ← β2·v + (1 − β2)·g²
    w' = (1 − lr·λ)·w − lr · (m / (1 − β1^t)) / (√(v / (1 − β2^t)) + ε)  +  e
    w ← bf16(w')                    e ← w' − w         (error feedback)

Without e, every change smaller than half a bf16 ulp of w (2^-9 of |w|) is lost: at lr 1e-4 on weights of
size 0.02 most updates would be. With it, the dropped rounding error is carried into the next update,
so the weights follow the float32 trajectory to within one rounding. e is stored 8-bit block-wise
(bitsandbytes' signed dynamic map, one float32 absmax per 256 values), like the 8-bit moments (m signed,
v unsigned): 1 byte per value each instead of 4.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from scalerl.errors import ScaleRLError

BLOCK = 256  # values per absmax scale of the 8-bit states


def _bnb_functional():
    try:
        # its CPU backend warns at import that an optional 4-bit kernel package is absent; nothing here uses 4 bits
        logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
        import bitsandbytes.functional as F
    except ImportError:
        raise ScaleRLError("precision.mode=compressed (8-bit optimizer states and error feedback) needs bitsandbytes: "
                           "pip install 'scalerl[compressed]'; or use precision.mode=standard") from None
    return F


class Quantized8bit:
    """A float tensor stored as uint8 codes of a dynamic map with one absmax per block of `BLOCK` values."""

    def __init__(self, like: torch.Tensor, *, signed: bool):
        self.F = _bnb_functional()
        self.code = self.F.create_dynamic_map(signed=signed).to(like.device)
        self.shape = like.shape
        self.codes, self.state = self.F.quantize_blockwise(torch.zeros(like.numel(), device=like.device), code=self.code,
                                                           blocksize=BLOCK)

    def get(self) -> torch.Tensor:
        return self.F.dequantize_blockwise(self.codes, self.state).view(self.shape)

    def set(self, value: torch.Tensor) -> None:
        self.F.quantize_blockwise(value.reshape(-1).float(), code=self.code, blocksize=BLOCK, out=self.codes,
                                  absmax=self.state.absmax)

    def tensors(self) -> list[torch.Tensor]:
        """What it stores (the map is shared by all states of one kind and not counted)."""
        return [self.codes, self.state.absmax]


class CompactAdamW(torch.optim.Optimizer):
    """AdamW whose moments are kept in `moments` ("bfloat16" or "8bit") and, for bf16 weights with
    `error_feedback`, with the rounding error of each update carried into the next (module docstring)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, moments: str = "8bit", error_feedback: bool = True):
        if moments not in ("bfloat16", "8bit"):
            raise ValueError(f"moments must be bfloat16 or 8bit, not {moments!r}")
        if moments == "8bit" or error_feedback:
            _bnb_functional()  # fail now, with the install hint, not at the first step
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.moments, self.error_feedback = moments, error_feedback

    def _new_state(self, p: torch.Tensor) -> dict[str, Any]:
        if self.moments == "8bit":
            state: dict[str, Any] = {"exp_avg": Quantized8bit(p, signed=True), "exp_avg_sq": Quantized8bit(p, signed=False)}
        else:
            state = {"exp_avg": torch.zeros_like(p, dtype=torch.bfloat16), "exp_avg_sq": torch.zeros_like(p, dtype=torch.bfloat16)}
        if self.error_feedback and p.dtype != torch.float32:
            state["error"] = Quantized8bit(p, signed=True)
        state["step"] = 0
        return state

    @staticmethod
    def _read(s) -> torch.Tensor:
        return s.get() if isinstance(s, Quantized8bit) else s.float()

    @staticmethod
    def _write(s, value: torch.Tensor) -> None:
        s.set(value) if isinstance(s, Quantized8bit) else s.copy_(value)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            (b1, b2), lr, eps, wd = group["betas"], group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if not self.state[p]:
                    self.state[p].update(self._new_state(p))
                self._update(p, self.state[p], b1, b2, lr, eps, wd)
        return loss

    def _update(self, p: torch.Tensor, state: dict[str, Any], b1: float, b2: float, lr: float, eps: float, wd: float) -> None:
        """One parameter's step in float32, holding at most four float32 temporaries of its size at once
        (`scalerl estimate` counts them in the peak: `optimizer_step`)."""
        state["step"] += 1
        t, g = state["step"], p.grad.float()
        m = self._read(state["exp_avg"]).mul_(b1).add_(g, alpha=1 - b1)
        v = self._read(state["exp_avg_sq"]).mul_(b2).addcmul_(g, g, value=1 - b2)
        del g
        self._write(state["exp_avg"], m)
        self._write(state["exp_avg_sq"], v)
        denom = v.div_(1 - b2**t).sqrt_().add_(eps)  # v is written back already: reuse its storage
        update = m.div_(denom).mul_(-lr / (1 - b1**t))
        del denom, v
        if "error" in state:
            update += state["error"].get()
        target = p.float().mul_(1 - lr * wd).add_(update)
        del update
        p.copy_(target)
        if "error" in state:
            state["error"].set(target.sub_(p.float()))

    def state_bytes(self) -> dict[str, int]:
        """Bytes of the moments and of the error-feedback buffers (codes and scales) held now."""
        out = {"optimizer": 0, "error_feedback": 0}
        for state in self.state.values():
            for key, s in state.items():
                tensors = s.tensors() if isinstance(s, Quantized8bit) else [s] if isinstance(s, torch.Tensor) else []
                out["error_feedback" if key == "error" else "optimizer"] += sum(x.numel() * x.element_size() for x in tensors)
        return out

    # A checkpoint stores the 8-bit codes and scales as they are (bitwise resume), not dequantised floats. The
    # float32 scales travel as their bytes: Optimizer.load_state_dict casts every state tensor to the weights'
    # dtype, which a uint8 value (0-255, exact in bf16) survives and an int32 bit pattern would not.
    def state_dict(self) -> dict[str, Any]:
        packed = super().state_dict()  # its per-parameter dicts are the live ones: build new ones
        packed["state"] = {i: {key: {"codes": s.codes.clone(), "absmax_bytes": s.state.absmax.view(torch.uint8).clone()}
                               if isinstance(s, Quantized8bit) else s for key, s in state.items()}
                           for i, state in packed["state"].items()}
        return packed

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for p, state in self.state.items():
            for key, s in list(state.items()):
                if isinstance(s, dict) and "codes" in s:
                    q = Quantized8bit(p, signed=key != "exp_avg_sq")
                    q.codes.copy_(s["codes"].to(torch.uint8))
                    q.state.absmax.copy_(s["absmax_bytes"].to(torch.uint8).view(torch.float32))
                    state[key] = q
