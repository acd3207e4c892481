"""The environment interface: where prompts come from and how a completion is scored.

A task is one prompt with whatever its verifier needs (`answer`, `meta`). An environment hands out
a training pool and a held-out set, and scores a completion. Single-turn tasks need nothing else.

Multi-turn environments (`MultiTurnEnvironment`) add one method, `step(task, transcript)`, that the
rollout (`scalerl/rollout/multiturn.py`) calls after each of the policy's turns while fewer than
`rollout.max_turns` turns have been taken. `transcript` is the conversation so far as text: the
policy's turns and the environment's observations alternately, starting and ending with a policy
turn (each turn without its end-of-sequence or end-of-turn token, which is how the policy ends a
turn). `step` returns the observation to append (a tool result, say), whose tokens the policy then
reads as context, or None when the episode is over. A turn cut off at `max_new_tokens` also ends
the episode. Only the policy's own tokens are trained on; observations never are. `score` then sees
the whole episode: `Completion.turns` holds the transcript, `Completion.final_turn` the last turn.
With a chat template (`env.chat_template`) each observation is rendered as the next message of the
conversation, of role `user` unless the environment sets a class attribute `observation_role`
(e.g. `"tool"`, for templates that mark tool results).

Reward shaping (optional, for sparse rewards; `scalerl/envs/shaping.py`, shown in `math_env.py`):
an environment may define `partial_credit(task, completion) -> float` in [0, 1] (or let its
`shaping.function` config name a `module:function` with that signature) and then also defines
`correct(task, completion) -> float`, the unshaped 0/1 judgement. Its `score`, the training
reward, is then `max(correct, shaping.weight · partial_credit)` with 0 ≤ weight < 1, so a correct
answer always earns 1 and a wrong one at most the weight. Held-out pass rates call `correct` when
it exists (`shaping.unshaped_score`), so they never include partial credit.

A new task is one small class with a pydantic `Config` (its keyword arguments, validated when the
run's config is built) and these three methods; register it by name in `registry.py` or pass it
as `module:Class`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel

from scalerl.errors import ScaleRLError
from scalerl.types import Completion, Task

log = logging.getLogger(__name__)
_WARNED: set[tuple[str, str]] = set()

def renamed_args(data: Any, env: str, renames: dict[str, str]) -> Any:
    """One spelling per concept across the environments: the data file is `data_file` (older: train_file, data_path,
    file), the held-out count `eval_size` (older: num_eval; a share: `eval_fraction`).
    env.args with an older spelling moved to its one name (a `mode="before"` validator of an environment's Config);
    a deprecation warning names the new key, once per process; both spellings at once is an error."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for old, new in renames.items():
        if old not in data:
            continue
        if new in data:
            raise ValueError(f"env.args.{old} and env.args.{new} are the same option ({old} is its older name); keep {new}")
        data[new] = data.pop(old)
        if (env, old) not in _WARNED:
            _WARNED.add((env, old))
            log.warning("env.args.%s is deprecated (environment %s): use env.args.%s", old, env, new)
    return data


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


class MultiTurnEnvironment(Environment, Protocol):
    """An environment that answers the policy between turns (optional; see the module docstring)."""

    def step(self, task: Task, transcript: Sequence[str]) -> str | None:
        """The observation to append after the policy's latest turn (`transcript[-1]`), or None
        when the episode is over. Called only when another policy turn can follow."""
        ...


def conversational_prompt(value: object, where: str) -> tuple[str, list[dict[str, str]] | None]:
    """A data row's prompt: a string, or a list of {role, content} messages (TRL's conversational format).
    Returns (the text shown in logs and dumps: the last user message for a conversation, the messages or
    None); the messages go into `Task.meta["messages"]` and through the chat template (scalerl/rollout/chat.py)."""
    if isinstance(value, str):
        return value, None
    if (isinstance(value, list) and value and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                  and isinstance(m.get("content"), str) for m in value)):
        messages = [{"role": m["role"], "content": m["content"]} for m in value]
        users = [m["content"] for m in messages if m["role"] == "user"]
        return (users[-1] if users else messages[-1]["content"]), messages
    raise ScaleRLError(f"{where}: a prompt is a string or a list of {{\"role\": ..., \"content\": ...}} messages")


def pop_prompt(row: dict, where: str) -> tuple[str, list[dict[str, str]] | None] | None:
    """Take a JSONL row's prompt out of it: `prompt` (a string or a list of messages) or, without one, `messages`
    (a list of messages, TRL's conversational format), through `conversational_prompt`; None when it has neither."""
    if "prompt" in row and "messages" in row:
        raise ScaleRLError(f"{where}: give 'prompt' or 'messages', not both")
    if "prompt" in row:
        return conversational_prompt(row.pop("prompt"), where)
    if isinstance(row.get("messages"), list):
        return conversational_prompt(row.pop("messages"), where)
    return None
