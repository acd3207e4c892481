"""A reward that pays for longer answers, for the time-estimate benchmark (bench/time_estimate.py).

    longer(c) = min(len(c) / 48, 1)

A policy trained on it learns to put off its end-of-sequence token, so its completions grow over
the run: the case a per-step time model gets wrong and a per-token one must get right.
"""

from __future__ import annotations

TARGET = 48  # characters; the benchmark's rollout.max_new_tokens


def longer(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    return [min(len(c) / TARGET, 1.0) for c in completions]
