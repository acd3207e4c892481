"""The `RolloutSide` interface (scalerl/rollout/base.py), run against every implementation the training job
can be given: the in-process `RolloutWorker`, an `AsyncRollout` whose producer is a spawned process, and one
whose producer is a Ray actor (where Ray is installed). Each must hand out scored batches of the version it
was given, evaluate reproducibly, and resume from its state exactly where it stopped."""

from __future__ import annotations

import typing

import pytest
import torch

from conftest import tiny_overrides
from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.rollout.async_rollout import AsyncRollout
from scalerl.rollout.base import RolloutSide
from scalerl.rollout.worker import RolloutWorker
from scalerl.trainer import loop
from scalerl.trainer.step import publish_weights
from scalerl.types import ScoredBatch

SETS = {"eval.max_tasks": 6, "env.args": {"max_operand": 3, "num_eval": 6}}  # 10 training prompts, 4 a step: reshuffles
ASYNC = {"rollout.mode": "async", "algorithm.tis_cap": 2.0, "rollout.producer_threads": 1, "rollout.max_staleness": 1}


def _ray_producer():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'scalerl[ray]'")
    from ray.util.placement_group import placement_group

    from scalerl.rollout.ray_producer import RayProducer

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    group = placement_group([{"CPU": 1}])
    ray.get(group.ready(), timeout=120)
    return RayProducer(group, 0, cpus=1, gpus=0, host="127.0.0.1")


KINDS = {
    "in-process": ({}, None),
    "spawned-producer": (ASYNC, None),
    "ray-producer": (ASYNC, _ray_producer),
}


def _roles(runs, kind, name):
    extra, producer = KINDS[kind]
    config = load_config(overrides=tiny_overrides(runs, name, **{**SETS, **extra}))
    return loop.build_roles(config, DistContext(), resume=False, producer=producer() if producer else None)[:2]


def _members(protocol) -> set[str]:
    return {n for n in [*vars(protocol), *typing.get_type_hints(protocol)] if not n.startswith("_")}


@pytest.mark.parametrize("kind", [pytest.param(k, marks=[pytest.mark.slow, pytest.mark.xdist_group("ray")] if k == "ray-producer" else []) for k in KINDS])
def test_every_rollout_side_keeps_the_contract(runs, kind):
    rollout, learner = _roles(runs, kind, "a")
    lag = ASYNC["rollout.max_staleness"] if kind != "in-process" else 0
    assert isinstance(rollout, RolloutWorker if kind == "in-process" else AsyncRollout)
    assert _members(RolloutSide) <= set(dir(rollout))
    try:
        batches = []
        for step in (1, 2, 3):
            batch = rollout.produce(step)
            assert isinstance(batch, ScoredBatch) and len(batch) == 16 and batch.rewards.shape == (16,)
            # sampled by the weights it was last given, or (async) at most rollout.max_staleness versions before them
            assert step - 1 - lag <= batch.policy_version <= step - 1
            learner.learn(batch, step)
            publish_weights(rollout, learner)
            batches.append(batch)
        first = rollout.evaluate(3)
        assert 0.0 <= first <= 1.0 and rollout.evaluate(3) == first  # greedy on the newest weights: reproducible
        state = rollout.state_dict()
        after = [rollout.produce(4).prompts]
    finally:
        rollout.close()
    # a new side restored from that state (as a resume does: load_state_dict, then the weights) goes on exactly there
    again, learner2 = _roles(runs, kind, "b")
    try:
        learner2.checkpoint_parts().model.load_state_dict(learner.weights())
        learner2.load_state_dict(learner.state_dict())
        again.load_state_dict(state)
        publish_weights(again, learner2)
        batch = again.produce(4)
        assert [batch.prompts] == after and batch.policy_version == 3
        assert again.evaluate(3) == first
    finally:
        again.close()


def test_the_in_process_side_saves_and_loads_its_replay_files(runs, tmp_path):
    """save_files / load_files carry the replay buffer: a restored side mixes in the same groups."""
    extra = {"replay.kind": "uniform", "replay.groups_per_step": 1, "algorithm.tis_cap": 2.0}
    config = load_config(overrides=tiny_overrides(runs, "replay", **{**SETS, **extra}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    for step in (1, 2):
        learner.learn(rollout.produce(step), step)
    rollout.save_files(tmp_path, 0)
    state = rollout.state_dict()
    expected = rollout.produce(3)
    config = load_config(overrides=tiny_overrides(runs, "replay2", **{**SETS, **extra}))
    again, learner2, _ = loop.build_roles(config, DistContext(), resume=False)
    learner2.checkpoint_parts().model.load_state_dict(learner.weights())
    again.load_state_dict(state)
    again.load_files(tmp_path, 0)
    got = again.produce(3)
    assert got.prompts == expected.prompts and torch.equal(got.rewards, expected.rewards)
