"""rollout.mode=async (scalerl/rollout/async_rollout.py, producer.py): a real producer process over
a gloo pair link; the staleness bound by admission, resume without repeated or skipped prompts, learning."""

from __future__ import annotations

import json
import time

import pytest
import torch

from conftest import run_cli, tiny_overrides
from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.distributed.pair_link import check_transport
from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_metrics
from scalerl.trainer import loop
from scalerl.rollout.async_rollout import AsyncRollout, SpawnedProducer
from scalerl.trainer.step import publish_weights

ASYNC = {"rollout.mode": "async", "algorithm.tis_cap": 2.0, "rollout.producer_threads": 1}


def _roles(runs, name, **extra):
    config = load_config(overrides=tiny_overrides(runs, name, **{**ASYNC, **extra}))
    rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
    assert isinstance(rollout, AsyncRollout)
    return rollout, learner


def test_the_producer_waits_instead_of_running_more_than_k_versions_ahead(runs):
    """k = 2: with the learner holding version 0, the producer samples batches 1–3 and then waits; batch 4
    is sampled only after weights of version 1 arrive, and with them (without admission it would be
    sampled with version 0 while the learner sleeps: 3 versions behind when learned at version 3)."""
    rollout, learner = _roles(runs, "admission", **{"rollout.max_staleness": 2})
    try:
        first = rollout.produce(1)
        time.sleep(4.0)  # ample time for the producer to sample every batch admission lets it
        second, third = rollout.produce(2), rollout.produce(3)
        assert [b.policy_version for b in (first, second, third)] == [0, 0, 0]
        rollout.sync_weights(learner.policy.state_dict(), 1)
        fourth = rollout.produce(4)
        assert fourth.policy_version == 1
        assert fourth.metrics["async/admission_wait_s"] > 1.0  # it had been waiting for those weights
    finally:
        rollout.close()


def _prompts(rollout, learner, steps) -> list[list[str]]:
    out = []
    for step in steps:
        batch = rollout.produce(step)
        learner.learn(batch, step)
        publish_weights(rollout, learner)
        out.append(batch.prompts)
    return out


def test_a_resumed_producer_neither_repeats_nor_skips_prompts(runs, capfd):
    """Stopped after step 3 with batches queued ahead (k = 3), resumed from the state the learner kept: steps
    4–6 get exactly the prompts the uninterrupted run's steps 4–6 got (shuffled, several passes)."""
    extra = {"rollout.max_staleness": 3, "env.args": {"max_operand": 3, "num_eval": 6}}  # 10 training prompts, 4 a step
    rollout, learner = _roles(runs, "whole", **extra)
    try:
        whole = _prompts(rollout, learner, range(1, 7))
    finally:
        rollout.close()
    rollout, learner = _roles(runs, "first", **extra)
    try:
        first = _prompts(rollout, learner, range(1, 4))
        time.sleep(2.0)  # the producer samples ahead: batches 4.. are queued when it is stopped
        state = rollout.state_dict()
    finally:
        rollout.close()
    assert "discarded" in capfd.readouterr().err  # the in-flight batches really were thrown away
    rollout, learner = _roles(runs, "second", **extra)
    try:
        rollout.load_state_dict(json.loads(json.dumps(state)))  # what a checkpoint's trainer_state.json holds
        rest = _prompts(rollout, learner, range(4, 7))
    finally:
        rollout.close()
    assert first + rest == whole
    assert len({p for batch in whole for p in batch}) == 10  # 24 prompts drawn from a pool of 10: passes repeat


def test_async_refuses_what_it_cannot_do(runs):
    with pytest.raises(ScaleRLError, match="algorithm.tis_cap"):
        load_config(overrides=tiny_overrides(runs, "x", **{"rollout.mode": "async"}))
    with pytest.raises(ScaleRLError, match="replay"):
        load_config(overrides=tiny_overrides(runs, "x", **{**ASYNC, "replay.kind": "uniform"}))


def test_nccl_weight_transport_says_what_it_needs(runs):
    """rollout.weight_transport=nccl (GPU to GPU) on a machine without CUDA: one line, exit 2, before anything
    loads or the run folder exists; a producer beside the learner needs a GPU after the learner's."""
    proc = run_cli("-m", "scalerl.cli.main", "train", "--steps", "2", "--set", f"log.run_dir={runs}", "--set", "rollout.mode=async",
                   "--set", "algorithm.tis_cap=2", "--set", "rollout.weight_transport=nccl")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "rollout.weight_transport=nccl needs the learner on a CUDA GPU" in lines[0] and "use rollout.weight_transport=gloo" in lines[0]
    assert not runs.exists()
    check_transport("gloo", torch.device("cpu"), "producer")  # gloo runs anywhere
    with pytest.raises(ScaleRLError, match="needs the producer on a CUDA GPU"):
        check_transport("nccl", torch.device("cpu"), "producer")
    config = load_config(overrides=tiny_overrides(runs, "x", **{**ASYNC, "rollout.weight_transport": "nccl"}))
    with pytest.raises(ScaleRLError, match="needs a second GPU"):
        SpawnedProducer().device(config, torch.device("cuda", torch.cuda.device_count() - 1 if torch.cuda.is_available() else 0))
    assert SpawnedProducer().device(load_config(overrides=tiny_overrides(runs, "x", **ASYNC)), torch.device("cpu")) is None


@pytest.mark.slow
def test_scalerl_train_async_learns_and_resumes(runs):
    """`scalerl train` with rollout.mode=async, k = 1, through the CLI: the pass rate rises; a run continued
    from its checkpoint (train.steps raised) goes on from the next step with a fresh producer."""
    common = ["--set", "rollout.mode=async", "--set", "rollout.max_staleness=1", "--set", "algorithm.tis_cap=2",
              "--set", f"log.run_dir={runs}", "--set", "rollout.prompts_per_step=8", "--set", "eval.every=30",
              "--set", "train.threads=1", "--set", "rollout.producer_threads=1", "--set", "log.console=none"]
    proc = run_cli("-m", "scalerl.cli.main", "train", "--steps", "60", "--name", "async", *common)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((runs / "async" / "summary.json").read_text())
    assert summary["pass_rate_after"] > summary["pass_rate_before"] + 0.1, summary
    rows = read_metrics(runs / "async")
    assert max(r["staleness"] for r in rows) == 1 and all(r["staleness"] <= 1 for r in rows)
    assert sum(r["staleness"] for r in rows) > 30  # the producer ran ahead most of the time: they overlapped
    proc = run_cli("-m", "scalerl.cli.main", "train", "--steps", "64", "--name", "async", "--resume", *common)
    assert proc.returncode == 0, proc.stderr
    assert [r["step"] for r in read_metrics(runs / "async")] == list(range(1, 65))
