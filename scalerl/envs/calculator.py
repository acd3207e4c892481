"""Built-in `calculator` environment: a multi-turn task where the policy may call a calculator.

The task is a product too large to do in one go, `a*b=` with two-digit operands by default. A
policy turn of the form `c:EXPR` (EXPR: integers joined by + - *, optionally ending in `=`) is a
tool call; the environment answers with the observation `=VALUE A:` (`=? A:` when EXPR does not
parse), and the policy's next turn is its answer. A turn that is not a tool call is the final
answer and ends the episode. A full episode with a tool call reads, EOS shown as `|`:

    prompt `12*34=`   turn₁ `c:12*34|`   observation `=408 A:`   turn₂ `408|`

Everything stays in the built-in character vocabulary, and with `rollout.max_new_tokens` 8 and
`rollout.max_turns` 2 the whole sequence is at most 1 + 6 + 8 + 8 + 8 = 31 of the built-in model's
64 positions. The triples are enumerated and split as in `arithmetic`: one shuffle with
`random.Random(split_seed)`, the first `eval_size` held out.

Reward (binary): 1.0 iff the policy's final turn is exactly the answer, ended by EOS.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scalerl.envs.arithmetic import arithmetic_tasks
from scalerl.envs.base import renamed_args
from scalerl.types import Completion, Task

TOOL_CALL = re.compile(r"c:(\d{1,6}(?:[+*-]\d{1,6})*)=?")


class CalculatorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _older_spellings(cls, data: Any) -> Any:
        return renamed_args(data, "calculator", {"num_eval": "eval_size"})

    min_operand: int = Field(10, ge=0, description="Smallest operand.")
    max_operand: int = Field(99, ge=0, description="Largest operand.")
    operators: list[Literal["+", "-", "*"]] = Field(["*"], min_length=1, description="Operators to draw the tasks from.")
    eval_size: int = Field(200, ge=1, description="Held-out prompts for the greedy pass rate (older name: num_eval).")
    split_seed: int = Field(0, description="Seed of the one shuffle that splits held-out from training prompts.")

    @model_validator(mode="after")
    def _check_range(self) -> "CalculatorConfig":
        if self.max_operand < self.min_operand:
            raise ValueError(f"max_operand ({self.max_operand}) must be >= min_operand ({self.min_operand})")
        n = (self.max_operand - self.min_operand + 1) ** 2 * len(self.operators)
        if self.eval_size >= n:
            raise ValueError(f"eval_size ({self.eval_size}) leaves no training prompts out of {n}; lower it")
        return self


def evaluate(expression: str) -> int:
    """The value of `n (op n)*`, op in + - *, with the usual precedence (products first):
    the sum of the signed products. `expression` must match `TOOL_CALL`'s group."""
    return sum((-1 if sign == "-" else 1) * math.prod(int(x) for x in term.split("*"))
               for sign, term in re.findall(r"([+-]?)([\d*]+)", expression))


def tool_result(turn: str) -> str | None:
    """The observation answering a policy turn: `=VALUE A:` for a tool call `c:EXPR`, `=? A:` for
    a malformed one (starts with `c:` but does not parse), None for a final answer."""
    if not turn.startswith("c:"):
        return None
    call = TOOL_CALL.fullmatch(turn)
    return f"={evaluate(call.group(1))} A:" if call else "=? A:"


class CalculatorEnv:
    Config = CalculatorConfig

    def __init__(self, config: CalculatorConfig | None = None):
        self.config = config or CalculatorConfig()
        c = self.config
        tasks = arithmetic_tasks(c.min_operand, c.max_operand, c.operators, c.split_seed)
        self._eval, self._train = tasks[: c.eval_size], tasks[c.eval_size:]

    def train_tasks(self) -> list[Task]:
        return self._train

    def eval_tasks(self) -> list[Task]:
        return self._eval

    def step(self, task: Task, transcript: Sequence[str]) -> str | None:
        return tool_result(transcript[-1])

    def score(self, task: Task, completion: Completion) -> float:
        return 1.0 if completion.finished and completion.final_turn == task.answer else 0.0
