"""Reward shaping for sparse rewards: partial credit that never outranks a correct answer.

An environment that shapes its reward keeps two judgements apart:

* `correct(task, completion) -> float`: the exact-answer score in {0, 1}; held-out pass rates use
  this one only (`scalerl/rollout/evaluation.py`), so shaping never inflates a pass rate;
* `partial_credit(task, completion) -> float` in [0, 1]: what an incorrect completion got right
  (for example a well-formed answer), or a user function named by `shaping.function`.

Its training reward, `score`, is the pure function `shaped_reward` below:

    reward = max(correct, weight · clip(partial, 0, 1)),   0 ≤ weight < 1

so a correct completion always earns exactly 1, an incorrect one at most `weight`, and with
`weight = 0` (the default) the reward is the correctness itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scalerl.plugins import import_function
from scalerl.types import as_score

PartialCredit = Callable[[Any, Any], float]


class ShapingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weight: float = Field(0.0, ge=0.0, lt=1.0, description="Reward = max(correct, weight * partial credit); 0 turns shaping off.")
    function: str | None = Field(
        None, description="'module:function' taking (task, completion) and returning partial credit in [0, 1]; "
                          "replaces the environment's own partial_credit.")

    @field_validator("function")
    @classmethod
    def _check_function(cls, value: str | None) -> str | None:
        if value is not None and (value.count(":") != 1 or not all(value.split(":"))):
            raise ValueError(f"'{value}' is not 'module:function'")
        return value


def shaped_reward(correct: float, partial: float, weight: float) -> float:
    """max(correct, weight · clip(partial, 0, 1)): correctness, or a capped share of partial credit."""
    return max(correct, weight * min(max(partial, 0.0), 1.0))


def import_partial_credit(spec: str) -> PartialCredit:
    """The function named by `module:function`, checked to be callable."""
    return import_function(spec, "env.args.shaping.function")

def unshaped_score(env: Any, task: Any, completion: Any) -> float:
    """The score a pass rate averages: `env.correct(task, completion)` for an environment that shapes
    its training reward (it defines `correct`), else `env.score(task, completion)`."""
    correct = getattr(env, "correct", None)  # optional method of the Environment protocol (base.py)
    return as_score(correct(task, completion) if correct is not None else env.score(task, completion))
