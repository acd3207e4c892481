"""Held-out pass rate: of greedy completions, or the mean over k sampled ones per task (mean@k, the
metric the ScaleRL paper fits its curves to); whole episodes for a multi-turn environment."""

from __future__ import annotations

from typing import Sequence

import torch

from scalerl.distributed.context import DistContext
from scalerl.envs.base import Environment
from scalerl.types import SamplingParams, Task
from scalerl.envs.shaping import unshaped_score
from scalerl.rewards.components import RewardInputs
from scalerl.rewards.scorer import RewardScorer
from scalerl.rollout.base import Sampler
from scalerl.rollout.multiturn import sample_episodes


def pass_rate(env: Environment, tasks: Sequence[Task], sampler: Sampler, tokenizer, params: SamplingParams,
              seeds: Sequence[int] | None = None, *, batch_size: int, ctx: DistContext, max_turns: int = 1,
              scorer: RewardScorer | None = None) -> float:
    """Mean correctness of `params.n` completions per task, sampled with `params` (temperature 0:
    greedy, `seeds` None) and `seeds`, one per task of the whole list. Each rank scores its share of
    the tasks with those tasks' own seeds and the sums are added, so the result is the mean over
    every task's completions, and the same number whatever the world size or `batch_size`."""
    if seeds is not None and len(seeds) != len(tasks):
        raise ValueError(f"pass_rate: `seeds` has {len(seeds)} seeds for {len(tasks)} tasks; give one per task")
    mine = list(tasks[ctx.rank:: ctx.world_size])
    my_seeds = None if seeds is None else list(seeds[ctx.rank:: ctx.world_size])
    total = 0.0
    for i in range(0, len(mine), batch_size):
        chunk = mine[i: i + batch_size]
        chunk_seeds = None if my_seeds is None else my_seeds[i: i + batch_size]
        rollout, completions = sample_episodes(sampler, env, chunk, tokenizer, params, chunk_seeds, max_turns=max_turns)
        # correctness only: an environment's reward shaping (envs/shaping.py) must not inflate a pass rate
        scores = torch.tensor([unshaped_score(env, chunk[g], c) for g, c in zip(rollout.group_ids.tolist(), completions)],
                              dtype=torch.float32)
        if scorer is not None:  # an environment without a verifier: the fused reward, with the configured weights
            scores = scorer.evaluate(RewardInputs.of(chunk, rollout.group_ids.tolist(), completions, scores))
        total += float(scores.sum())
    counts = ctx.sum(torch.tensor([total, float(len(mine) * params.n)], dtype=torch.float64))
    return float(counts[0] / counts[1].clamp(min=1))
