"""What a rollout engine returns, and the interface every engine implements.

The Hugging Face engine (`hf.py`) runs on CPU or GPU with the training model itself; a vLLM
engine will implement the same `Sampler` protocol, receiving weights through `sync_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class Rollout:
    """A batch of sampled completions; row i answers prompt `group_ids[i]` of the step.

    Prompts are left-padded and completions right-padded, so `cat(prompt_ids, completion_ids)` is
    the full sequence with all prompts ending in the same column.

    In a multi-turn episode (`multiturn.py`) the completion holds the policy's turns and the
    environment's observations in order: `completion_mask` is 1 only on the policy's own tokens
    (what is trained on, possibly with gaps), `completion_attention_mask` 1 on every real token,
    observations included (what the forward pass attends to). Single-turn rollouts leave the
    latter empty: it is then `completion_mask` itself.
    """

    prompt_ids: torch.Tensor  # (B, P) long, left-padded
    prompt_mask: torch.Tensor  # (B, P) long, 1 on real prompt tokens
    completion_ids: torch.Tensor  # (B, T) long, pad after the end
    completion_mask: torch.Tensor  # (B, T) long, 1 on generated tokens up to and including EOS (every policy turn's)
    sampler_logprobs: torch.Tensor  # (B, T) float32, log-prob of each token under the sampling distribution
    truncated: torch.Tensor  # (B,) bool, stopped at max_new_tokens without EOS
    group_ids: torch.Tensor  # (B,) long, which prompt of the step each row belongs to
    rewards: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # (B,) float32, filled by scoring
    completion_attention_mask: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # (B, T) long, or empty

    def completion_extent(self) -> torch.Tensor:
        """(B, T) long: 1 on every real completion-side token (policy and observations), 0 on padding."""
        return self.completion_attention_mask if self.completion_attention_mask.numel() else self.completion_mask

    def attention_mask(self) -> torch.Tensor:
        """(B, P+T) long: the attention mask of `cat(prompt_ids, completion_ids)`."""
        return torch.cat([self.prompt_mask, self.completion_extent()], dim=1)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, rows: slice | torch.Tensor) -> "Rollout":
        """A sub-batch (a mini- or micro-batch) sharing storage with this one."""
        return Rollout(**{name: (value[rows] if value.numel() else value) for name, value in vars(self).items()})


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1  # completions per prompt


class Sampler(Protocol):
    def sample(self, prompt_ids: list[list[int]], params: SamplingParams, generator: torch.Generator | None) -> Rollout:
        """Sample `params.n` completions for every prompt (rows grouped per prompt, in order)."""
        ...

    def sync_weights(self) -> None:
        """Make the engine sample from the trainer's current weights (a no-op when they are shared)."""
        ...
