"""PromptStream: order, epoch wrap-around, resuming, and sharding across ranks."""

import random

import pytest

from scalerl.types import Task
from scalerl.rollout.prompts import PromptStream

POOL = [Task(prompt=f"p{i}", answer=str(i)) for i in range(10)]


def _ids(batch):
    return [int(t.answer) for t in batch]


def test_no_shuffle_follows_pool_order_and_wraps():
    stream = PromptStream(POOL, 4, shuffle=False)
    # 10 tasks, 4 per step: 0-3, 4-7, then 8, 9 and the next pass starts again at 0.
    assert _ids(stream.next_batch()) == [0, 1, 2, 3]
    assert _ids(stream.next_batch()) == [4, 5, 6, 7]
    assert _ids(stream.next_batch()) == [8, 9, 0, 1]
    assert stream.state_dict() == {"epoch": 1, "index": 2, "retired": []}
    assert _ids(stream.next_batch()) == [2, 3, 4, 5]


def test_shuffle_is_a_seeded_permutation_per_pass():
    stream = PromptStream(POOL, 5, seed=3)
    first_pass = _ids(stream.next_batch()) + _ids(stream.next_batch())
    second_pass = _ids(stream.next_batch()) + _ids(stream.next_batch())
    # Each pass is a permutation of the whole pool...
    assert sorted(first_pass) == list(range(10)) and sorted(second_pass) == list(range(10))
    # ...namely the one of random.Random(seed * 100_003 + pass) (the documented recipe).
    for epoch, got in enumerate([first_pass, second_pass]):
        order = list(range(10))
        random.Random(3 * 100_003 + epoch).shuffle(order)
        assert got == order
    assert first_pass != second_pass  # reshuffled between passes
    assert first_pass != list(range(10))


def test_shuffle_deterministic_across_epoch_boundary():
    def take(seed, steps):
        s = PromptStream(POOL, 4, seed=seed)
        return [_ids(s.next_batch()) for _ in range(steps)]

    a = take(0, 6)  # 24 tasks: 2.4 passes, the 3rd batch straddles the boundary
    assert a == take(0, 6)
    assert a != take(1, 6)
    flat = [i for b in a for i in b]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))


@pytest.mark.parametrize("shuffle", [True, False])
def test_state_dict_resumes_exact_sequence(shuffle):
    stream = PromptStream(POOL, 3, seed=7, shuffle=shuffle)
    for _ in range(4):  # 12 tasks in: pass 1, index 2
        stream.next_batch()
    state = stream.state_dict()
    assert state == {"epoch": 1, "index": 2, "retired": []}
    expected = [_ids(stream.next_batch()) for _ in range(5)]

    resumed = PromptStream(POOL, 3, seed=7, shuffle=shuffle)
    resumed.load_state_dict(dict(state))
    assert [_ids(resumed.next_batch()) for _ in range(5)] == expected


def test_resume_at_end_of_pass():
    stream = PromptStream(POOL, 5, seed=1)
    stream.next_batch(), stream.next_batch()
    state = stream.state_dict()
    assert state == {"epoch": 0, "index": 10, "retired": []}  # the wrap happens on the next draw
    expected = _ids(stream.next_batch())
    resumed = PromptStream(POOL, 5, seed=1)
    resumed.load_state_dict(state)
    assert _ids(resumed.next_batch()) == expected


@pytest.mark.parametrize("shuffle", [True, False])
def test_ranks_get_disjoint_slices_of_the_world_batch(shuffle):
    pool = [Task(prompt=f"p{i}", answer=str(i)) for i in range(20)]
    # World 2 with 4 per rank consumes 8 tasks per step; a world-1 stream with 8 per rank (same
    # seed) consumes the same 8, so rank 0 gets its first half and rank 1 its second half.
    r0 = PromptStream(pool, 4, rank=0, world_size=2, seed=5, shuffle=shuffle)
    r1 = PromptStream(pool, 4, rank=1, world_size=2, seed=5, shuffle=shuffle)
    single = PromptStream(pool, 8, seed=5, shuffle=shuffle)
    seen = []
    for step in range(4):  # 32 tasks: crosses the 20-task pass boundary in step 2
        a, b, whole = _ids(r0.next_batch()), _ids(r1.next_batch()), _ids(single.next_batch())
        assert len(a) == len(b) == 4
        assert a + b == whole
        if step < 2:  # within the first pass no task repeats, so the ranks never share a prompt
            assert not set(a) & set(b)
            seen += a + b
    assert len(set(seen)) == 16  # 2 steps x 8 distinct tasks
    assert r0.state_dict() == r1.state_dict() == single.state_dict() == {"epoch": 1, "index": 12, "retired": []}


def test_empty_pool_raises():
    with pytest.raises(ValueError, match="empty"):
        PromptStream([], 4)


def test_retired_prompts_are_skipped_and_survive_a_resume():
    from scalerl.types import Task
    from scalerl.errors import ScaleRLError

    tasks = [Task(prompt=str(i)) for i in range(6)]
    stream = PromptStream(tasks, 2, shuffle=False)
    stream.retire(["1", "2"])
    assert [t.prompt for t in stream.next_batch()] == ["0", "3"]
    copy = PromptStream(tasks, 2, shuffle=False)
    copy.load_state_dict(stream.state_dict())
    assert [t.prompt for t in copy.next_batch()] == [t.prompt for t in stream.next_batch()] == ["4", "5"]
    stream.retire([t.prompt for t in tasks])
    with pytest.raises(ScaleRLError, match="every training prompt has been retired"):
        stream.next_batch()
