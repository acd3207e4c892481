"""Crash-consistent checkpoints: a complete one is never lost, a partial one is never loaded.

A save writes everything into `checkpoints/step_NNNNNNN.tmp/`, fsyncs every file, writes the
`COMPLETE` marker last, renames the folder to `step_NNNNNNN` and fsyncs the parent. Only folders
with the marker count; rotation deletes older complete checkpoints only after the new one is
complete, keeping `keep_last`. Leftover `.tmp` folders of a killed save are removed on resume.

Contents: the model in Hugging Face format (safetensors + config.json + tokenizer, loadable with
`from_pretrained`), `optimizer.pt` (tensors and plain containers only, read back with
`torch.load(weights_only=True)`), `rng_rank<R>.pt` per rank, and `trainer_state.json` (step, the
rollout side's state: data position, reward state, policy version; the learner's: version, updates
taken, which is the lr schedule's position, health responses, β controller).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from scalerl.distributed.context import DistContext
from scalerl.errors import ScaleRLError

MARKER = "COMPLETE"
_NAME = re.compile(r"^step_(\d{7})$")


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def remove_partial(root: Path) -> list[Path]:
    """Delete folders of saves that never completed (a crash mid-save); returns what was removed."""
    if not root.is_dir():
        return []
    complete = set(complete_checkpoints(root))
    partial = [p for p in root.iterdir() if p.is_dir() and p not in complete]
    for p in partial:
        shutil.rmtree(p, ignore_errors=True)
    return partial


def save_checkpoint(
    root: Path, step: int, *, ctx: DistContext, model: torch.nn.Module, tokenizer: Any,
    optimizer: torch.optim.Optimizer, rng: dict[str, torch.Tensor],
    trainer_state: dict[str, Any], keep_last: int, extra_weights: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    final = root / f"step_{step:07d}"
    tmp = root / f"step_{step:07d}.tmp"
    if ctx.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    ctx.barrier()
    torch.save(rng, tmp / f"rng_rank{ctx.rank}.pt")  # every rank's sampling stream differs
    ctx.barrier()
    if ctx.is_main:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, state in (extra_weights or {}).items():  # e.g. PPO's critic, as `critic.safetensors`
            save_file({k: v.contiguous() for k, v in state.items()}, tmp / f"{name}.safetensors")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}, indent=1))
        _fsync_tree(tmp)
        (tmp / MARKER).write_text(f"{step}\n")
        _fsync_tree(tmp)
        if final.exists():  # re-saving a step (e.g. the final save right after a periodic one)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
        for old in complete_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old)
    ctx.barrier()
    return final


def load_model_weights(model: torch.nn.Module, folder: Path, skip: set[str] = frozenset()) -> None:
    """Load the model's *.safetensors of a checkpoint strictly, allowing only tied duplicates to be absent."""
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        if shard.stem not in skip:
            state.update(load_file(shard))
    missing, unexpected = model.load_state_dict(state, strict=False)
    all_names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    tied = all_names - {n for n, _ in model.named_parameters()}
    if unexpected or set(missing) - tied:
        raise ScaleRLError(f"checkpoint {folder} does not match the model (missing {sorted(set(missing) - tied)[:3]}, "
                           f"unexpected {unexpected[:3]}); resume with the same model.path")


def load_checkpoint(folder: Path, *, ctx: DistContext, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    extra_modules: dict[str, torch.nn.Module] | None = None
                    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Restore model, optimizer (and extra modules such as a critic) in place; returns
    (trainer_state, this rank's RNG states)."""
    extra_modules = extra_modules or {}
    load_model_weights(model, folder, skip=set(extra_modules))
    for name, module in extra_modules.items():
        module.load_state_dict(load_file(folder / f"{name}.safetensors"))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
    rng = torch.load(folder / f"rng_rank{ctx.rank}.pt", weights_only=True)
    return json.loads((folder / "trainer_state.json").read_text()), rng
