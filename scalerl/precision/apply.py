"""Putting a precision policy (scalerl/config/plan.py) onto the models and the optimizer, and what each part weighs.

    check_precision → weights' dtype at load → prepare_policy (fp8 matmuls) → build_reference (int8 or a
    copy) → build_optimizer (torch's fused AdamW, or CompactAdamW) → component_bytes (the start-up line)
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch

from scalerl.errors import ScaleRLError
from scalerl.config.plan import PrecisionPolicy


def fp8_backend(policy: PrecisionPolicy, device: torch.device) -> str | None:
    """The backend of aggressive's fp8 matmuls on this device, or a ScaleRLError saying what to set."""
    if policy.fp8 is None or policy.fp8 == "simulated":
        return policy.fp8
    h100 = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
    if not h100:
        raise ScaleRLError("precision.mode=aggressive runs fp8 matmuls through torchao on an H100-class CUDA GPU (compute capability "
                           f">= 8.9), not on {device.type}; use precision.mode=standard or compressed, or precision.fp8=simulated "
                           "to run its numerics here (slower than bf16: it quantises and dequantises every matmul)")
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise ScaleRLError("precision.fp8=torchao needs `pip install 'scalerl[fp8]'` (torchao)") from None
    return "torchao"


def autocast_context(policy: PrecisionPolicy, device: torch.device):
    """The compute precision's autocast context (a null context when matmuls run in the weights' dtype)."""
    if policy.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, policy.autocast_dtype))


def check_precision(policy: PrecisionPolicy, device: torch.device) -> None:
    """A clear error, before anything loads, when the mode cannot run here."""
    fp8_backend(policy, device)
    if policy.moments == "8bit" or policy.error_feedback:
        from scalerl.precision.adamw import _bnb_functional

        _bnb_functional()


def weights_dtype(policy: PrecisionPolicy) -> torch.dtype:
    return getattr(torch, policy.weights_dtype)


def residual_in_compute_dtype(_module: torch.nn.Module, _inputs: Any, out: torch.Tensor) -> torch.Tensor:
    """Forward hook on the input embedding and the norms: under autocast, their output in the compute dtype,
    so that the residual stream, the norms' outputs and what every matmul saves for backward are bf16 (one
    copy of each linear layer's input instead of an fp32 tensor plus one autocast cast per consumer). A norm
    still computes in float32 inside (HF's RMSNorm upcasts); only its output is cast."""
    device = out.device.type
    if torch.is_autocast_enabled(device) and out.is_floating_point():
        return out.to(torch.get_autocast_dtype(device))
    return out


def is_norm(module: torch.nn.Module) -> bool:
    """A normalisation layer: torch's LayerNorm/RMSNorm or a model's own *RMSNorm/*LayerNorm class."""
    name = type(module).__name__
    return isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)) or name.endswith(("RMSNorm", "LayerNorm"))


def prepare_policy(model: torch.nn.Module, policy: PrecisionPolicy, device: torch.device) -> list[str]:
    """Standard's residual stream in the compute dtype (unless `fp32_residual`); swap the linear layers for fp8
    ones (aggressive), the LM head excepted; returns their names."""
    if policy.autocast_dtype is not None and policy.weights_dtype == "float32" and not policy.fp32_residual:
        for module in (model.get_input_embeddings(), *(m for m in model.modules() if is_norm(m))):
            module.register_forward_hook(residual_in_compute_dtype)
    match fp8_backend(policy, device):
        case "simulated":
            from scalerl.precision.fp8_simulated import convert_to_simulated_fp8

            return convert_to_simulated_fp8(model)
        case "torchao":
            from torchao.float8 import convert_to_float8_training

            before = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
            convert_to_float8_training(model, module_filter_fn=lambda m, fqn: not fqn.endswith("lm_head")
                                       and m.in_features % 16 == 0 and m.out_features % 16 == 0)
            return sorted(n for n, m in model.named_modules() if n in before and type(m) is not torch.nn.Linear)
    return []


def build_reference(model: torch.nn.Module, policy: PrecisionPolicy) -> torch.nn.Module:
    """A frozen copy of the initial policy: in the compute dtype when the policy's weights are fp32 masters
    (standard: its matmuls run in bf16 under autocast anyway, and nothing updates it, so fp32 would only
    double its bytes), its linear layers in int8 with `reference_8bit`."""
    reference = copy.deepcopy(model).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    if policy.autocast_dtype is not None and policy.weights_dtype == "float32":
        reference.to(getattr(torch, policy.autocast_dtype))
    if policy.reference_8bit:
        from scalerl.precision.int8_reference import quantize_linears

        quantize_linears(reference)
    return reference


def build_adamw(param_groups: list[dict[str, Any]], policy: PrecisionPolicy, *, lr: float, betas: tuple[float, float],
                eps: float, weight_decay: float, device: torch.device, offload: bool = False) -> torch.optim.Optimizer:
    if offload:  # float32 AdamW on the host (the config allows it only where the moments are float32)
        from scalerl.precision.offload import HostOffloadAdamW

        return HostOffloadAdamW(param_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if policy.fused_adamw:
        return torch.optim.AdamW(param_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                 fused=device.type in {"cpu", "cuda"})
    from scalerl.precision.adamw import CompactAdamW

    return CompactAdamW(param_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, moments=policy.moments,
                        error_feedback=policy.error_feedback)


def tensor_bytes(tensors) -> int:
    """Bytes this process holds: of a sharded tensor (FSDP2's DTensor) its local shard."""
    return sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size() for t in tensors)


def component_bytes(reference: torch.nn.Module | None, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes held now by each part of the learner's state: trainable weights, their gradients (the size
    they take once allocated), optimizer moments, error-feedback buffers, the frozen reference."""
    from scalerl.precision.adamw import CompactAdamW

    trainable = [p for group in optimizer.param_groups for p in group["params"]]
    out = {"weights": tensor_bytes(trainable), "gradients": tensor_bytes(trainable), "optimizer": 0, "error_feedback": 0,
           "reference": 0 if reference is None else tensor_bytes({t.data_ptr(): t for t in reference.state_dict().values()}.values())}
    if isinstance(optimizer, CompactAdamW):
        out.update(optimizer.state_bytes())
    else:
        out["optimizer"] = tensor_bytes(t for s in optimizer.state.values() for k, t in s.items()
                                        if isinstance(t, torch.Tensor) and k != "step")
    return out


def expected_bytes(optimizer: torch.optim.Optimizer, policy: PrecisionPolicy) -> dict[str, int]:
    """What `component_bytes` will hold once every state is allocated (after the first update), from the
    trainable tensors' shapes through the memory estimator's own arithmetic (scalerl/predict/memory.py)."""
    from scalerl.precision.bytes import PRECISIONS, state_bytes

    shapes = [tuple(p.shape) for group in optimizer.param_groups for p in group["params"]]
    return state_bytes(shapes, PRECISIONS[policy.mode])


def describe(policy: PrecisionPolicy, model: torch.nn.Module, parts: dict[str, int], *, offload: bool = False) -> str:
    """The start-up line: the mode, what computes in what, and the bytes of each component (`offload`: the
    moments are in host memory)."""
    fp8_layers = sum("Float8" in type(m).__name__ for m in model.modules())
    compute = {"fp32": "fp32", "standard": "bf16 autocast", "aggressive": f"fp8 {policy.fp8} ({fp8_layers} linear layers), bf16",
               "compressed": "bf16"}[policy.mode]
    mib = {k: f"{v / 2**20:.2f} MiB" for k, v in parts.items()}
    text = (f"precision {policy.mode}: compute {compute}, LM head {'fp32' if policy.fp32_lm_head else 'in the compute dtype'}; "
            f"weights {mib['weights']} {policy.weights_dtype}, gradients {mib['gradients']}, AdamW moments {mib['optimizer']} "
            f"{policy.moments}{' in host memory (optim.offload)' if offload else ''}")
    frozen = tensor_bytes({p.data_ptr(): p for p in model.parameters() if not p.requires_grad}.values())
    if frozen:  # LoRA: the base weights, which the adapters train around (and the reference runs without them)
        text += f"; frozen base weights {frozen / 2**20:.2f} MiB (LoRA: the weights, gradients and moments above are the adapters')"
    if parts["error_feedback"]:
        text += f", error feedback {mib['error_feedback']} 8-bit"
    if parts["reference"]:
        text += f", reference {mib['reference']}" + (" int8" if policy.reference_8bit else "")
    return text
