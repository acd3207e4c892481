"""Held-out pass rate: of greedy completions, or the mean over k sampled ones per task (mean@k, the
metric the ScaleRL paper fits its curves to); whole episodes for a multi-turn environment."""

from __future__ import annotations

import math
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


SHOWN_SAMPLES = 3  # completions kept per evaluation for a reader (console, TensorBoard, samples/eval_step_N.jsonl)


def shown_text(text: str, tokenizer) -> str:
    """A completion as a reader should see it: without the tokenizer's special tokens (<s>, <unk>, <pad>, ...)."""
    for token in sorted(getattr(tokenizer, "all_special_tokens", None) or [], key=len, reverse=True):
        text = text.replace(token, "")
    return text.strip()


def pass_rate(env: Environment, tasks: Sequence[Task], sampler: Sampler, tokenizer, params: SamplingParams,
              seeds: Sequence[int] | None = None, *, batch_size: int, ctx: DistContext, max_turns: int = 1,
              scorer: RewardScorer | None = None, encode=None, samples: list | None = None) -> float:
    """Mean correctness of `params.n` completions per task, sampled with `params` (temperature 0:
    greedy, `seeds` None) and `seeds`, one per task of the whole list. Each rank scores its share of
    the tasks with those tasks' own seeds and the sums are added, so the result is the mean over
    every task's completions, and the same number whatever the world size or `batch_size`. `samples`: a list
that receives the first SHOWN_SAMPLES completions of this rank (prompt, completion, score) for a reader."""
    if seeds is not None and len(seeds) != len(tasks):
        raise ValueError(f"pass_rate: `seeds` has {len(seeds)} seeds for {len(tasks)} tasks; give one per task")
    mine = list(tasks[ctx.rank:: ctx.world_size])
    my_seeds = None if seeds is None else list(seeds[ctx.rank:: ctx.world_size])
    sums = task_scores(env, mine, sampler, tokenizer, params, my_seeds, batch_size=batch_size, max_turns=max_turns, scorer=scorer,
                       encode=encode, samples=samples)
    counts = ctx.sum(torch.tensor([float(sums.sum()), float(len(mine) * params.n)], dtype=torch.float64))
    return float(counts[0] / counts[1].clamp(min=1))


def task_scores(env: Environment, tasks: Sequence[Task], sampler: Sampler, tokenizer, params: SamplingParams,
                seeds: Sequence[int] | None, *, batch_size: int, max_turns: int = 1, scorer: RewardScorer | None = None,
                encode=None, samples: list | None = None) -> torch.Tensor:
    """(len(tasks),) float64: each task's summed correctness over its `params.n` completions (`encode`: the
    prompt format, see `sample_episodes`)."""
    sums = []
    for i in range(0, len(tasks), batch_size):
        chunk = list(tasks[i: i + batch_size])
        chunk_seeds = None if seeds is None else list(seeds[i: i + batch_size])
        rollout, completions = sample_episodes(sampler, env, chunk, tokenizer, params, chunk_seeds, max_turns=max_turns, encode=encode)
        # correctness only: an environment's reward shaping (envs/shaping.py) must not inflate a pass rate
        groups = rollout.group_ids.tolist()
        scores = torch.tensor([unshaped_score(env, chunk[g], c) for g, c in zip(groups, completions)], dtype=torch.float32)
        if not (finite := torch.isfinite(scores)).all():  # NaN, inf or not a number: not a pass; training counts and names them
            scores = torch.where(finite, scores, torch.zeros_like(scores))
        if scorer is not None:  # an environment without a verifier: the fused reward, with the configured weights
            scores = scorer.evaluate(RewardInputs.of(chunk, groups, completions, scores))
        if samples is not None:
            samples += [{"prompt": str(chunk[g].prompt), "completion": shown_text(c.text, tokenizer), "score": float(s)}
                        for g, c, s in zip(groups, completions, scores.tolist())][: SHOWN_SAMPLES - len(samples)]
        per_task = torch.zeros(len(chunk), dtype=torch.float64).index_add_(0, torch.tensor(groups), scores.double())
        sums.append(per_task)
    return torch.cat(sums) if sums else torch.zeros(0, dtype=torch.float64)


def confidence_interval(task_means: torch.Tensor, binary: bool, z: float = 1.96) -> tuple[float, float]:
    """95 % interval of the mean of per-task scores in [0, 1]: Wilson's score interval when every score
    is one 0/1 verdict, else the normal approximation over the tasks (the independent units; a task's k
    samples are not independent of each other), clipped to [0, 1]."""
    n = len(task_means)
    if n == 0:
        return 0.0, 1.0
    mean = float(task_means.mean())
    if binary:
        centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(mean * (1 - mean) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return max(0.0, centre - half), min(1.0, centre + half)
    half = z * (float(task_means.std(unbiased=True)) if n > 1 else 0.5) / math.sqrt(n)
    return max(0.0, mean - half), min(1.0, mean + half)
