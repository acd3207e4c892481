"""Periodic sample dumps for human review (a reward-hacking defence, SPEC §3).

Every `every` steps the step's samples go to `<run_dir>/samples/step_NNNNNN.jsonl` (six digits,
e.g. `samples/step_000050.jsonl`), one JSON object per completion, in batch order:

    {"step": 50, "index": 0, "group": 0, "prompt": "12+7=", "completion": "19", "finished": true,
     "components": {"correct": 1.0, "length": -0.1}, "fused": 0.9, "reward": 0.85, ...extra}

`components` holds each reward component's score, `fused` the fused reward, `reward` the reward
the update used (after the cap and the diversity penalty); `extra` adds per-sample columns (e.g.
`diversity_similarity`). The file is written to a temporary name and renamed, so a reader never
sees half a dump. Rank 0 writes; other ranks' samples are not dumped.

Every evaluation also writes a few of its completions (prompt, completion without special tokens, score)
to `samples/eval_step_NNNNNN.jsonl` (`write_eval_samples`), whatever `reward.dump_every` is.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from scalerl.files import write_atomically


def write_eval_samples(run_dir: Path, step: int, rows: Sequence[Mapping[str, Any]]) -> Path:
    """A few completions of the evaluation after `step` steps (prompt, completion, score), to samples/eval_step_NNNNNN.jsonl."""
    path = Path(run_dir) / "samples" / f"eval_step_{step:06d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, "".join(json.dumps({"step": step, **row}, ensure_ascii=False) + "\n" for row in rows))
    return path


def dump_due(step: int, every: int) -> bool:
    """True when `step` is a multiple of `every` (> 0); `every` = 0 never dumps."""
    return every > 0 and step % every == 0


def _number(value: float) -> float | None:
    """JSON has no NaN/inf: non-finite scores become null."""
    value = float(value)
    return value if math.isfinite(value) else None


def _plain(values: Any) -> Any:
    return values.tolist() if isinstance(values, torch.Tensor) else values


def sample_rows(step: int, prompts: Sequence[str], completions: Sequence[str], *, group_ids: Sequence[int],
                components: Mapping[str, Sequence[float]], fused: Sequence[float], rewards: Sequence[float],
                finished: Sequence[bool] | None = None, extra: Mapping[str, Sequence[Any]] | None = None) -> list[dict[str, Any]]:
    """One dict per sample (see the module docstring); every sequence (list or 1-D tensor) has one
    entry per sample."""
    group_ids, fused, rewards, finished = _plain(group_ids), _plain(fused), _plain(rewards), _plain(finished)
    components = {name: _plain(values) for name, values in components.items()}
    extra = {name: _plain(values) for name, values in (extra or {}).items()}
    n = len(completions)
    columns = {"prompts": prompts, "group_ids": group_ids, "fused": fused, "rewards": rewards, **components, **extra}
    if finished is not None:
        columns["finished"] = finished
    wrong = {name: len(values) for name, values in columns.items() if len(values) != n}
    if wrong:
        raise ValueError(f"sample dump: {n} completions but {wrong} entries")
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"step": step, "index": i, "group": int(group_ids[i]), "prompt": prompts[i], "completion": completions[i]}
        if finished is not None:
            row["finished"] = bool(finished[i])
        row["components"] = {name: _number(values[i]) for name, values in components.items()}
        row["fused"], row["reward"] = _number(fused[i]), _number(rewards[i])
        for name, values in extra.items():
            value = values[i]
            row[name] = _number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write `rows` as JSONL to `path` atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


def dump_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "samples" / f"step_{step:06d}.jsonl"


def dump_samples(run_dir: Path, step: int, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> Path:
    """`sample_rows` written to `dump_path(run_dir, step)`; returns the path. Keyword arguments as
    in `sample_rows` (group_ids, components, fused, rewards, finished, extra)."""
    return write_jsonl(dump_path(run_dir, step), sample_rows(step, prompts, completions, **columns))
