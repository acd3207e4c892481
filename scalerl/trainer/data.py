"""The stream of training prompts: deterministic, resumable, sharded by rank."""

from __future__ import annotations

import random
from typing import Sequence

from scalerl.envs.base import Task


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
        self._order = self._order_for(0)

    def _order_for(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        if self.shuffle:
            random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def next_batch(self) -> list[Task]:
        picked = []
        for _ in range(self.per_rank * self.world_size):
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._order_for(self.epoch)
            picked.append(self.tasks[self._order[self.index]])
            self.index += 1
        return picked[self.rank * self.per_rank: (self.rank + 1) * self.per_rank]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._order_for(self.epoch)
