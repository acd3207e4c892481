"""One replay item: one prompt's whole group of completions, as the sampler produced them.

A group is what GRPO-style advantages are computed over, so the buffer stores and samples whole
groups. Groups are ragged: the prompt length P, the group size G and the completion length T may
differ from one group to the next; nothing is padded across groups.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass
class ReplayGroup:
    """One prompt and its G completions (CPU tensors; the buffer never modifies them)."""

    prompt_ids: torch.Tensor  # (P,) long: the prompt's real tokens, no padding
    completion_ids: torch.Tensor  # (G, T) long
    completion_mask: torch.Tensor  # (G, T) long: 1 on real completion tokens
    sampler_logprobs: torch.Tensor  # (G, T) float32: log π_sampler of each completion token
    truncated: torch.Tensor  # (G,) bool: the completion hit the length limit
    rewards: torch.Tensor  # (G,) float32: the reward the advantages use
    task_rewards: torch.Tensor  # (G,) float32: the task's own reward (before shaping)
    policy_version: int  # the version of the weights that sampled the group
    prompt: str


# field → (dtype, the names of its dimensions: P prompt tokens, G completions, T completion tokens)
LAYOUT = {
    "prompt_ids": (torch.long, "P"),
    "completion_ids": (torch.long, "GT"),
    "completion_mask": (torch.long, "GT"),
    "sampler_logprobs": (torch.float32, "GT"),
    "truncated": (torch.bool, "G"),
    "rewards": (torch.float32, "G"),
    "task_rewards": (torch.float32, "G"),
}
TENSOR_FIELDS = tuple(LAYOUT)


def check_group(group: ReplayGroup) -> None:
    """Raise ValueError naming the field when a tensor has the wrong dtype or shape (TypeError when
    `policy_version` or `prompt` has the wrong type)."""
    sizes: dict[str, int] = {}
    for name, (dtype, dims) in LAYOUT.items():
        tensor = getattr(group, name)
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != dtype or tensor.dim() != len(dims):
            got = f"{tensor.dtype} of shape {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(f"ReplayGroup.{name} must be a {len(dims)}-d {dtype} tensor ({dims}), got {got}")
        for dim, size in zip(dims, tensor.shape):
            if sizes.setdefault(dim, size) != size:
                raise ValueError(f"ReplayGroup.{name} has {dim}={size}, other fields have {dim}={sizes[dim]}")
    if not isinstance(group.policy_version, int) or not isinstance(group.prompt, str):
        raise TypeError("ReplayGroup.policy_version must be an int and ReplayGroup.prompt a str")


def owned_copy(group: ReplayGroup) -> ReplayGroup:
    """The group with every tensor detached, on the CPU, contiguous and in its own memory, so later
    in-place changes to the caller's tensors (or a view into a larger batch) do not reach the buffer."""
    copies = {name: getattr(group, name).detach().to("cpu", copy=True).contiguous() for name in TENSOR_FIELDS}
    return dataclasses.replace(group, **copies)
