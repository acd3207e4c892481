"""SIGTERM and SIGINT (what Slurm, Kubernetes and Ctrl-C send) stop a run after the step in
progress with a checkpoint, even with the default `checkpoint.every=0`; the resumed run ends exactly
where an uninterrupted one does. A second signal aborts at once."""

from __future__ import annotations

import signal

import pytest

from faults_common import cli_args, run_cli_train, same_run, start_cli, train, wait_for_step
from scalerl.trainer import checkpoint as ckpt

NO_PERIODIC = {"checkpoint.every": 0, "train.steps": 30, "eval.every": 10}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    runs = tmp_path_factory.mktemp("straight")
    train(runs, "run", **NO_PERIODIC)
    return runs / "run"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_finishes_the_step_checkpoints_and_the_run_resumes_exactly(straight, runs, fault, sig):
    proc = start_cli(*cli_args(runs, "run", **NO_PERIODIC))
    wait_for_step(runs / "run", 3, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err
    stopped = next(line for line in err.splitlines() if line.startswith("stopped by"))
    step = int(stopped.split("after step ")[1].split(";")[0])
    folder = ckpt.latest_checkpoint(runs / "run" / "checkpoints")
    assert step >= 3 and folder.name == f"step_{step:07d}" and ckpt.verify_checkpoint(folder) is None

    resumed = run_cli_train("--resume", *cli_args(runs, "run", **NO_PERIODIC), "--set", "log.console=plain")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from step {step} " in resumed.stdout  # not a restart from step 0
    assert same_run(runs / "run", straight, 30)
    fault("signals", f"{sig.name} at step 3 of 30 with checkpoint.every=0",
          f"exit {proc.returncode}, checkpoint of step {step} written and verified; --resume went on from step {step}; "
          "metrics and final weights identical to the uninterrupted run")


@pytest.mark.slow
def test_a_second_signal_aborts_at_once_and_loses_nothing_complete(runs, fault):
    slow = {"checkpoint.every": 2, "train.steps": 6, "rollout.prompts_per_step": 16, "rollout.group_size": 8}  # steps long enough to signal twice in one
    proc = start_cli(*cli_args(runs, "run", **slow))
    wait_for_step(runs / "run", 3, proc)
    proc.send_signal(signal.SIGTERM)
    first = proc.stderr.readline()
    while not first.strip():
        first = proc.stderr.readline()
    assert "finishing the current step" in first
    proc.send_signal(signal.SIGTERM)  # (two at once would be one: Python runs a handler once per pending signal)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "again: aborting now" in err and "Traceback" not in err
    kept = ckpt.latest_checkpoint(runs / "run" / "checkpoints")
    assert kept.name in ("step_0000002", "step_0000004") and ckpt.verify_checkpoint(kept) is None  # the periodic one is intact

    resumed = run_cli_train("--resume", *cli_args(runs, "run", **slow))
    assert resumed.returncode == 0, resumed.stderr
    straight_slow = runs / "straight"
    train(runs, "straight", **slow)
    assert same_run(runs / "run", straight_slow, 6)
    fault("signals", "SIGTERM, then SIGTERM again during the step that finishes", f"exit 130 at once, no traceback; the periodic "
          f"checkpoint {kept.name} intact; --resume completed the run, identical to the uninterrupted one")
