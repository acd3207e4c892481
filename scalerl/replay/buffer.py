"""Replay buffers of prompt groups for the off-policy path: uniform, or proportional prioritised
experience replay (PER, Schaul et al. 2016, "Prioritized Experience Replay", §3.3 and §3.4).

Proportional PER stores a priority p_i = (|δ_i| + ε)^α per group (δ_i: the learning signal the
trainer chooses, e.g. a TD error or an advantage magnitude) and samples group i with probability

    P(i) = p_i / Σ_k p_k                                                    (Schaul et al. eq. 1)

which over-samples some groups, so the update is corrected with importance-sampling weights

    w_i = (N · P(i))^(-β) / max_j w_j                                        (§3.4)

N is the number of groups held and the max runs over the sampled batch (Schaul et al.'s Algorithm 1
as Dopamine implements it), so the largest weight in a batch is 1 and weights only scale updates
down. Normalising by the buffer-wide max instead (OpenAI baselines) lets one group with the floor
priority ε^α shrink every weight towards zero. β is annealed linearly from `beta` to `beta_final`
(1 corrects the bias fully) over `beta_steps` calls of `sample`. α = 0 is uniform sampling.

The buffer is a ring: when full, each new group overwrites the oldest (`evicted` counts them), and
the overwritten group's priority goes with it. New groups without a priority get the largest
priority among the groups still held (1.0 when there are none), so each is likely drawn soon. All
sampling draws from the buffer's own seeded numpy Generator, part of its saved state: a restored
buffer draws what the original would have drawn. `save` / `load` persist it (see storage.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from scalerl.errors import ScaleRLError
from scalerl.replay import storage
from scalerl.replay.group import ReplayGroup, check_group, owned_copy
from scalerl.replay.sum_tree import SumTree

KINDS = ("uniform", "prioritized")


@dataclass
class ReplaySample:
    """A batch drawn with replacement: `groups[k]` is the group in slot `indices[k]`, to be weighted by
    `weights[k]`. The groups are the buffer's own objects: read them, do not modify them in place."""

    groups: list[ReplayGroup]
    indices: np.ndarray  # (n,) int64 slots, for `update_priorities`
    weights: np.ndarray  # (n,) float64 importance weights w_i (all 1.0 for uniform)
    beta: float  # the β the weights were computed with


def importance_weights(probabilities: np.ndarray, size: int, beta: float) -> np.ndarray:
    """w_i = (N · P(i))^(-β) / max_j w_j over the batch (Schaul et al. 2016, §3.4); N = `size`."""
    w = (size * np.asarray(probabilities, dtype=np.float64)) ** (-beta)  # (n,)
    return w / w.max()


@dataclass
class _Saved:
    """Where the buffer was last committed: the folder, the save's generation and its chunk entries."""

    folder: Path
    generation: int
    chunks: dict[int, dict]


class ReplayBuffer:
    """A ring of `capacity` groups, sampled uniformly or by priority (see the module docstring)."""

    def __init__(self, capacity: int, kind: Literal["uniform", "prioritized"] = "uniform", alpha: float = 0.6,
                 beta: float = 0.4, beta_final: float = 1.0, beta_steps: int = 1000, eps: float = 1e-6,
                 seed: int = 0, chunk_size: int = 256):
        if capacity < 1 or chunk_size < 1 or beta_steps < 1:
            raise ValueError(f"capacity, chunk_size and beta_steps must be at least 1, "
                             f"got {capacity}, {chunk_size}, {beta_steps}")
        if kind not in KINDS:
            raise ValueError(f"replay kind must be one of {KINDS}, got {kind!r}")
        if alpha < 0 or eps < 0 or not 0 <= beta <= 1 or not 0 <= beta_final <= 1:
            raise ValueError(f"need alpha >= 0, eps >= 0 and betas in [0, 1], got {alpha}, {eps}, {beta}, {beta_final}")
        self.capacity, self.kind, self.chunk_size, self.seed = capacity, kind, chunk_size, seed
        self.alpha, self.beta, self.beta_final, self.beta_steps, self.eps = alpha, beta, beta_final, beta_steps, eps
        self.position = 0  # the slot the next group goes to
        self.size = 0  # groups held
        self.evicted = 0  # groups overwritten since the buffer was created
        self.samples_drawn = 0  # calls of `sample`: the position of the β schedule
        self._groups: list[ReplayGroup | None] = [None] * capacity
        self._tree = SumTree(capacity)  # leaf i: p_i = (|δ_i| + ε)^α of slot i, 0 when empty
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._dirty: set[int] = set()  # chunks that received groups since the last save
        self._saved: _Saved | None = None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, slot: int) -> ReplayGroup:
        if not 0 <= slot < self.size:
            raise IndexError(f"replay slot {slot} is not in [0, {self.size})")
        return self._groups[slot]

    def beta_at(self, t: int) -> float:
        """β_t = beta + (beta_final − beta) · min(1, t / beta_steps): linear annealing over sample calls."""
        return self.beta + (self.beta_final - self.beta) * min(1.0, t / self.beta_steps)

    def _stored(self, priorities) -> np.ndarray:
        return (np.abs(np.asarray(priorities, dtype=np.float64)) + self.eps) ** self.alpha  # p_i = (|δ_i| + ε)^α

    def add(self, groups: list[ReplayGroup], priorities: list[float] | None = None) -> np.ndarray:
        """Append groups (copied), overwriting the oldest when full; returns the slots they went to.

        `priorities` are raw |δ| (stored as (|δ| + ε)^α); None gives each the largest stored priority of
        the groups not being overwritten (1.0 when there are none)."""
        if priorities is not None and len(priorities) != len(groups):
            raise ValueError(f"add got {len(groups)} groups and {len(priorities)} priorities")
        for group in groups:
            check_group(group)  # all of them before any is stored
        slots = (self.position + np.arange(len(groups), dtype=np.int64)) % self.capacity  # (k,)
        for slot, group in zip(slots.tolist(), groups):
            self._groups[slot] = owned_copy(group)
        self._dirty.update((slots // self.chunk_size).tolist())
        self.evicted += max(0, self.size + len(groups) - self.capacity)
        self.size = min(self.capacity, self.size + len(groups))
        self.position = (self.position + len(groups)) % self.capacity
        if priorities is None:
            self._tree.update(slots, 0.0)  # the overwritten groups' priorities leave with them
            self._tree.update(slots, self._tree.max_priority or 1.0)
        else:
            self._tree.update(slots, self._stored(priorities))
        return slots

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set p_i = (|δ_i| + ε)^α for slots `indices` (a repeated slot takes its last δ). Call it before the
        next `add`: a slot overwritten in between holds another group, which would receive the priority."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.size):
            raise IndexError(f"replay slots must be in [0, {self.size}), got {indices.min()}..{indices.max()}")
        self._tree.update(indices, self._stored(priorities))

    def priorities(self, indices: np.ndarray) -> np.ndarray:
        """The stored priorities p_i = (|δ_i| + ε)^α of slots `indices` (float64)."""
        return self._tree.priorities(indices)

    def sample(self, n: int) -> ReplaySample:
        """Draw n groups with replacement: uniformly, or with P(i) = p_i / Σ_k p_k and weights w_i."""
        if self.size == 0 or n < 1:
            raise ValueError(f"cannot sample {n} groups from a replay buffer holding {self.size}")
        beta = self.beta_at(self.samples_drawn)
        self.samples_drawn += 1
        if self.kind == "uniform":
            indices = self._rng.integers(0, self.size, size=n, dtype=np.int64)
            weights = np.ones(n, dtype=np.float64)
        else:
            total = self._tree.total()
            indices = self._tree.find(self._rng.uniform(0.0, total, size=n))  # (n,)
            weights = importance_weights(self._tree.priorities(indices) / total, self.size, beta)
        return ReplaySample([self._groups[i] for i in indices.tolist()], indices, weights, beta)

    def _meta(self) -> dict:
        return {
            "buffer": {"capacity": self.capacity, "kind": self.kind, "alpha": self.alpha, "beta": self.beta,
                       "beta_final": self.beta_final, "beta_steps": self.beta_steps, "eps": self.eps,
                       "seed": self.seed, "chunk_size": self.chunk_size},
            "state": {"position": self.position, "size": self.size, "evicted": self.evicted,
                      "samples_drawn": self.samples_drawn, "rng": self._rng.bit_generator.state},
        }

    def save(self, folder: Path) -> list[Path]:
        """Commit the buffer to `folder` (see storage.py for the layout and the crash rule); returns the
        files written. Into the folder of the last save or load, only chunks that got groups since are written."""
        folder = Path(folder)
        saved = self._saved
        incremental = (saved is not None and saved.folder == folder.resolve()
                       and storage.committed_generation(folder) == saved.generation)
        kept = saved.chunks if incremental else {}
        n_chunks = -(-self.size // self.chunk_size)
        write = {c: self._groups[c * self.chunk_size:min((c + 1) * self.chunk_size, self.size)]
                 for c in range(n_chunks) if c in self._dirty or c not in kept}
        generation = max(storage.newest_generation(folder), saved.generation if saved else 0) + 1
        chunks, written = storage.write_folder(
            folder, meta=self._meta(), generation=generation, write=write,
            kept={c: kept[c] for c in range(n_chunks) if c not in write}, priorities=self._tree.leaves())
        self._saved = _Saved(folder.resolve(), generation, chunks)
        self._dirty.clear()
        return written

    @classmethod
    def load(cls, folder: Path) -> ReplayBuffer:
        """The buffer committed in `folder`, with its RNG, β position and priorities; ScaleRLError naming
        the file when something is missing or damaged."""
        folder = Path(folder)
        meta, groups, leaves = storage.read_folder(folder)
        try:
            buffer = cls(**meta["buffer"])
            state = meta["state"]
            buffer.position, buffer.size = int(state["position"]), int(state["size"])
            buffer.evicted, buffer.samples_drawn = int(state["evicted"]), int(state["samples_drawn"])
            buffer._rng.bit_generator.state = state["rng"]
            full = buffer.size == buffer.capacity
            if not (0 <= buffer.position < buffer.capacity and (full or buffer.position == buffer.size)):
                raise ValueError(f"write position {buffer.position} does not fit size {buffer.size}")
        except (KeyError, TypeError, ValueError) as err:
            raise ScaleRLError(f"replay buffer file {folder / storage.META} is damaged: {type(err).__name__}: {err}; "
                               f"restore {folder} from a backup or delete it to start with an empty buffer") from err
        buffer._groups[:len(groups)] = groups
        buffer._tree = SumTree.from_leaves(leaves)
        buffer._saved = _Saved(folder.resolve(), int(meta["generation"]), {e["index"]: e for e in meta["chunks"]})
        return buffer
