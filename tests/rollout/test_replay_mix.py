"""Replay mixed into a step's batch (scalerl/rollout/replay_mix.py) and its weights in the learner's advantages."""

from __future__ import annotations

import pytest
import torch

from scalerl.replay.buffer import ReplayBuffer
from scalerl.rollout.replay_mix import ReplayMixer, batch_groups
from scalerl.types import Rollout, ScoredBatch

G, PAD = 2, 0


def _batch(version: int, rewards: list[float], width: int, prompt_len: int, first_token: int) -> ScoredBatch:
    """len(rewards) / G groups; prompt i is `prompt_len` tokens (left-padded by one), completions `width` wide."""
    B = len(rewards)
    prompt_ids = torch.full((B, prompt_len + 1), PAD)
    prompt_ids[:, 1:] = torch.arange(first_token, first_token + prompt_len)
    prompt_mask = torch.ones((B, prompt_len + 1), dtype=torch.long)
    prompt_mask[:, 0] = 0
    completion_ids = torch.arange(B * width).reshape(B, width) + 100 * version
    rollout = Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                      completion_mask=torch.ones((B, width), dtype=torch.long), sampler_logprobs=-torch.rand(B, width),
                      truncated=torch.zeros(B, dtype=torch.bool), group_ids=torch.arange(B) // G)
    return ScoredBatch(rollout, torch.tensor(rewards), torch.tensor(rewards), policy_version=version, prompts=[f"p{version}"] * B,
                       completions=["c"] * B, generated_tokens=B * width)


def test_replayed_groups_take_the_places_of_the_flattest_fresh_groups():
    mixer = ReplayMixer(ReplayBuffer(100, kind="prioritized", alpha=1.0, beta=0.5, seed=0), groups_per_step=1, group_size=G, pad_id=PAD)
    first = mixer.mix(_batch(0, [0.0, 1.0, 1.0, 1.0], width=3, prompt_len=2, first_token=5))  # spreads 0.71, 0
    assert len(first) == 4 and torch.equal(first.row_weights, torch.ones(4)) and first.metrics["replay/groups"] == 0
    assert len(mixer.buffer) == 2
    mixed = mixer.mix(_batch(3, [1.0, 1.0, 0.0, 1.0, 1.0, 1.0], width=5, prompt_len=3, first_token=7))
    # version 3's flat groups are 0 and 2 (spread 0); of the ties the later one, group 2, is displaced
    assert len(mixed) == 6 and mixed.metrics["replay/displaced_groups"] == 1
    assert mixed.rewards[:4].tolist() == [1.0, 1.0, 0.0, 1.0]  # fresh groups 0 and 1, in order
    # the replayed group is version 0's group 0 (the only one with a spread: group 1's priority is eps^1)
    assert mixed.policy_version == 0 and mixed.rewards[4:].tolist() == [0.0, 1.0]
    replayed = mixed.rollout.select(slice(4, 6))
    assert torch.equal(replayed.completion_ids[:, :3], torch.arange(6).reshape(2, 3)) and (replayed.completion_mask[:, 3:] == 0).all()
    assert torch.equal(replayed.prompt_ids[:, -2:], torch.tensor([[5, 6], [5, 6]])) and (replayed.prompt_mask[:, :-2] == 0).all()
    # PER's weight of the draw on the replayed rows, 1 on the fresh ones; the buffer now holds all five groups
    assert mixed.row_weights[:4].tolist() == [1.0] * 4 and mixed.row_weights[4] == mixed.row_weights[5] == 1.0  # max-normalised batch of 1
    assert len(mixer.buffer) == 5 and mixed.rollout.group_ids.tolist() == [0, 0, 1, 1, 2, 2]


def test_batch_groups_are_unpadded_prompts_and_the_rows_as_sampled():
    groups = batch_groups(_batch(2, [0.0, 1.0], width=3, prompt_len=2, first_token=9), G)
    assert len(groups) == 1 and groups[0].prompt_ids.tolist() == [9, 10] and groups[0].policy_version == 2


def test_row_weights_scale_the_advantages(runs):
    from conftest import tiny_overrides
    from scalerl.config import load_config
    from scalerl.distributed.context import DistContext
    from scalerl.trainer import loop

    config = load_config(overrides=tiny_overrides(runs, "w", **{"replay.kind": "uniform", "algorithm.tis_cap": 2.0}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    batch = rollout.produce(1)
    plain = learner.targets(batch, 0.0, need_old=True).advantages
    batch.row_weights = torch.linspace(0.1, 1.0, len(batch))
    weighted = learner.targets(batch, 0.0, need_old=True).advantages
    assert torch.allclose(weighted, plain * batch.row_weights)
    assert plain.abs().sum() > 0


def test_replay_needs_an_off_policy_correction():
    from scalerl.config import load_config
    from scalerl.errors import ScaleRLError

    with pytest.raises(ScaleRLError, match="replay needs an off-policy correction"):
        load_config(overrides={"replay.kind": "uniform"})
