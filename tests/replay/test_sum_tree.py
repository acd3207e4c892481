"""SumTree against a brute-force cumulative sum: totals, `find`, repeated updates, bit-exact rebuilds."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.replay.sum_tree import SumTree


def brute_find(priorities: np.ndarray, values: np.ndarray) -> np.ndarray:
    # the slot i with c_{i-1} <= u < c_i: the first cumulative sum strictly above u
    return np.searchsorted(np.cumsum(priorities), values, side="right")


def test_random_priorities_match_brute_force():
    rng = np.random.default_rng(0)
    for capacity in [1, 2, 3, 7, 8, 100, 257]:
        tree, truth = SumTree(capacity), np.zeros(capacity)
        for _ in range(20):  # batches of updates, repeats and zeros included
            idx = rng.integers(0, capacity, size=rng.integers(1, 2 * capacity + 1))
            prio = rng.exponential(size=idx.size) * (rng.random(idx.size) > 0.2)
            tree.update(idx, prio)
            for i, p in zip(idx, prio):  # the reference applies them in order: the last one wins
                truth[i] = p
            assert tree.total() == pytest.approx(truth.sum(), rel=1e-12)
            assert np.array_equal(tree.priorities(np.arange(capacity)), truth)
            assert tree.max_priority == truth.max()
            if truth.sum() > 0:
                values = rng.uniform(0, tree.total(), size=500)
                assert np.array_equal(tree.find(values), brute_find(truth, values))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=40).filter(lambda p: sum(p) > 0))
def test_find_on_exact_boundaries(priorities):
    # integer priorities: every sum is exact, so a value on a boundary c_i must go to the next positive slot
    p = np.array(priorities, dtype=np.float64)
    tree = SumTree(len(p))
    tree.update(np.arange(len(p)), p)
    assert tree.total() == p.sum()
    values = np.concatenate([np.cumsum(p)[:-1], np.arange(0, p.sum()) + 0.5, [0.0]])
    values = values[values < p.sum()]
    found = tree.find(values)
    assert np.array_equal(found, brute_find(p, values))
    assert np.all(p[found] > 0)


def test_values_past_the_total_land_on_the_last_positive_slot():
    tree = SumTree(6)
    tree.update(np.arange(6), np.array([0.0, 2.0, 0.0, 3.0, 0.0, 0.0]))
    assert tree.find(np.array([5.0, 6.0, 1e9])).tolist() == [3, 3, 3]
    assert tree.find(np.array([0.0, 1.999, 2.0])).tolist() == [1, 1, 3]


def test_rebuilt_from_leaves_is_bit_identical():
    rng = np.random.default_rng(1)
    tree = SumTree(1000)
    for _ in range(50):
        idx = rng.integers(0, 1000, size=64)
        tree.update(idx, rng.random(64) ** 3)
    rebuilt = SumTree.from_leaves(tree.leaves())
    assert rebuilt.total() == tree.total()  # bitwise, not approx
    values = rng.uniform(0, tree.total(), size=10_000)
    assert np.array_equal(rebuilt.find(values), tree.find(values))


def test_rejects_bad_slots_and_priorities():
    tree = SumTree(4)
    with pytest.raises(IndexError):
        tree.update(np.array([4]), np.array([1.0]))
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError):
        tree.update(np.array([0]), np.array([np.nan]))
    with pytest.raises(ValueError):
        SumTree(0)
