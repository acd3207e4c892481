"""What the training job saves in a checkpoint and restores from one (the format: scalerl/trainer/checkpoint.py).

A checkpoint holds the learner's parts (weights, optimizer moments, critic, EWC's tensors) and state,
the rollout side's state and files (data position, reward state, replay buffer), the tokenizer, the
RNG, and the job's own state (step, times, pass rates, the health monitor's memory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from scalerl.distributed.context import DistContext
from scalerl.learner.learner import LearnerSide
from scalerl.rollout.base import RolloutSide
from scalerl.trainer import checkpoint as ckpt
from scalerl.trainer.step import publish_weights
from scalerl.types import derive_seed


def save(rollout: RolloutSide, learner: LearnerSide, ctx: DistContext, run_dir: Path, step: int, tokenizer: Any,
         state: dict[str, Any], keep_last: int | None, config_text: str | None = None) -> None:
    """`config_text`: the config in force (config.yaml's text), kept in the checkpoint and covered by its manifest, so
    that the checkpoints alone can be resumed (scalerl/config/resume.py `checkpoint_config`)."""
    parts = learner.checkpoint_parts()

    def files(folder: Path) -> None:
        rollout.save_files(folder, ctx.rank)
        if ctx.is_main and config_text is not None:
            (folder / "config.yaml").write_text(config_text)

    ckpt.save_checkpoint(run_dir / "checkpoints", step, ctx=ctx, model=parts.model, tokenizer=tokenizer,
                         optimizer=parts.optimizer, rng={"torch": torch.get_rng_state()}, extra_modules=parts.modules,
                         tensors=parts.tensors, rank_files=files,
                         trainer_state={**state, "rollout": rollout.state_dict(), "learner": learner.state_dict()},
                         keep_last=keep_last)


def restore(rollout: RolloutSide, learner: LearnerSide, ctx: DistContext, run_dir: Path, seed: int,
            warn: Callable[[str], None] = print) -> dict[str, Any]:
    """Load the newest intact checkpoint (damaged ones are set aside with a warning); returns its
    trainer state ({'step': 0} when there is none). `seed`: train.seed, for the RNG of a rank the saving run did not have."""
    root = run_dir / "checkpoints"
    if ctx.is_main:
        ckpt.remove_partial(root)
    ctx.barrier()

    def load(folder: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:  # all of it, so any damage is caught here
        parts = learner.checkpoint_parts()
        state, rng = ckpt.load_checkpoint(folder, ctx=ctx, model=parts.model, optimizer=parts.optimizer,
                                          extra_modules=parts.modules, tensors=parts.tensors)
        learner.load_state_dict(state.pop("learner"))
        rollout.load_state_dict(state.pop("rollout"))
        rollout.load_files(folder, ctx.rank)
        return state, rng

    loaded = ckpt.load_newest_intact(root, ctx, load, warn)
    if loaded is None:
        return {"step": 0}
    state, rng = loaded
    publish_weights(rollout, learner)
    if rng is not None:
        torch.set_rng_state(rng["torch"])
    else:  # a rank the saving run did not have: a stream of its own, from the seed, the rank and the step
        torch.manual_seed(derive_seed(seed, "rank", ctx.rank, state["step"]))
    return state
