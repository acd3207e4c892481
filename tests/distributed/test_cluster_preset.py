"""cluster_preset: the source's table resolved into the batch plan and the sync strategy, shown by --dry-run."""

from __future__ import annotations

import pytest

from conftest import run_cli
from scalerl.config import load_config


@pytest.mark.parametrize("world, local, preset, prompts, micro, strategy", [
    # 1 node x 2 ranks: 2M tokens / (2 ranks x 8 completions x 8 new tokens) = 15625 prompts, 8 micro-batches per update
    (2, 2, "1-4", 15625, 15625, "ddp"),
    # 6 nodes x 2 ranks: 1M / (12 x 8 x 8) = 1302.08 -> 1304 (a multiple of 2 so that 16 micro-batches divide it)
    (12, 2, "4-8", 1304, 652, "dynamic"),
    # 16 nodes x 1 rank: 0.5M / (16 x 8 x 8) = 488.3 -> 492 (a multiple of 4: 32 micro-batches)
    (16, 1, "8+", 492, 123, "dynamic"),
])
def test_auto_picks_the_row_of_the_node_count(monkeypatch, world, local, preset, prompts, micro, strategy):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    auto, named = (load_config(overrides=[f"cluster_preset={p}"]) for p in ("auto", preset))
    for config in (auto, named):
        assert config.rollout.prompts_per_step == prompts and config.train.micro_batch_size == micro
        assert config.parallel.strategy == strategy
        assert config.plan.micro_per_mini == {"1-4": 8, "4-8": 16, "8+": 32}[preset]
        tokens = world * config.batch_size * config.rollout.max_new_tokens
        assert {"1-4": 2e6, "4-8": 1e6, "8+": 5e5}[preset] <= tokens < 1.01 * {"1-4": 2e6, "4-8": 1e6, "8+": 5e5}[preset]


def test_your_own_keys_win_and_dry_run_shows_the_plan():
    config = load_config(overrides=["cluster_preset=8+", "parallel.strategy=fsdp2", "rollout.prompts_per_step=64"])
    assert config.parallel.strategy == "fsdp2" and config.rollout.prompts_per_step == 64
    shown = run_cli("-m", "scalerl.cli.main", "train", "--dry-run", "--nproc", "2", "--set", "cluster_preset=auto")
    assert shown.returncode == 0, shown.stderr
    assert "prompts_per_step: 15625" in shown.stdout and "micro_batch_size: 15625" in shown.stdout  # 2 ranks of one node
