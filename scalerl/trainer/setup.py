"""Straight-line builders that turn the config into the objects the loop uses."""

from __future__ import annotations

import copy
import logging
import os
import random
from datetime import datetime
from pathlib import Path

import torch

from scalerl.config import Config, dump_config
from scalerl.distributed.context import DistContext
from scalerl.errors import ScaleRLError

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def check_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for `train.precision` (None: plain fp32), or a clear error."""
    match precision:
        case "fp32":
            return None
        case "bf16":
            return torch.bfloat16
        case "fp8":
            if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
                raise ScaleRLError("train.precision=fp8 needs an H100-class CUDA GPU (compute capability >= 8.9); use bf16 or fp32 here")
            raise ScaleRLError("train.precision=fp8 is not available yet (planned with the memory-modes work); use bf16")
    raise ScaleRLError(f"train.precision: unknown mode {precision!r}")


def check_offload(config: Config, device: torch.device) -> None:
    if config.optim.offload and device.type == "cpu":
        log.warning("optim.offload=true has nothing to do on CPU: optimizer states already live in host memory")
    elif config.optim.offload:
        raise ScaleRLError("optim.offload=true on GPU is not available yet (planned with the memory-modes work); set it to false")


def prepare_run_dir(config: Config, ctx: DistContext, resume: bool) -> Path:
    """runs/<name>/ with the resolved config; on resume the folder must exist already."""
    if resume and config.log.name is None:
        raise ScaleRLError("--resume needs the run's name: add --name NAME (or set log.name)")
    name = config.log.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = config.log.run_dir / name
    if resume and not (run_dir / "config.yaml").is_file():
        raise ScaleRLError(f"--resume: {run_dir} holds no run to resume; pass the same log.name as the run you resume")
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(dump_config(config))
    ctx.barrier()
    return run_dir


def build_reference(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the initial policy (only built when the KL term or KL tracking needs it)."""
    reference = copy.deepcopy(policy).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference


def set_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def build_sampler(config: Config, policy: torch.nn.Module, tokenizer, device: torch.device):
    """The rollout engine named by `rollout.engine`."""
    match config.rollout.engine:
        case "hf":
            from scalerl.rollout.hf import HFSampler

            return HFSampler(policy, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=device)
        case "vllm":
            if device.type != "cuda":
                raise ScaleRLError("rollout.engine=vllm needs a CUDA GPU; use rollout.engine=hf on this machine")
            try:
                import vllm  # noqa: F401
            except ImportError:
                raise ScaleRLError("rollout.engine=vllm needs `pip install 'scalerl[vllm]'`; or use rollout.engine=hf") from None
            raise ScaleRLError("rollout.engine=vllm is not available yet in this version; use rollout.engine=hf")
    raise ScaleRLError(f"rollout.engine: unknown engine {config.rollout.engine!r}")


def build_critic(config: Config, policy: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """PPO's critic: a separate value model from the same checkpoint, or a value head on the policy."""
    from scalerl.models.value import ValueHead, ValueModel

    if config.algorithm.critic == "head":
        return ValueHead(policy.config.hidden_size).to(device)
    return ValueModel.from_pretrained(config.model.path, trust_remote_code=config.model.trust_remote_code).to(device).train()


def build_scorer(config: Config, device: torch.device):
    """The `RewardScorer` of `reward.components` (or of `reward.model` alone); None: the environment's reward."""
    from scalerl.rewards.scorer import build_reward_scorer

    return build_reward_scorer(config.reward, group_size=config.rollout.group_size, device=device)
