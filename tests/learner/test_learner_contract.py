"""The `LearnerSide` interface (scalerl/learner/learner.py), run against the learner as each algorithm family
builds it (GRPO; PPO with a critic model and with a value head; CISPO): what the training job and the health
guard may ask of it, and the numbers each call must change."""

from __future__ import annotations

import copy
import math
import typing

import pytest
import torch

from conftest import tiny_overrides
from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.learner.learner import LearnerSide, cpu_copy
from scalerl.monitor.events import Event
from scalerl.trainer import loop

KINDS = {
    "grpo": {},
    "cispo": {"algorithm.name": "cispo"},
    "ppo-critic": {"algorithm.name": "ppo"},
    "ppo-head": {"algorithm.name": "ppo", "algorithm.critic": "head"},
}


def _members(protocol) -> set[str]:
    return {n for n in [*vars(protocol), *typing.get_type_hints(protocol)] if not n.startswith("_")}


def _same(a, b) -> bool:
    """Nested optimizer states hold equal tensors."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _copy(weights) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in weights.items()}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_learner_keeps_the_contract(runs, kind):
    config = load_config(overrides=tiny_overrides(runs, kind, **{"algorithm.kl.beta": 0.04, **KINDS[kind]}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    assert _members(LearnerSide) <= set(dir(learner))
    lines = learner.start(fresh=True)
    assert lines and lines[0].startswith("precision")

    before = _copy(learner.weights())
    assert set(before) == set(rollout.sampler.model.state_dict())  # the sampler's names, for a copy on another engine
    stats = learner.learn(rollout.produce(1), 1)
    assert learner.version == 1 and math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"]) and stats["lr"] > 0
    after = _copy(learner.weights())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert learner.end_of_step(1, agree=True, saving=True) == {}  # one process: nothing to agree on, no bytes sent

    # kl_explosion: β up and every later lr down, from the health config's factors; no new weights to publish
    lr = learner.lr()
    event = Event(1, "kl_explosion", "warning", "KL 9.0 above 5.0")
    assert learner.respond(event) is False
    assert learner.lr() == pytest.approx(lr * config.health.kl.lr_factor) and "beta" in event.action
    assert event.values["beta_new"] >= max(event.values["beta_old"] * config.health.kl.beta_factor, config.health.kl.min_beta) - 1e-12

    # nonfinite: back to the restore point, clipping on, a new version to publish
    learner.restore_point(1)
    moments = cpu_copy(learner.optimizer.state_dict())
    learner.learn(rollout.produce(2), 2)
    assert any(not torch.equal(after[k], v) for k, v in learner.weights().items())
    version = learner.version
    event = Event(2, "nonfinite", "critical", "loss is nan")
    assert learner.respond(event) is True
    assert all(torch.equal(after[k], v) for k, v in learner.weights().items())
    assert learner.version == version + 1 and event.values["restored_step"] == 1
    assert learner.state_dict()["max_grad_norm"] == (config.optim.max_grad_norm or 1.0)
    # a second non-finite step before the next restore point restores the same moments: the updates after the
    # first restore must not have reached the snapshot's own tensors
    learner.learn(rollout.produce(2), 2)
    assert learner.respond(Event(2, "nonfinite", "critical", "loss is nan")) is True
    assert _same(learner.optimizer.state_dict()["state"], moments["state"])
    assert all(torch.equal(after[k], v) for k, v in learner.weights().items())
    assert learner.respond(Event(2, "plateau", "info", "flat")) is False  # not the learner's to answer

    # its checkpoint parts and state: a second learner loaded from them continues identically
    parts = learner.checkpoint_parts()
    assert parts.model is rollout.sampler.model and set(parts.modules) == ({"critic"} if kind.startswith("ppo") else set())
    batch = rollout.produce(3)
    twin_rollout, twin, _ = loop.build_roles(config.model_copy(update={"log": config.log.model_copy(update={"name": kind + "2"})}),
                                             DistContext(), resume=False)
    twin_parts = twin.checkpoint_parts()
    twin_parts.model.load_state_dict(parts.model.state_dict())
    for name, module in parts.modules.items():
        twin_parts.modules[name].load_state_dict(module.state_dict())
    twin_parts.optimizer.load_state_dict(copy.deepcopy(parts.optimizer.state_dict()))  # its own moments, as DCP loads them
    twin.load_state_dict(learner.state_dict())
    assert twin.version == learner.version
    learner.learn(batch, 3)
    twin.learn(batch, 3)
    assert all(torch.equal(a, b) for a, b in zip(learner.weights().values(), twin.weights().values()))
    rollout.close()
    twin_rollout.close()
    learner.close()
    twin.close()
