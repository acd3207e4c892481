"""The stream of training prompts: deterministic, resumable, sharded by rank."""

from __future__ import annotations

import random
from typing import Sequence

from scalerl.types import Task
from scalerl.errors import ScaleRLError


class PromptStream:
    """Hands out `per_rank` tasks per step and rank from a pool, pass after pass.

    Every step consumes `per_rank * world_size` consecutive tasks of the current pass's order;
    rank r takes the r-th slice, so ranks never see the same prompt in a step. With `shuffle`,
    pass e uses the permutation of `random.Random(seed * 100_003 + e)`, so the position
    (pass, index) is all a checkpoint needs to resume the exact same sequence.
    """

    def __init__(self, tasks: Sequence[Task], per_rank: int, *, rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True):
        if not tasks:
            raise ValueError("the environment's training pool is empty")
        self.tasks, self.per_rank, self.rank, self.world_size = tasks, per_rank, rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.index = 0, 0
        self.retired: set[str] = set()
        self._order = self._order_for(0)

    def _order_for(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def next_batch(self) -> list[Task]:
        picked, skipped = [], 0
        while len(picked) < self.per_rank * self.world_size:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._order_for(self.epoch)
            task = self.tasks[self._order[self.index]]
            self.index += 1
            if task.prompt in self.retired:
                skipped += 1
                if skipped > len(self.tasks):
                    raise ScaleRLError("every training prompt has been retired (algorithm.retire_pass_rate): "
                                       "raise the threshold, add prompts, or stop earlier")
                continue
            picked.append(task)
        return picked[self.rank * self.per_rank: (self.rank + 1) * self.per_rank]

    def retire(self, prompts: list[str]) -> None:
        """No-positive-resampling: these prompts are skipped from now on (all ranks must retire the same)."""
        self.retired.update(prompts)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index, "retired": sorted(self.retired)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self.retired = set(state.get("retired", []))
        self._order = self._order_for(self.epoch)
