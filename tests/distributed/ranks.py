"""What the multi-process tests share: a free port, one fixed global batch, and its rows by group."""

from __future__ import annotations

import socket

import torch

from scalerl.models.paths import builtin_model_dir
from scalerl.types import Rollout, ScoredBatch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def global_batch(path):
    """One fixed batch of 16 completions from the built-in model, with distinct rewards, saved to `path`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalerl.rollout.hf import HFSampler
    from scalerl.types import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    sampler = HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    prompts = [tokenizer(p)["input_ids"] for p in ("12+34=", "7+5=", "99+1=", "3+40=")]
    rollout = sampler.sample(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, n=4), seeds=[11, 12, 13, 14])
    rewards = torch.rand(16, generator=torch.Generator().manual_seed(3))
    torch.save({"rollout": vars(rollout), "rewards": rewards}, path)


def scored(path, groups: list[int]):
    """The saved batch's rows of these groups, in this order, as the rollout side would hand them over."""
    saved = torch.load(path, weights_only=True)
    rows = torch.cat([torch.arange(4 * g, 4 * g + 4) for g in groups])
    rollout = Rollout(**saved["rollout"]).select(rows)
    rollout.group_ids = torch.arange(len(groups)).repeat_interleave(4)
    rewards = saved["rewards"][rows]
    return ScoredBatch(rollout, rewards, rewards, policy_version=0, prompts=[""] * len(rows), completions=[""] * len(rows),
                       generated_tokens=int(rollout.completion_mask.sum()))
