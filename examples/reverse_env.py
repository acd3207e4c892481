"""A user environment in a few lines: reverse a three-digit string (the README's example).

    PYTHONPATH=examples scalerl train --set env.name=reverse_env:ReverseEnv --set env.args.n=800
"""

from pydantic import BaseModel

from scalerl.types import Completion, Task


class ReverseConfig(BaseModel):
    n: int = 500  # how many numbers 000..n-1 make up the task pool


class ReverseEnv:
    Config = ReverseConfig

    def __init__(self, config: ReverseConfig):
        words = [f"{i:03d}" for i in range(config.n)]
        self.tasks = [Task(prompt=w + "=", answer=w[::-1]) for w in words]

    def train_tasks(self):
        return self.tasks[50:]

    def eval_tasks(self):
        return self.tasks[:50]

    def score(self, task: Task, completion: Completion) -> float:
        return float(completion.finished and completion.text == task.answer)
