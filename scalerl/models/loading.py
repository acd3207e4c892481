"""Loading the policy (and its tokenizer) from the built-in folder, a local folder or the hub."""

from __future__ import annotations

import os

import torch

from scalerl.config import ModelConfig
from scalerl.errors import ScaleRLError
from scalerl.models.paths import adapter_base, has_tokenizer_files, resolve_model_path


def attention_choice(requested: str, device: torch.device) -> tuple[str, str | None]:
    """(the implementation to load, why it is not the requested one or None): flash_attention_2 where it
    can run, else sdpa. A run says and records the fallback (`scalerl.trainer.setup.what_ran`, `prepare_run_dir`)."""
    if requested != "flash_attention_2":
        return requested, None
    if device.type != "cuda":
        return "sdpa", f"flash_attention_2 needs a CUDA GPU; using sdpa on {device.type}"
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return "sdpa", "flash_attention_2 needs `pip install flash-attn`; using sdpa"
    return requested, None


def attention_used(model: torch.nn.Module, requested: str) -> str:
    """The attention implementation the loaded model runs (transformers keeps it in its config)."""
    return getattr(model.config, "_attn_implementation", None) or requested


def hub_kernels_kwargs(enabled: bool) -> dict[str, bool]:
    """`from_pretrained`'s `use_kernels`, from model.hub_kernels. Where the `kernels` package is installed (a dependency
    of transformers from 5.2x on), transformers kernelizes every model it loads unless told not to: layers run through
    kernels' wrappers, take a kernel downloaded from the Hugging Face Hub where one fits the device, and every
    train()/eval() switch kernelizes again (1.12 against 0.31 ms a switch pair on the built-in model, 2-core EPYC, 2026-12-07).
    Off unless asked: the model's own torch code and no download at load, as everywhere else in a run."""
    try:
        from transformers.utils import is_kernels_available
    except ImportError:  # a transformers without the integration: its models are never kernelized
        is_kernels_available = None
    if is_kernels_available is None or not is_kernels_available():
        if enabled:
            raise ScaleRLError("model.hub_kernels: needs the `kernels` package (`pip install kernels`) and a transformers "
                               "that uses it; or set model.hub_kernels=false")
        return {}
    return {"use_kernels": enabled}


def load_tokenizer(config: ModelConfig):
    """The tokenizer of model.tokenizer, else of model.path (a LoRA adapter folder's own, else its base model's)."""
    from transformers import AutoTokenizer

    field = "model.tokenizer" if config.tokenizer else "model.path"  # the setting that named the source
    base = None if config.tokenizer else adapter_base(config.path)
    if base is not None:
        source = config.path if has_tokenizer_files(config.path) else resolve_model_path(base, f"{config.path}'s base model")
    else:
        source = resolve_model_path(config.tokenizer or config.path, field)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=config.trust_remote_code)
    except Exception as err:  # OSError, ValueError, TypeError, ... from transformers: the source is at fault
        raise ScaleRLError(f"{field}: cannot load a tokenizer from {source} ({_first_line(err)}){_offline_hint()}") from err
    if len(tokenizer) == 0:  # transformers builds an empty tokenizer from a folder without vocabulary files
        raise ScaleRLError(f"{field}: the tokenizer from {source} has no vocabulary; point model.tokenizer at one that has")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # decoder-only models often ship without a pad token
    if tokenizer.eos_token_id is None:
        raise ScaleRLError(f"{field}: the tokenizer of {source} defines no eos_token; completions could never end")
    return tokenizer


def load_model(config: ModelConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """model.path's causal LM on `device`. A LoRA adapter folder (a LoRA run's checkpoint or its export) loads as its
    base model with the adapters merged in (W + (alpha / r) B A), for evaluation: training refuses such a folder
    (`resolve_model_path`)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" / "Writing model shards" bars in our console
    if (base := adapter_base(config.path)) is not None:
        return load_adapted(config, base, device, dtype)
    source = resolve_model_path(config.path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source,
            dtype=dtype,
            attn_implementation=attention_choice(config.attn_implementation, device)[0],
            trust_remote_code=config.trust_remote_code,
            **hub_kernels_kwargs(config.hub_kernels),
        )
    except ScaleRLError:
        raise
    except Exception as err:  # OSError, ValueError, safetensors' SafetensorError, ...: the folder or id is at fault
        raise ScaleRLError(f"model.path: cannot load a causal LM from {source} ({_first_line(err)}){_offline_hint()}") from err
    if config.gradient_checkpointing:
        # transformers 5.x renamed gradient_checkpointing_enable to activation_checkpointing_enable.
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.config.use_cache = False  # the rollout passes use_cache=True explicitly
    return model.to(device)


def load_adapted(config: ModelConfig, base: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The base model that the adapter folder model.path names, its adapters merged in."""
    from scalerl.models.lora import import_peft

    peft = import_peft(f"model.path: {config.path} is a LoRA adapter folder; loading it needs peft (`pip install "
                       "'scalerl[lora]'`), or export the run with --merge-lora")
    field = f"{config.path}'s base model (base_model_name_or_path in its adapter_config.json)"
    resolve_model_path(base, field)  # a moved or deleted base: one line naming the adapter folder's setting
    model = load_model(config.model_copy(update={"path": base, "gradient_checkpointing": False}), device, torch.float32)
    try:
        merged = peft.PeftModel.from_pretrained(model, config.path).merge_and_unload()
    except Exception as err:  # peft's errors on a folder that does not fit its base: missing keys, shapes
        raise ScaleRLError(f"model.path: the adapters in {config.path} do not load onto {base} ({_first_line(err)})") from err
    return merged.to(device=device, dtype=dtype)


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__


def _offline_hint() -> str:
    return "; the hub is off (HF_HUB_OFFLINE=1): use a local folder" if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
