"""What the Python API is handed, made into what the training job reads: a dataset (a list of dicts, a
`datasets.Dataset`, or a JSONL path) as a JSONL file, a model object as a model folder, reward callables
as named reward components.

A row's `prompt` (a string, or a list of {role, content} messages; or a `messages` column) is the prompt;
every other column reaches the reward functions by name, one list entry per completion (TRL's convention).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from scalerl.errors import ScaleRLError
from scalerl.files import write_atomically
from scalerl.jsonl import read_objects

# keyword arguments a reward function receives besides the columns (scalerl/rewards/components.py): a column of one
# of these names would be shadowed by it, or collide with it, so it is refused
RESERVED = ("prompts", "completions", "answers", "tasks", "finished", "group_ids")


def check_columns(row: dict, where: str) -> None:
    if not ("prompt" in row or "messages" in row):
        raise ScaleRLError(f"{where} has no 'prompt' column; each row needs a 'prompt' (text or chat messages)")
    taken = [name for name in RESERVED if name in row]
    if taken:
        raise ScaleRLError(f"{where} has a column '{taken[0]}', a name reward functions already receive "
                           f"({', '.join(RESERVED)}); rename the column")


def dataset_file(dataset: Any, folder: Path, stem: str, where: str) -> tuple[Path, int]:
    """(the JSONL file that holds `dataset`, its number of rows): a path is used as it is; rows (a list of dicts, a
    `datasets.Dataset`, any iterable of dicts) are written to `folder/<stem>.jsonl`."""
    if isinstance(dataset, (str, Path)):
        path = Path(dataset)
        if not path.is_file():
            raise ScaleRLError(f"{where}: {path} is not a file; give a JSONL file, a list of dicts or a datasets.Dataset")
        rows = read_objects(path, expected="a 'prompt'", where=where)
        for i, row in rows:
            check_columns(row, f"{where}: {path}:{i}")
        return path, len(rows)
    if isinstance(dataset, dict) or not isinstance(dataset, Iterable):
        raise ScaleRLError(f"{where}: got {type(dataset).__name__}; give a list of dicts (one per row), a datasets.Dataset "
                           "or a JSONL path")
    lines = []
    for i, row in enumerate(dataset):
        if not isinstance(row, dict):
            raise ScaleRLError(f"{where}: row {i} is a {type(row).__name__}; give rows as dicts of columns")
        check_columns(row, f"{where}: row {i}")
        try:
            lines.append(json.dumps(row, ensure_ascii=False))
        except (TypeError, ValueError) as err:
            raise ScaleRLError(f"{where}: row {i} holds a value that is not JSON ({err}); give columns of text, numbers, "
                               "lists or dicts") from None
    if not lines:
        raise ScaleRLError(f"{where}: the dataset is empty")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.jsonl"
    write_atomically(path, "\n".join(lines) + "\n")
    return path, len(lines)


def model_folder(model: Any, tokenizer: Any, folder: Path) -> dict[str, Any]:
    """model.* settings for `model` (a folder, a hub id, 'builtin', or a transformers model object, which is saved to
    `folder/model` with its tokenizer) and `tokenizer` (None: the model's own; a folder or id; or a tokenizer object,
    saved with the model, or for a model by name to `folder/tokenizer` beside that model's config.json)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if callable(getattr(model, "save_pretrained", None)):
        model.save_pretrained(folder / "model")
        if tokenizer is None:
            source = getattr(model, "name_or_path", "")
            if not source or not Path(source).is_dir():
                raise ScaleRLError("tokenizer: a model object needs its tokenizer: Trainer(model=..., tokenizer=...)")
            return {"path": str(folder / "model"), "tokenizer": source}
        if isinstance(tokenizer, (str, Path)):
            return {"path": str(folder / "model"), "tokenizer": str(tokenizer)}
        tokenizer.save_pretrained(folder / "model")
        return {"path": str(folder / "model")}
    if not isinstance(model, (str, Path)):
        raise ScaleRLError(f"model: got {type(model).__name__}; give a model folder, 'builtin', or a transformers model object")
    settings: dict[str, Any] = {"path": str(model)}
    if isinstance(tokenizer, (str, Path)):
        settings["tokenizer"] = str(tokenizer)
    elif tokenizer is not None:  # model.tokenizer names a folder with a config.json, as a model folder has
        from transformers import AutoConfig

        from scalerl.models.paths import resolve_model_path

        tokenizer.save_pretrained(folder / "tokenizer")
        AutoConfig.from_pretrained(resolve_model_path(str(model))).save_pretrained(folder / "tokenizer")
        settings["tokenizer"] = str(folder / "tokenizer")
    return settings


def reward_components(reward_funcs: Any, weights: Sequence[float] | None) -> tuple[list[dict], dict[str, Callable]]:
    """(reward.components entries `function: python:NAME`, the callables by NAME) for one callable or a list of them;
    NAME is the function's `__name__` (made an identifier, numbered when two share it)."""
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if weights is not None and len(weights) != len(funcs):
        raise ScaleRLError(f"reward_weights: {len(weights)} weights for {len(funcs)} reward functions; give one per function")
    components, by_name = [], {}
    for i, fn in enumerate(funcs):
        if not callable(fn):
            raise ScaleRLError(f"reward_funcs[{i}]: {fn!r} is not callable; give functions f(prompts, completions, **columns) -> list[float]")
        base = re.sub(r"\W", "_", getattr(fn, "__name__", "") or "reward").lstrip("0123456789") or "reward"
        name = base if base not in by_name else f"{base}_{i}"
        by_name[name] = fn
        components.append({"name": name, "function": f"python:{name}", "weight": 1.0 if weights is None else float(weights[i])})
    return components, by_name


def trl_style(fn: Callable) -> Callable:
    """`fn` called as TRL calls a reward function: for a conversational dataset (chat-message prompts) the prompts are
    the message lists and each completion is [{"role": "assistant", "content": text}]; for text prompts, text."""
    def call(prompts: list[str], completions: list[str], **columns: Any) -> Any:
        tasks = columns.get("tasks") or []
        if tasks and all("messages" in t.meta for t in tasks):
            prompts = [t.meta["messages"] for t in tasks]
            completions = [[{"role": "assistant", "content": c}] for c in completions]
        return fn(prompts=prompts, completions=completions, **columns)
    call.__name__ = getattr(fn, "__name__", "reward")
    call.__wrapped__ = fn  # inspect.signature reads the user's: a call it cannot take gets its hint (rewards/safe_call.py)
    return call
