"""Built-in `reward_model` environment: open-ended prompts with no verifier.

The prompts come from a JSONL file with a `prompt` column (an `answer` column, if present, is also passed
on to function reward components as `answers`; every other column goes to `Task.meta` and reaches reward
functions by name). The shipped set,
`data/open_prompts.jsonl`, holds 40 short lowercase prompts that the built-in character tokenizer
can encode. The last `eval_size` lines of the file are held out unless `eval_file` gives a separate
held-out set.

There is nothing to check a completion against, so `score` is 0 and `verifier = False`: the run's
reward comes only from `reward_components` (or `reward.model`), which the config check requires.
The held-out "pass rate" of such a run is the mean fused reward of greedy completions, with the
components' configured weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scalerl.envs.base import conversational_prompt, renamed_args
from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_objects
from scalerl.types import Completion, Task

SHIPPED_PROMPTS = Path(__file__).parent / "data" / "open_prompts.jsonl"


class OpenPromptsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _older_spellings(cls, data: Any) -> Any:
        return renamed_args(data, "reward_model", {"file": "data_file", "num_eval": "eval_size"})

    data_file: Path | None = Field(None, description="JSONL with a 'prompt' column; default: the shipped set of 40 short prompts (older name: file).")
    eval_file: Path | None = Field(None, description="JSONL of held-out prompts; default: the last eval_size lines of `data_file`.")
    eval_size: int = Field(8, ge=1, description="Held-out prompts taken from the end of `data_file` when there is no eval_file (older name: num_eval).")


def read_prompts(path: Path) -> list[Task]:
    """Tasks from a JSONL file with a `prompt`: a string, or a list of {role, content} messages (optional
    `answer`; other fields go to `meta`)."""
    tasks = []
    for i, row in read_objects(path, expected="a string 'prompt'"):
        if "prompt" not in row:
            raise ScaleRLError(f"{path}:{i}: expected a JSON object with a string 'prompt'")
        text, messages = conversational_prompt(row.pop("prompt"), f"{path}:{i}")
        answer = row.get("answer")  # also kept in meta, as it was: reward functions receive the column by name
        meta = {**row, **({"messages": messages} if messages is not None else {})}
        tasks.append(Task(prompt=text, answer=None if answer is None else str(answer), meta=meta))
    return tasks

class OpenPromptsEnv:
    Config = OpenPromptsConfig
    verifier: ClassVar[bool] = False  # scored only by reward components (checked when the config is built)

    def __init__(self, config: OpenPromptsConfig | None = None):
        self.config = c = config or OpenPromptsConfig()
        tasks = read_prompts(c.data_file or SHIPPED_PROMPTS)
        if c.eval_file is not None:
            self._train, self._eval = tasks, read_prompts(c.eval_file)
        elif c.eval_size >= len(tasks):
            raise ScaleRLError(f"env.args.eval_size ({c.eval_size}) leaves no training prompts out of {len(tasks)}; lower it or give eval_file")
        else:
            self._train, self._eval = tasks[: -c.eval_size], tasks[-c.eval_size:]

    def train_tasks(self) -> list[Task]:
        return self._train

    def eval_tasks(self) -> list[Task]:
        return self._eval

    def score(self, task: Task, completion: Completion) -> float:
        return 0.0  # no verifier: the reward components score these prompts
