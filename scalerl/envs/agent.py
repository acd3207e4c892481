"""`env.name: agent`: an environment whose episodes are your own code talking to the policy over HTTP.

    def episode(base_url: str, task: Task) -> float:          # or `async def`
        client = openai.OpenAI(base_url=base_url, api_key="none")
        reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}], tools=TOOLS)
        ...                                                   # call tools, send more messages
        return reward

    env: {name: agent, args: {episode: my_agent:episode, data_file: tasks.jsonl}}

Each episode gets the base URL of an OpenAI-compatible endpoint that serves the policy being trained
(scalerl/rollout/openai_server.py) and one task; whatever it sends there is recorded server-side as token ids
and the sampler's log-probs, and the episode's calls become one training row: the first prompt, then every
reply of the policy (trained) with the tokens between them (the tool results and the template's markup, read
but not trained), with no re-tokenising (scalerl/rollout/episode_calls.py). The number it returns is the
reward. So a verifiers environment, an OpenEnv client or hand-written agent code becomes a ScaleRL
environment: wrap it in a function of (base_url, task).

An episode that raises, times out (`timeout_s`), returns something that is not a number, or whose calls are
not one conversation gets the fallback reward 0, trains no tokens, and counts in `reward/env_failures`,
which `reward.failures` watches like any failing reward. `rollout.group_size` episodes run per task, up to
`max_concurrency` at once (sync functions in threads); their requests are batched on the server.

Tasks come from `data_file` (JSONL: `prompt`, optional `answer`, any other fields go to `task.meta`) or
`tasks` (the same rows inline); the last `eval_size` rows are held out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_objects
from scalerl.plugins import import_object
from scalerl.types import Completion, Task


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    episode: str = Field(description="The episode function as 'module:function': f(base_url, task) -> reward, sync or async.")
    data_file: str | None = Field(None, description="JSONL of tasks: 'prompt' (text or chat messages), optional 'answer'; other "
                                                     "fields go to task.meta.")
    tasks: list[dict[str, Any]] | None = Field(None, description="The tasks inline, rows as in data_file (instead of data_file).")
    eval_size: int | None = Field(None, ge=0, description="Held-out tasks, the last rows (default: a tenth, at least 1).")
    timeout_s: float = Field(120.0, gt=0, description="Seconds an episode may run; a longer one is a reward failure.")
    max_concurrency: int = Field(64, ge=1, description="Episodes running at once (sync episode functions run in that many threads).")

    @model_validator(mode="after")
    def _one_source(self) -> "AgentConfig":
        if (self.data_file is None) == (self.tasks is None):
            raise ValueError("give data_file or tasks (one of them)")
        if ":" not in self.episode:
            raise ValueError(f"episode: '{self.episode}' is not 'module:function', e.g. my_agent:episode")
        return self


def _task(row: Any, where: str) -> Task:
    if not isinstance(row, dict) or "prompt" not in row:
        raise ScaleRLError(f"{where}: a task row is an object with a 'prompt'")
    row = dict(row)
    prompt = row.pop("prompt")
    answer = row.pop("answer", None)
    if isinstance(prompt, list):  # chat messages: shown as the last one, kept whole in meta
        row["messages"] = prompt
        prompt = str(prompt[-1].get("content", "")) if prompt and isinstance(prompt[-1], dict) else ""
    return Task(str(prompt), None if answer is None else str(answer), row)


class AgentEnv:
    Config = AgentConfig

    def __init__(self, config: AgentConfig):
        self.config = config
        if config.data_file is not None:
            where = "env.args.data_file"
            rows = [row for _, row in read_objects(Path(config.data_file), expected="a 'prompt'", where=where)]
        else:
            rows, where = config.tasks or [], "env.args.tasks"
        tasks = [_task(row, where) for row in rows]
        held = config.eval_size if config.eval_size is not None else (max(1, len(tasks) // 10) if len(tasks) > 1 else 0)
        if held >= len(tasks) and tasks:
            raise ScaleRLError(f"env.args.eval_size: {held} leaves no training tasks out of {len(tasks)}; lower it")
        self._train, self._eval = tasks[: len(tasks) - held], tasks[len(tasks) - held:]
        self.episode_function()  # a name that does not import fails here, before any step

    def episode_function(self) -> Callable:
        fn = import_object(self.config.episode, "env.args.episode", example="my_agent:episode")
        if not callable(fn):
            raise ScaleRLError(f"env.args.episode: '{self.config.episode}' is a {type(fn).__name__}, not a function")
        return fn

    def train_tasks(self) -> list[Task]:
        return self._train

    def eval_tasks(self) -> list[Task]:
        return self._eval

    def score(self, task: Task, completion: Completion) -> float | None:
        """The episode's own reward; None (a reward failure) when it had none."""
        return completion.reward
