"""Turning a rollout's token rows into `Completion`s and rewards."""

from __future__ import annotations

from typing import Sequence

import torch

from scalerl.envs.base import Environment
from scalerl.types import Completion, Rollout, Task


def completions_of(rollout: Rollout, tokenizer) -> list[Completion]:
    """Decode each completion up to (not including) its EOS; special tokens inside are kept, so a
    verifier sees exactly what the policy emitted. A multi-turn rollout's completion spans every
    turn and observation (its length is that of `completion_extent`, not of the trained tokens)."""
    lengths = rollout.completion_extent().sum(1).tolist()
    rows = rollout.completion_ids.tolist()
    truncated = rollout.truncated.tolist()
    ids = [tuple(row[: n - (0 if cut else 1)]) for row, n, cut in zip(rows, lengths, truncated)]
    texts = tokenizer.batch_decode([list(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return [Completion(text=t, token_ids=i, finished=not cut) for t, i, cut in zip(texts, ids, truncated)]


def env_rewards(env: Environment, tasks: Sequence[Task], group_ids: list[int], completions: list[Completion]) -> torch.Tensor:
    """(B,) float32: the environment's score of completion i for `tasks[group_ids[i]]`."""
    return torch.tensor([float(env.score(tasks[g], c)) for g, c in zip(group_ids, completions)], dtype=torch.float32)


def score_rollout(env: Environment, tasks: Sequence[Task], rollout: Rollout, tokenizer) -> torch.Tensor:
    """(B,) float32 rewards; row i answers `tasks[rollout.group_ids[i]]`."""
    return env_rewards(env, tasks, rollout.group_ids.tolist(), completions_of(rollout, tokenizer))
