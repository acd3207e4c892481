"""Prompts that cannot fit: each prompt and its completion must fit in the model's positions, so a prompt
may have at most positions − max_new_tokens tokens (the larger of `rollout.max_new_tokens` and
`eval.max_new_tokens`: the training and the held-out prompts share one encoding; with the vLLM engine,
`rollout.vllm.max_model_len` instead of the positions where it is less).

`rollout.truncate_prompts` says what a longer prompt does:

    error  the run is refused before it trains (and `--dry-run` says so), naming the longest prompt
    left   it is cut to its last `limit` tokens (a chat model needs the question, which comes last)
    right  it is cut to its first `limit` tokens

The cut is made in the prompt encoding (`PromptFormat.encode`, scalerl/rollout/chat.py), so training,
evaluation and the async producer see the same prompt ids; the run says once at start how many prompts
are cut, and each step's `prompts_truncated` metric counts the cut prompts of its batch.

A multi-turn episode checks and cuts only its first turn's prompt: later turns append the policy's turns
and the observations (each at most max_new_tokens) to it, and a context that outgrows the positions is
not cut (a rotary-position model runs past them, one with a learned position table fails).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from collections.abc import Callable, Sequence

from scalerl.config import Config
from scalerl.errors import ScaleRLError
from scalerl.models.paths import max_positions
from scalerl.rollout.chat import PromptFormat
from scalerl.types import Task


def sequence_limit(config: Config, positions: int | None) -> int | None:
    """The longest prompt + completion: the model's `positions`, or `rollout.vllm.max_model_len` with the vLLM engine
    when that is less (None: neither says)."""
    engine_len = config.rollout.vllm.max_model_len if config.rollout.engine == "vllm" else None
    bounds = [n for n in (positions, engine_len) if n is not None]
    return min(bounds) if bounds else None


def prompt_limit(config: Config, positions: int | None) -> int | None:
    """The most tokens a prompt may have on a model with `positions` (None: the model does not say)."""
    total = sequence_limit(config, positions)
    if total is None:
        return None
    return total - max(config.rollout.max_new_tokens, config.eval.max_new_tokens or 0)


def model_positions(policy) -> int | None:
    """The positions a loaded model's config allows (a PEFT wrapper forwards `config` to its model)."""
    model_config = getattr(policy, "config", None)
    return max_positions(model_config.to_dict()) if hasattr(model_config, "to_dict") else None


@dataclass(frozen=True)
class PromptLengths:
    longest: int  # tokens of the longest prompt
    where: str  # which task it is, e.g. "training task 3 of 8" (counted from 1)
    over: int  # how many prompts are longer than the limit
    total: int  # how many prompts were encoded


def measure(fmt: PromptFormat, splits: Sequence[tuple[str, Sequence[Task]]], limit: int) -> PromptLengths:
    """Encode every task of each (name, tasks) split whole (no cut) and count those longer than `limit`."""
    whole = replace(fmt, max_tokens=None)
    longest, where, over, total = 0, "no task", 0, 0
    for name, tasks in splits:
        lengths = whole.lengths(tasks)
        for i, n in enumerate(lengths):
            if n > longest:
                longest, where = n, f"{name} task {i + 1} of {len(lengths)}"
        over += sum(n > limit for n in lengths)
        total += len(lengths)
    return PromptLengths(longest, where, over, total)


def fit_problem(config: Config, lengths: PromptLengths, limit: int, positions: int | None) -> str | None:
    """The one-line refusal when prompts do not fit and `rollout.truncate_prompts=error`; else None."""
    if lengths.over == 0 or config.rollout.truncate_prompts != "error":
        return None
    new = max(config.rollout.max_new_tokens, config.eval.max_new_tokens or 0)
    total = sequence_limit(config, positions)
    room = f"the model's {positions} positions" if total == positions else f"rollout.vllm.max_model_len={total}"
    return (f"env {config.env.name}: the longest prompt ({lengths.where}) has {lengths.longest} tokens, {lengths.over} of "
            f"{lengths.total} prompts are longer than {limit} ({room} less max_new_tokens={new} "
            "for the completion); shorten the prompts, lower rollout.max_new_tokens, use a model with more positions, or set "
            "rollout.truncate_prompts=left (keep each prompt's end) or right (its start)")


def fit_notice(config: Config, lengths: PromptLengths, limit: int) -> str | None:
    """The one-line warning when prompts are cut (`rollout.truncate_prompts` left or right); else None."""
    setting = config.rollout.truncate_prompts
    if lengths.over == 0 or setting == "error":
        return None
    kept = "last" if setting == "left" else "first"
    return (f"rollout.truncate_prompts={setting}: {lengths.over} of {lengths.total} prompts are longer than {limit} tokens "
            f"(the longest, {lengths.where}, has {lengths.longest}); each is cut to its {kept} {limit} tokens")


def fit_prompts(config: Config, fmt: PromptFormat, env, positions: int | None,
                warn: Callable[[str], None] | None) -> PromptFormat:
    """`fmt` that refuses (error) or cuts (left, right) prompts longer than the limit; raises ScaleRLError when
    a training or held-out prompt is too long and the setting is error; `warn`s once how many are cut."""
    limit = prompt_limit(config, positions)
    if limit is None:
        return fmt
    splits = [("training", env.train_tasks()), ("held-out", env.eval_tasks()[: config.eval.max_tasks])]
    lengths = measure(fmt, splits, limit)
    problem = fit_problem(config, lengths, limit, positions)
    if problem is not None:
        raise ScaleRLError(problem)
    notice = fit_notice(config, lengths, limit)
    if notice is not None and warn is not None:
        warn(notice)
    return replace(fmt, max_tokens=limit, truncate=config.rollout.truncate_prompts)
