"""Reward functions for the component tests, importable as `reward_fns:<name>` (tests/rewards is on
sys.path under pytest; the CLI test adds it to PYTHONPATH). No torch import: workers start fast."""

from __future__ import annotations

import asyncio
import math
import os
import time


def length_score(prompts, completions, **kwargs):
    """len(completion) / 8."""
    return [len(c) / 8 for c in completions]


def sees_kwargs(prompts, completions, answers, tasks, finished, group_ids, **kwargs):
    """10·group id + 1 if finished, + 100 when the task's answer equals its prompt's answer field."""
    return [10 * g + float(f) + (100.0 if a == t.answer else 0.0) for g, f, a, t in zip(group_ids, finished, answers, tasks)]


def raises(prompts, completions, **kwargs):
    raise RuntimeError("boom from reward_fns.raises")


def hangs_when_asked(prompts, completions, **kwargs):
    """Blocks for a minute when the first prompt is 'hang', else scores 1."""
    if prompts[0] == "hang":
        time.sleep(60)
    return [1.0] * len(completions)


def bad_entries(prompts, completions, **kwargs):
    """Entry i: NaN, None, +inf, 'x' (not a number), then 0.5, cycling."""
    pattern = [math.nan, None, math.inf, "x", 0.5]
    return [pattern[i % 5] for i in range(len(completions))]


def wrong_length(prompts, completions, **kwargs):
    return [1.0] * (len(completions) + 1)


def not_a_list(prompts, completions, **kwargs):
    return 3.0


def exits(prompts, completions, **kwargs):
    """Kills its own process when the first prompt is 'die', else scores 2."""
    if prompts[0] == "die":
        os._exit(3)
    return [2.0] * len(completions)


async def async_length(prompts, completions, **kwargs):
    await asyncio.sleep(0.01)
    return [len(c) / 8 for c in completions]


async def async_hangs(prompts, completions, **kwargs):
    await asyncio.sleep(60)
    return [1.0] * len(completions)


def sleeps_half_a_second(prompts, completions, **kwargs):
    """Scores 1 after 0.5 s (two of these in parallel take 0.5 s, in series 1 s)."""
    time.sleep(0.5)
    return [1.0] * len(completions)
