"""Held-out greedy pass rate."""

from __future__ import annotations

from typing import Sequence

import torch

from scalerl.distributed.context import DistContext
from scalerl.envs.base import Environment, Task
from scalerl.envs.scoring import score_rollout
from scalerl.rollout.base import Sampler, SamplingParams


def greedy_pass_rate(env: Environment, tasks: Sequence[Task], sampler: Sampler, tokenizer, *,
                     max_new_tokens: int, batch_size: int, ctx: DistContext) -> float:
    """Mean reward of greedy completions on `tasks`; each rank scores its share, counts are summed."""
    mine = list(tasks[ctx.rank:: ctx.world_size])
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, n=1)
    total = 0.0
    for i in range(0, len(mine), batch_size):
        chunk = mine[i: i + batch_size]
        rollout = sampler.sample([tokenizer(t.prompt)["input_ids"] for t in chunk], params, None)
        total += float(score_rollout(env, chunk, rollout, tokenizer).sum())
    counts = ctx.sum(torch.tensor([total, float(len(mine))], dtype=torch.float64))
    return float(counts[0] / counts[1].clamp(min=1))
