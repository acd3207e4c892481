"""A reward that pays for longer answers, for the time-estimate benchmark (bench/time_estimate.py).

    longer(c) = min(len(c) / target, 1)    target: LENGTH_REWARD_TARGET characters (default 48)

A policy trained on it learns to put off its end-of-sequence token, so its completions grow over
the run: the case a per-step time model gets wrong and a per-token one must get right.
"""

from __future__ import annotations

import os


def longer(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    target = float(os.environ.get("LENGTH_REWARD_TARGET", "48"))
    return [min(len(c) / target, 1.0) for c in completions]


ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def alphabet_prefix(prompts: list[str], completions: list[str], **kwargs) -> list[float]:
    """The fraction of ALPHABET a completion spells from its start: each further letter has to be
    learned, so completions grow a few tokens at a time rather than all at once."""
    scores = []
    for c in completions:
        n = 0
        while n < min(len(c), len(ALPHABET)) and c[n] == ALPHABET[n]:
            n += 1
        scores.append(n / len(ALPHABET))
    return scores
