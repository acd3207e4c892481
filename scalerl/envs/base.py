"""The environment interface: where prompts come from and how a completion is scored.

A task is one prompt with whatever its verifier needs (`answer`, `meta`). An environment hands out
a training pool and a held-out set, and scores a completion. Single-turn tasks need nothing else;
multi-turn environments will add a `step(task, transcript) -> observation | None` method that the
rollout calls between turns (up to `max_turns`), with only the policy's own tokens trained on.

A new task is one small class with a pydantic `Config` (its keyword arguments, validated when the
run's config is built) and these three methods; register it by name in `registry.py` or pass it
as `module:Class`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Sequence

from pydantic import BaseModel


@dataclass(frozen=True)
class Task:
    """One prompt and what its verifier needs."""

    prompt: str
    answer: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Completion:
    """What the policy produced for a task, as the environment sees it.

    `text` is the decoded completion up to (not including) the end-of-sequence token; `finished` is
    False when generation stopped at `max_new_tokens` instead.
    """

    text: str
    token_ids: tuple[int, ...]
    finished: bool


class Environment(Protocol):
    Config: ClassVar[type[BaseModel]]

    def train_tasks(self) -> Sequence[Task]:
        """The training pool, in a fixed order (the trainer shuffles it when asked)."""
        ...

    def eval_tasks(self) -> Sequence[Task]:
        """The held-out tasks, disjoint from the training pool."""
        ...

    def score(self, task: Task, completion: Completion) -> float:
        """The reward of one completion (a pass rate is the mean score under greedy decoding)."""
        ...
