"""Reward components: each scores a batch of completions with one float per completion.

    env        the environment's own verifier (the score the trainer computes anyway)
    model      a Hugging Face sequence-classification folder, batched (`RewardModelScorer`)
    function   'module:function' with TRL's signature f(prompts, completions, **kwargs) -> list[float],
               run in a worker process with a timeout (`safe_call.FunctionWorker`); or 'python:NAME', a
               callable handed to the Python API (scalerl/api/), called in the trainer's process

A component returns (B,) float32 scores on the CPU, with NaN for an entry it could not score, or
raises `RewardCallError` when the whole call failed; `scorer.RewardScorer` turns both into the
fallback reward and counts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch

from scalerl.types import Completion, Task
from scalerl.rewards.safe_call import FunctionWorker, RewardCallError, call_function, check_length, user_traceback


@dataclass(frozen=True)
class RewardInputs:
    """One step's completions, as every component sees them; row i answers prompt `prompts[i]`."""

    prompts: list[str]
    completions: list[str]  # decoded, up to (not including) EOS
    finished: list[bool]  # False: cut off at max_new_tokens
    tasks: list[Task]  # the task of each row (answer, meta)
    group_ids: list[int]
    env_scores: torch.Tensor | None  # (B,) the environment's score of each row; None until computed

    @classmethod
    def of(cls, tasks: Sequence[Task], group_ids: list[int], completions: Sequence[Completion],
           env_scores: torch.Tensor | None = None) -> "RewardInputs":
        """Row i is `completions[i]`, answering `tasks[group_ids[i]]`."""
        return cls(prompts=[tasks[g].prompt for g in group_ids], completions=[c.text for c in completions],
                   finished=[c.finished for c in completions], tasks=[tasks[g] for g in group_ids],
                   group_ids=list(group_ids), env_scores=env_scores)

    def function_kwargs(self) -> dict:
        """Keyword arguments of a function component: the data's columns by name, as TRL passes them (a task's
        `meta`: the columns of its data row other than the prompt), then answers, tasks, finished, group_ids."""
        names = dict.fromkeys(key for t in self.tasks for key in t.meta if key != "messages")  # in first-seen order
        columns = {name: [t.meta.get(name) for t in self.tasks] for name in names}
        return {**columns, "answers": [t.answer for t in self.tasks], "tasks": self.tasks, "finished": self.finished,
                "group_ids": self.group_ids}


class Component(Protocol):
    name: str
    source: str  # what the scores come from, for messages: 'env', a model folder, or 'module:function'

    def submit(self, inputs: RewardInputs) -> None:
        """Start scoring in the background where the component can (a function's worker process);
        `score` then collects. A no-op for components that score in the trainer's process."""
        ...

    def score(self, inputs: RewardInputs) -> torch.Tensor:
        """(B,) float32 on the CPU; NaN where an entry could not be scored."""
        ...

    def close(self) -> None:
        ...


@dataclass
class EnvComponent:
    name: str
    source: str = "env"

    def submit(self, inputs: RewardInputs) -> None:
        pass  # the trainer computes the environment's scores itself

    def score(self, inputs: RewardInputs) -> torch.Tensor:
        return inputs.env_scores.detach().float().cpu()

    def close(self) -> None:
        pass  # holds nothing


class ModelComponent:
    """A reward model's scores (normalised per component: none / sigmoid / batch)."""

    def __init__(self, name: str, path: str, device: torch.device | str, *, batch_size: int, normalize: str):
        from scalerl.rewards.reward_model import RewardModelScorer

        self.name, self.source = name, path
        self.scorer = RewardModelScorer(path, device, batch_size=batch_size, normalize=normalize)

    def submit(self, inputs: RewardInputs) -> None:
        pass  # scored in the trainer's process, on its device

    def score(self, inputs: RewardInputs) -> torch.Tensor:
        return self.scorer.score(inputs.prompts, inputs.completions, inputs.finished).float()

    def close(self) -> None:
        pass  # the model is freed with the object


class FunctionComponent:
    """A user's function in its own worker process, bounded by `timeout_s`."""

    def __init__(self, name: str, spec: str, *, timeout_s: float):
        self.name, self.source = name, spec
        self.worker = FunctionWorker(spec, timeout_s)
        self._error: RewardCallError | None = None

    def submit(self, inputs: RewardInputs) -> None:
        self._error = None
        try:
            self.worker.submit(inputs.prompts, inputs.completions, inputs.function_kwargs())
        except RewardCallError as err:  # the worker could not start: `score` reports it, contained like any failure
            self._error = err

    def score(self, inputs: RewardInputs) -> torch.Tensor:
        """The submitted call's scores, or a call made now when nothing was submitted."""
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        if not self.worker.pending:
            self.worker.submit(inputs.prompts, inputs.completions, inputs.function_kwargs())
        return torch.tensor(self.worker.result(), dtype=torch.float32)

    @property
    def restarts(self) -> int:
        """Worker processes replaced so far (a timeout, a death during or between calls, a failed start)."""
        return self.worker.restarts

    def close(self) -> None:
        self.worker.close()


class CallableComponent:
    """A Python callable handed to the Python API (`function: python:NAME`), called in the trainer's process: an
    object made in the user's script (a closure, a lambda, a function of `__main__`) has no import path a worker
    process could import. Exceptions and bad results are contained as a worker's are (`RewardCallError`, the
    fallback, counted); unlike a worker, nothing bounds a call's time, so a call that hangs holds the run."""

    def __init__(self, name: str, spec: str, fn: Callable[..., Any], *, timeout_s: float):
        self.name, self.source, self.fn, self.timeout_s = name, spec, fn, timeout_s

    def submit(self, inputs: RewardInputs) -> None:
        pass  # called in `score`, in this process

    def score(self, inputs: RewardInputs) -> torch.Tensor:
        try:  # timeout_s bounds an `async def` only (asyncio.wait_for)
            result = call_function(self.fn, self.source, inputs.prompts, inputs.completions, inputs.function_kwargs(), self.timeout_s)
            scores = check_length(result, len(inputs.completions), self.source)
        except RewardCallError:
            raise
        except TimeoutError as err:
            raise RewardCallError("timeout", f"{self.source} did not finish within {self.timeout_s:g} s (async, cancelled)") from err
        except Exception as err:  # the user's code: contained like a worker's failure, reported with its traceback
            raise RewardCallError("error", user_traceback(err)) from err
        return torch.tensor(scores, dtype=torch.float32)

    def close(self) -> None:
        pass  # holds nothing
