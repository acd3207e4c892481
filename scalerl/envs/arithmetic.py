"""Built-in `arithmetic` environment: `a+b=` prompts with an exact-answer reward.

Every (a, op, b) triple with operands in [min_operand, max_operand] is enumerated (operator outer,
then a, then b), shuffled once with `random.Random(split_seed)`; the first `eval_size` are the
held-out set and the rest, in that shuffled order, the training pool. With the defaults (`+`
only, operands 0-99, 200 held out, split seed 0) this is exactly the split of the CPU reference
benchmark, so both libraries can be run on the same prompts.

Reward (binary, no partial credit): 1.0 iff the completion is the answer followed by the end of
sequence or a space (anything after the space is ignored), else 0.0. A completion cut off at
`max_new_tokens` right after the digits earns nothing: the model did not say it was done.
"""

from __future__ import annotations

import operator
import random
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scalerl.envs.base import pop_prompt, renamed_args
from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_objects
from scalerl.types import Completion, Task

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
MAX_PROMPTS = 10_000_000


class ArithmeticConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _older_spellings(cls, data: Any) -> Any:
        return renamed_args(data, "arithmetic", {"train_file": "data_file", "num_eval": "eval_size"})

    min_operand: int = Field(0, ge=0, description="Smallest operand.")
    max_operand: int = Field(99, ge=0, description="Largest operand.")
    operators: list[Literal["+", "-", "*"]] = Field(["+"], min_length=1, description="Operators to draw from.")
    eval_size: int = Field(200, ge=1, description="Held-out prompts for the pass rate (eval.*) (older name: num_eval).")
    split_seed: int = Field(0, description="Seed of the one shuffle that splits held-out from training prompts.")
    data_file: Path | None = Field(None, description="JSONL of {prompt, answer} replacing the generated training pool (older name: train_file).")
    eval_file: Path | None = Field(None, description="JSONL of {prompt, answer} replacing the generated held-out set.")

    @model_validator(mode="after")
    def _check_range(self) -> ArithmeticConfig:
        if self.max_operand < self.min_operand:
            raise ValueError(f"max_operand ({self.max_operand}) must be >= min_operand ({self.min_operand})")
        n = (self.max_operand - self.min_operand + 1) ** 2 * len(self.operators)
        if n > MAX_PROMPTS:  # every prompt is built in memory
            raise ValueError(f"operands {self.min_operand}..{self.max_operand} make {n} prompts, more than the {MAX_PROMPTS} "
                             "that are enumerated; narrow the range")
        if self.data_file is None and self.eval_size >= n:
            raise ValueError(f"eval_size ({self.eval_size}) leaves no training prompts out of {n}; lower it")
        return self


def read_tasks(path: Path, where: str | None = None) -> list[Task]:
    """Tasks from a JSONL file with `prompt` and `answer` fields (other fields go to `meta`); the prompt is a
    string or a list of {role, content} messages (TRL's conversational format, also as a `messages` field),
    which go into `meta["messages"]` and through the chat template. `where` is the config key that named
    the file, for the messages."""
    tasks = []
    for i, row in read_objects(path, expected="'prompt' and 'answer'", where=where):
        at = f"{where + ': ' if where else ''}{path}:{i}"
        fields = ", ".join(row) or "nothing"
        prompt = pop_prompt(row, at) if "answer" in row else None
        if prompt is None:
            raise ScaleRLError(f"{at}: needs 'prompt' and 'answer', a string prompt or a list of messages (it has: {fields})")
        text, messages = prompt
        meta = {**row, "messages": messages} if messages is not None else row
        tasks.append(Task(prompt=text, answer=str(meta.pop("answer")), meta=meta))
    return tasks


def arithmetic_tasks(min_operand: int, max_operand: int, operators: list[str], split_seed: int) -> list[Task]:
    """Every `a op b=` with operands in [min_operand, max_operand], in the order of one shuffle by
    `random.Random(split_seed)`: the first ones are held out, the rest train."""
    operands = range(min_operand, max_operand + 1)
    triples = [(a, op, b) for op in operators for a in operands for b in operands]
    random.Random(split_seed).shuffle(triples)
    return [Task(prompt=f"{a}{op}{b}=", answer=str(OPERATORS[op](a, b))) for a, op, b in triples]


class ArithmeticEnv:
    Config = ArithmeticConfig

    def __init__(self, config: ArithmeticConfig | None = None):
        self.config = config or ArithmeticConfig()
        c = self.config
        tasks = arithmetic_tasks(c.min_operand, c.max_operand, c.operators, c.split_seed)
        self._eval = read_tasks(c.eval_file, "env.args.eval_file") if c.eval_file else tasks[: c.eval_size]
        self._train = read_tasks(c.data_file, "env.args.data_file") if c.data_file else tasks[c.eval_size :]

    def train_tasks(self) -> list[Task]:
        return self._train

    def eval_tasks(self) -> list[Task]:
        return self._eval

    def score(self, task: Task, completion: Completion) -> float:
        answer = task.answer
        exact = completion.finished and completion.text == answer
        return 1.0 if exact or completion.text.startswith(answer + " ") else 0.0
