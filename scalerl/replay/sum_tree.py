"""A sum tree: the data structure behind proportional prioritised replay (Schaul et al. 2016, App. B.2.1).

Sampling slot i with probability p_i / Σ_j p_j needs the prefix sums of the priorities. A sum tree
keeps them in a complete binary tree over `size` leaves (`size` = the capacity rounded up to a power
of two), stored heap-style in one float64 array of length 2·size: node 1 is the root, node k has
children 2k and 2k+1, leaf i sits at node size + i, and every internal node holds the sum of its
two children, so the root holds the total. Updating a priority rewrites one leaf and its log2(size)
ancestors; finding the leaf whose cumulative range [c_{i-1}, c_i) contains a value u walks from the
root down: go left when u < sum(left child), else subtract that sum and go right. Both run for a
whole batch at once (one numpy operation per tree level).

Internal nodes are always recomputed as left + right, never adjusted by a difference, so the tree
is a pure function of its leaves: rebuilding it from saved leaves gives the same bits, and with them
the same samples.
"""

from __future__ import annotations

import numpy as np


class SumTree:
    """Priorities of `capacity` slots (float64, non-negative, initially 0) with their prefix sums."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"SumTree capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._size = 1 << (capacity - 1).bit_length()  # leaves: capacity rounded up to a power of two
        self._depth = self._size.bit_length() - 1  # levels between the root and the leaves
        self._tree = np.zeros(2 * self._size, dtype=np.float64)  # (2·size,) node 0 unused

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of slots `indices`; where an index repeats, its last priority wins."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        priorities = np.broadcast_to(np.asarray(priorities, dtype=np.float64), indices.shape)
        if indices.size == 0:
            return
        if indices.min() < 0 or indices.max() >= self.capacity:
            raise IndexError(f"SumTree slot out of range [0, {self.capacity}): {indices.min()}..{indices.max()}")
        if not np.all(np.isfinite(priorities)) or priorities.min() < 0:
            raise ValueError("SumTree priorities must be finite and non-negative")
        # keep the last occurrence of each index (numpy leaves repeated fancy assignment unspecified)
        unique, first_from_end = np.unique(indices[::-1], return_index=True)
        nodes = unique + self._size
        self._tree[nodes] = priorities[::-1][first_from_end]
        for _ in range(self._depth):  # all nodes of one array are on the same level
            nodes = np.unique(nodes // 2)
            self._tree[nodes] = self._tree[2 * nodes] + self._tree[2 * nodes + 1]

    def total(self) -> float:
        """Σ_i p_i (the root)."""
        return float(self._tree[1])

    def find(self, prefix_sums: np.ndarray) -> np.ndarray:
        """For each value u, the slot i with c_{i-1} <= u < c_i, where c_i = p_0 + ... + p_i.

        A slot of priority 0 has an empty range and is never returned (unless all are 0): a value
        at or past the total (rounding) lands on the last slot with a positive priority.
        """
        values = np.array(prefix_sums, dtype=np.float64).reshape(-1)  # (B,) a copy: it is consumed
        nodes = np.ones(values.shape, dtype=np.int64)  # (B,) start at the root
        for _ in range(self._depth):
            left = self._tree[2 * nodes]
            right = self._tree[2 * nodes + 1]
            go_right = (values >= left) & (right > 0)
            values = np.where(go_right, values - left, values)
            nodes = 2 * nodes + go_right
        return nodes - self._size

    def priorities(self, indices: np.ndarray) -> np.ndarray:
        """The priorities p_i of slots `indices` (float64)."""
        return self._tree[np.asarray(indices, dtype=np.int64) + self._size]

    @property
    def max_priority(self) -> float:
        """max_i p_i over all slots (0.0 when all are 0)."""
        return float(self._tree[self._size:self._size + self.capacity].max())

    def leaves(self) -> np.ndarray:
        """A copy of all `capacity` priorities, what `from_leaves` rebuilds the tree from."""
        return self._tree[self._size:self._size + self.capacity].copy()

    @classmethod
    def from_leaves(cls, leaves: np.ndarray) -> SumTree:
        """The tree whose slots hold `leaves` (its internal nodes bit-identical to the saved tree's)."""
        tree = cls(len(leaves))
        tree.update(np.arange(len(leaves)), leaves)
        return tree
