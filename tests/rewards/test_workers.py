"""The reward worker pool: same numbers as in-process for the arithmetic environment, jobs running
concurrently, a dead worker contained (counted, pool rebuilt), scorer exceptions propagated.

No torch import here: worker processes import this module to find the scorers below, and should
start fast.
"""

from __future__ import annotations

import os
import time

import pytest

from scalerl.envs.arithmetic import ArithmeticConfig, ArithmeticEnv
from scalerl.types import Completion
from scalerl.errors import ScaleRLError
from scalerl.rewards.workers import RewardPool, chunk_bounds


def pid_after(seconds: float) -> float:
    time.sleep(seconds)
    return float(os.getpid())


def die_on(item: str, delay: float = 0.0) -> float:
    """1.0 for most items; the worker process exits abruptly on 'die' (after `delay` seconds)."""
    if item == "die":
        time.sleep(delay)
        os._exit(3)
    return 1.0 if item == "ok" else 0.0


def fails_on(item: str) -> float:
    if item == "bad":
        raise ValueError("cannot score 'bad'")
    return 2.0


def _env_items(n: int = 24):
    env = ArithmeticEnv(ArithmeticConfig(max_operand=9, num_eval=10))
    tasks = env.train_tasks()[:n]
    # every third completion is right; the others are off by one or unfinished
    items = [(t, Completion(text=t.answer if i % 3 == 0 else str(int(t.answer) + 1), token_ids=(), finished=i % 4 != 1))
             for i, t in enumerate(tasks)]
    return env, items


def test_chunk_bounds():
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]  # sizes 3 3 2 2
    assert chunk_bounds(2, 8) == [(0, 1), (1, 2)]  # never an empty chunk
    assert chunk_bounds(0, 4) == []


def test_arithmetic_env_scores_match_in_process():
    env, items = _env_items()
    expected = [env.score(*item) for item in items]
    assert 0 < sum(expected) < len(items)  # a mix of right and wrong
    with RewardPool(0, {"env": env.score}) as inline:
        assert inline.score_all({"env": items}) == {"env": expected}
    with RewardPool(2, {"env": env.score}) as pool:  # the bound method pickles the environment
        assert len(pool.start()) == 2
        assert pool.score_all({"env": items}) == {"env": expected}
        assert pool.map_scores(env.score, items) == expected  # an unregistered callable travels with each chunk
        assert pool.pop_metrics() == {"reward_failed_items": 0.0, "reward_pool_restarts": 0.0, "reward_hung_workers": 0.0}


def test_jobs_run_concurrently_on_different_workers():
    with RewardPool(2, {"a": pid_after, "b": pid_after}) as pool:
        pool.start()
        start = time.perf_counter()
        out = pool.score_all({"a": [(0.5,)], "b": [(0.5,)]})
        wall = time.perf_counter() - start
    # one item each: serially 1.0 s; side by side 0.5 s plus overhead
    assert out["a"][0] != out["b"][0] and os.getpid() not in (out["a"][0], out["b"][0])
    assert wall < 0.9, wall


def test_a_dead_worker_is_counted_and_the_pool_rebuilt():
    with RewardPool(2, {"die": die_on}, chunks_per_worker=1, fail_value=-1.0) as pool:
        pool.start()
        # two chunks: ["ok", "no", "ok"] finishes at once; ["die", "ok", "ok"] kills its worker after 0.5 s,
        # which breaks the pool: that chunk's 3 items get fail_value, the finished chunk keeps its scores
        out = pool.map_scores("die", [("ok",), ("no",), ("ok",), ("die", 0.5), ("ok",), ("ok",)])
        assert out == [1.0, 0.0, 1.0, -1.0, -1.0, -1.0]
        assert pool.restarts == 1
        assert pool.pop_metrics() == {"reward_failed_items": 3.0, "reward_pool_restarts": 1.0, "reward_hung_workers": 0.0}
        assert pool.map_scores("die", [("ok",), ("no",)] * 3) == [1.0, 0.0] * 3  # the rebuilt pool works
        assert pool.pop_metrics() == {"reward_failed_items": 0.0, "reward_pool_restarts": 0.0, "reward_hung_workers": 0.0}


def test_scorer_exceptions_propagate_in_both_modes():
    for workers in (0, 2):
        with RewardPool(workers, {"f": fails_on}) as pool:
            with pytest.raises(ValueError, match="cannot score 'bad'"):
                pool.map_scores("f", [("x",), ("bad",)])
            assert pool.map_scores("f", [("x",)]) == [2.0] and pool.restarts == 0


def test_unpicklable_scorers_and_unknown_names_are_rejected():
    with pytest.raises(ScaleRLError, match="reward.num_workers"):
        RewardPool(2, {"lam": lambda x: x})
    with RewardPool(0, {"lam": lambda x: x}) as inline:  # in-process needs no pickling
        assert inline.map_scores("lam", [(3,)]) == [3.0]
        with pytest.raises(KeyError, match="nope"):
            inline.score_all({"nope": []})
