"""Bytes per element of each precision mode, and of the trainable state it keeps: what the learner's start-up
line (`expected_bytes`) and the memory estimator (scalerl/predict/memory.py) both count with."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalerl.config.plan import MODES, PrecisionPolicy, precision_policy


@dataclass(frozen=True)
class Precision:
    """Bytes per element of what a precision mode (`PrecisionPolicy`, scalerl/config/plan.py) holds."""

    weights: float  # per element of a trainable weight (and of its gradient)
    moments: str  # "float32", "bfloat16" or "8bit"
    error_feedback: bool
    activations: float
    kv: float
    reference: float  # per element of the frozen reference's weights
    working_copy: float = 0.0  # autocast's bf16 copy of the decoder's weights, per element (embedding and FP32 head not cast)
    fp32_per_layer: float = 0.0  # bytes per token per hidden unit that a layer saves in float32 beyond `activations`
    fp32_final_norm: float = 0.0  # the same for the final norm

    @classmethod
    def of(cls, policy: PrecisionPolicy) -> "Precision":
        """The widths of a mode, read off its policy (the one description of the modes): weights and gradients in the
        master dtype; activations, the KV cache and the reference in the compute dtype; under autocast over fp32
        weights, a bf16 working copy of the decoder's weights; under autocast, the norms' float32 outputs (4 bytes per
        hidden unit per layer, 2 for the final norm beyond the compute-dtype copy)."""
        master = 4 if policy.weights_dtype == "float32" else 2
        compute = 2 if policy.autocast_dtype else 4
        return cls(weights=master, moments=policy.moments, error_feedback=policy.error_feedback, activations=compute, kv=compute,
                   reference=compute, working_copy=2 if master == 4 and policy.autocast_dtype else 0,
                   fp32_per_layer=4 if policy.autocast_dtype else 0, fp32_final_norm=2 if policy.autocast_dtype else 0)


PRECISIONS: dict[str, Precision] = {mode: Precision.of(precision_policy(mode)) for mode in MODES}
BLOCK = 256  # values per float32 scale of an 8-bit state (scalerl/precision/adamw.py)


def quantized_bytes(n: int) -> int:
    """One 8-bit block-wise state of a tensor of n values: its codes and its float32 scales."""
    return n + 4 * math.ceil(n / BLOCK)


def state_bytes(tensors: list[tuple[int, ...]], precision: Precision, *, optim_8bit: bool = False) -> dict[str, int]:
    """Bytes of the trainable weights, their gradients, AdamW's moments and the error-feedback buffers, for
    parameter tensors of the given shapes (torch's fused AdamW also keeps a 4-byte step per tensor, not counted)."""
    sizes = [math.prod(t) for t in tensors]
    n = sum(sizes)
    moments = "8bit" if optim_8bit else precision.moments
    optimizer = {"float32": 8 * n, "bfloat16": 4 * n, "8bit": sum(2 * quantized_bytes(k) for k in sizes)}[moments]
    error = sum(quantized_bytes(k) for k in sizes) if precision.error_feedback else 0
    return {"weights": int(n * precision.weights), "gradients": int(n * precision.weights), "optimizer": optimizer, "error_feedback": error}
