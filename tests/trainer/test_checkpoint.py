"""Checkpoints: atomic saves, rotation, and resuming to exactly the same run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, run_cli, tiny_overrides
from scalerl.config import load_config
from scalerl.jsonl import read_metrics
from scalerl.trainer import checkpoint as ckpt
from scalerl.trainer import loop

TIMING = {"tokens_per_s", "step_time_s", "eval_time_s"}
# Every moving part of the state: several epochs and micro-batches (old log-probs), a reference
# model with a KL penalty, a decaying LR with warm-up, and a shuffled pool crossing passes.
STATEFUL = {"algorithm.kl.beta": 0.05, "train.epochs": 2, "train.mini_batch_size": 8, "train.micro_batch_size": 4,
            "optim.schedule": "linear", "optim.warmup_steps": 2, "checkpoint.every": 2, "checkpoint.keep_last": 2}


def _without_timing(rows):
    """Drop wall-clock figures: step times and the live time estimate (`time/*`)."""
    return [{k: v for k, v in row.items() if k not in TIMING and not k.startswith("time/")} for row in rows]


def _train(runs, name, resume=False, **extra):
    return loop.train(load_config(overrides=tiny_overrides(runs, name, **{**STATEFUL, **extra})), resume=resume)


VARIANTS = {
    "grpo": {},
    # PPO's critic weights and its optimizer group travel in the checkpoint too
    "ppo": {"algorithm.name": "ppo", "algorithm.kl.in_reward": True},
    # retired prompts and the adaptive β controller are state as well
    "scalerl-adaptive": {"preset": "scalerl", "algorithm.retire_pass_rate": 0.25, "algorithm.kl.schedule": "adaptive",
                         "algorithm.kl.target_kl": 1e-4, "algorithm.kl.horizon": 50},
    # LoRA: the checkpoint holds the adapters and their moments only; the KL runs on the base (adapters off)
    "lora": {"model.lora.r": 4, "optim.lr": 1e-3},
    # a prioritised replay buffer (inside each checkpoint) draws on after the resume as it would have
    "replay": {"replay.kind": "prioritized", "algorithm.tis_cap": 2.0, "replay.groups_per_step": 2},
    # the SFT anchor's draws and EWC's anchors and Fisher (in the DCP shards) carry over too
    # fp16 compute: the loss scale and its count of clean updates (LearnerState) carry over
    "fp16": {"precision.mode": "standard", "precision.compute": "fp16"},
    # optim.offload: AdamW's host-side states go through DCP's optimizer state dict as a plain AdamW's
    "offload": {"optim.offload": True},
    "forgetting": {"forgetting.data": str(ROOT / "tests" / "trainer" / "data" / "addition_anchor.jsonl"), "forgetting.ewc": True,
                   "forgetting.ewc_lambda": 10.0},
}
WEIGHT_FILES = {"grpo": ["model.safetensors"], "ppo": ["model.safetensors", "critic.safetensors"], "scalerl-adaptive": ["model.safetensors"],
                "lora": ["adapter_model.safetensors"], "forgetting": ["model.safetensors"],
                "replay": ["model.safetensors"], "fp16": ["model.safetensors"], "offload": ["model.safetensors"]}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_stopped_and_resumed_run_equals_uninterrupted_run_bitwise(runs, monkeypatch, variant):
    extra = VARIANTS[variant]
    _train(runs, "straight", **extra)

    real_step, calls = loop.train_step, {"n": 0}

    def crash_at_step_5(rollout, learner, step, ctx):
        calls["n"] += 1
        if calls["n"] == 5:  # after the step-4 checkpoint, mid-way to the next
            raise KeyboardInterrupt
        return real_step(rollout, learner, step, ctx)

    monkeypatch.setattr(loop, "train_step", crash_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        _train(runs, "resumed", **extra)
    monkeypatch.setattr(loop, "train_step", real_step)
    assert [p.name for p in ckpt.complete_checkpoints(runs / "resumed" / "checkpoints")] == ["step_0000002", "step_0000004"]
    _train(runs, "resumed", resume=True, **extra)

    assert _without_timing(read_metrics(runs / "resumed")) == _without_timing(read_metrics(runs / "straight"))
    for name in WEIGHT_FILES[variant]:
        final = f"checkpoints/step_0000006/{name}"
        assert (runs / "resumed" / final).read_bytes() == (runs / "straight" / final).read_bytes()
    if variant == "replay":  # replayed groups were in every batch after the first, and the buffer travelled
        rows = read_metrics(runs / "resumed")
        assert rows[0]["replay/groups"] == 0 and all(r["replay/groups"] == 2 for r in rows[1:]) and rows[-1]["staleness"] > 0
        assert (runs / "resumed" / "checkpoints" / "step_0000006" / "replay_rank0" / "meta.json").is_file()
    if variant == "forgetting":  # both terms were on throughout, the resumed half with the saved Fisher
        assert all(r["ewc/loss"] is not None and r["sft/loss"] > 0 for r in read_metrics(runs / "resumed"))
        assert read_metrics(runs / "resumed")[-1]["ewc/loss"] > 0
    if variant == "scalerl-adaptive":  # the state really moved: prompts were retired and β adapted
        rows = read_metrics(runs / "resumed")
        assert rows[-1]["retired_prompts"] > 0 and rows[-1]["beta"] != rows[0]["beta"]
    # rotation kept the last two complete checkpoints
    assert [p.name for p in ckpt.complete_checkpoints(runs / "resumed" / "checkpoints")] == ["step_0000004", "step_0000006"]


def test_resume_of_an_unknown_run_fails(runs):
    from scalerl.errors import ScaleRLError

    with pytest.raises(ScaleRLError, match="no run to resume"):
        _train(runs, "never-ran", resume=True)


def test_partial_saves_are_ignored_and_removed(tmp_path):
    root = tmp_path / "checkpoints"
    for name, marker in (("step_0000002", True), ("step_0000004", True), ("step_0000006", False), ("step_0000008.tmp", True)):
        (root / name).mkdir(parents=True)
        if marker:
            (root / name / ckpt.MARKER).write_text("x")
    assert ckpt.latest_checkpoint(root).name == "step_0000004"
    removed = sorted(p.name for p in ckpt.remove_partial(root))
    assert removed == ["step_0000006", "step_0000008.tmp"]
    assert sorted(p.name for p in root.iterdir()) == ["step_0000002", "step_0000004"]


# A training subprocess that stops for good inside the save of step 4: after every file is
# written and fsynced, before (or just after) the COMPLETE marker. The parent SIGKILLs it there.
KILLED_DRIVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from scalerl.trainer import checkpoint as ckpt

    flag, where = Path(sys.argv[1]), sys.argv[2]
    real_fsync, calls = ckpt._fsync_tree, {"n": 0}

    def fsync_then_hang(folder):
        real_fsync(folder)
        if folder.name == "step_0000004.tmp":
            calls["n"] += 1
            if (where == "before_marker" and calls["n"] == 1) or (where == "after_marker" and calls["n"] == 2):
                flag.write_text("in save")
                time.sleep(600)

    ckpt._fsync_tree = fsync_then_hang
    from scalerl.cli.main import main
    sys.argv = ["scalerl", "train", *sys.argv[3:]]
    main()
""")


def _cli_args(runs, name):
    overrides = tiny_overrides(runs, name, **STATEFUL)
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["before_marker", "after_marker"])
def test_sigkill_during_a_save_leaves_a_resumable_run(runs, tmp_path, where):
    _train(runs, "straight")
    flag = tmp_path / "flag"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_DRIVER, str(flag), where, *_cli_args(runs, "killed")],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while not flag.exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline, "the training subprocess never reached the save of step 4"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    root = runs / "killed" / "checkpoints"
    assert (root / "step_0000004.tmp").is_dir()  # the interrupted save is there, half done
    assert ckpt.latest_checkpoint(root).name == "step_0000002"
    resumed = run_cli("-m", "scalerl.cli.main", "train", "--resume", *_cli_args(runs, "killed"))
    assert resumed.returncode == 0, resumed.stderr
    assert not (root / "step_0000004.tmp").exists()
    assert _without_timing(read_metrics(runs / "killed")) == _without_timing(read_metrics(runs / "straight"))
    assert json.loads((runs / "killed" / "summary.json").read_text())["pass_rate_after"] == \
        json.loads((runs / "straight" / "summary.json").read_text())["pass_rate_after"]


def test_a_hang_names_the_newest_complete_checkpoint_on_disk(tmp_path):
    """A peer stopped right after a checkpoint's files were complete leaves this rank in the save's closing barrier
    (its own record of the last save not updated): the one-line error still names that intact checkpoint."""
    from scalerl.trainer.bookkeeping import hang_action

    root = tmp_path / "checkpoints"
    assert hang_action(root) == "the run stopped before any checkpoint was written"
    for name, complete in (("step_0000002", True), ("step_0000004", False)):  # a save's folder without its marker: partial
        (root / name).mkdir(parents=True)
        if complete:
            (root / name / ckpt.MARKER).write_text("")
    assert hang_action(root) == f"the run stopped; its last checkpoint is {root / 'step_0000002'} (continue with --resume)"
