"""LoRA adapters on the policy through `peft` (`model.lora`), and the reference they make free.

    W x  →  W x + (alpha / r) · B A x        W frozen; A (r × in), B (out × r) train; B starts at 0

With adapters on, the policy is a `peft.PeftModel` around the loaded model: only A and B (and PPO's
critic, a module of its own) have `requires_grad`, so the optimizer holds their moments only. The
frozen reference of the KL term is the same module with the adapters switched off
(`AdaptersOff`): B A = 0 there, so it is exactly the initial policy, without a second copy of the
weights. Checkpoints hold the trainable parameters only (scalerl/trainer/checkpoint.py), i.e. the
adapters; the base is reloaded from `model.path`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from torch import nn

from scalerl.config import LoraConfig
from scalerl.errors import ScaleRLError
from scalerl.types import Rollout


def import_peft(why: str = "model.lora.r > 0 needs the peft library: pip install 'scalerl[lora]' (or set model.lora.r=0)"):
    """peft, imported without a Hub download: importing peft imports bitsandbytes, whose CPU backend, on a CPU with
    AVX512-BF16, fetches a kernel from the Hugging Face Hub through `kernels.get_kernel` (and prints a warning where it
    cannot). Nothing is downloaded at run time here (model.hub_kernels); bitsandbytes then uses its own CPU code.
    `why`: the error when peft is not installed."""
    with no_hub_kernels():
        try:
            import peft
        except ImportError:
            raise ScaleRLError(why) from None
    return peft


@contextlib.contextmanager
def no_hub_kernels():
    """`kernels.get_kernel` refuses (and bitsandbytes' CPU backend's warning about it is not printed) inside."""
    try:
        import kernels
    except ImportError:  # no kernels package: nothing to fetch with
        yield
        return

    def refuse(*_args, **_kwargs):
        raise RuntimeError("ScaleRL loads no kernel from the Hub at run time (model.hub_kernels)")

    quiet = logging.getLogger("bitsandbytes.backends.cpu.ops")
    fetch, level = getattr(kernels, "get_kernel", None), quiet.level
    kernels.get_kernel, quiet.level = refuse, logging.ERROR
    try:
        yield
    finally:
        kernels.get_kernel, quiet.level = fetch, level


def apply_lora(model: nn.Module, lora: LoraConfig, gradient_checkpointing: bool = False) -> nn.Module:
    """The model with LoRA adapters on `lora.target_modules`; its base weights frozen."""
    peft = import_peft()
    settings = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
                               target_modules=lora.target_modules, task_type="CAUSAL_LM")
    try:
        wrapped = peft.get_peft_model(model, settings)
    except ValueError as err:  # peft: "Target modules {...} not found in the base model"
        raise ScaleRLError(f"model.lora.target_modules: {str(err).splitlines()[0][:200]}") from None
    if gradient_checkpointing:
        wrapped.enable_input_require_grads()  # checkpointed blocks need an input that requires grad when the embeddings are frozen
    return wrapped


class AdaptersOff(nn.Module):
    """The reference policy of a LoRA run: `forward` runs the wrapped `CompletionModel` with the adapters
    disabled, under no gradient. It registers no parameters of its own (it holds the policy by reference),
    so nothing counts or checkpoints its weights twice."""

    def __init__(self, completion_model: nn.Module, peft_model: nn.Module):
        super().__init__()
        self._run = [completion_model, peft_model]  # a list: not registered as submodules

    def forward(self, batch: Rollout, **options: Any):
        completion_model, peft_model = self._run
        with peft_model.disable_adapter(), torch.no_grad():
            return completion_model(batch, **options)


def trainable_fraction(model: nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters) of the policy."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
