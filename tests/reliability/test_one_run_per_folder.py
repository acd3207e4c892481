"""One run per folder: two `scalerl train --name same` started together, or one while the other runs,
or a `--resume` of a run that is still running: exactly one proceeds, the others are refused in one
line naming the holder (pid and host) with exit 2, and write nothing. A lock left by a dead process
never blocks."""

from __future__ import annotations

import pytest
from faults_common import cli_args, run_cli_train, start_cli, wait_for_step

from scalerl.jsonl import read_metrics
from scalerl.trainer import checkpoint as ckpt

SHORT = {"train.steps": 4, "checkpoint.every": 2, "eval.every": 0}


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_two_runs_started_together_on_one_name(runs, fault):
    args = cli_args(runs, "run", **SHORT)
    procs = [start_cli(*args), start_cli(*args)]
    outs = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in outs)
    assert codes == [0, 2], outs
    line = _one_line(next(err for code, err in outs if code == 2))
    winner = next(p for p, (code, _) in zip(procs, outs) if code == 0)
    assert f"pid {winner.pid} on host" in line and "is in use by another run" in line, line
    assert [row["step"] for row in read_metrics(runs / "run")] == [1, 2, 3, 4]
    assert not (runs / "run" / ".lock").exists()  # released at the end
    fault("run folder", "two `scalerl train --name same` started at the same moment",
          f"one ran (metrics steps 1-4 once each), the other exit 2 in one line: {line.split('(')[0].replace(str(runs), 'runs')}"
          "(held by pid N on host H) ...")


@pytest.mark.slow
def test_a_second_run_and_a_resume_while_the_first_runs(runs, fault):
    args = cli_args(runs, "run", **{**SHORT, "train.steps": 40})
    first = start_cli(*args)
    try:
        wait_for_step(runs / "run", 2, first)
        before = sorted(p.name for p in (runs / "run").iterdir())
        second, resumed = run_cli_train(*args, timeout=120), run_cli_train("--resume", *args, timeout=120)
        assert first.poll() is None  # still running: neither touched it
        for refused in (second, resumed):
            assert refused.returncode == 2, refused.stderr
            assert f"held by pid {first.pid} on host" in _one_line(refused.stderr)
        assert [p for p in before if p not in {x.name for x in (runs / "run").iterdir()}] == []
        wait_for_step(runs / "run", 3, first)  # past step 2: its checkpoint is complete, for the resume below
        assert ckpt.latest_checkpoint(runs / "run" / "checkpoints") is not None
    finally:
        first.kill()
        first.wait()
    # SIGKILL: the kernel dropped the lock; the file it leaves names a dead process and blocks nothing
    assert (runs / "run" / ".lock").exists()
    newest = ckpt.latest_checkpoint(runs / "run" / "checkpoints")
    done = run_cli_train("--resume", *cli_args(runs, "run", **{**SHORT, "train.steps": int(newest.name.split("_")[1]) + 1}))
    assert done.returncode == 0, done.stderr
    steps = [row["step"] for row in read_metrics(runs / "run")]
    assert steps == list(range(1, len(steps) + 1))
    fault("run folder", "a second run, and a --resume, on the name of a run in progress (then the holder SIGKILLed)",
          "both exit 2 in one line naming the holder's pid and host, the folder untouched; after the kill the stale lock "
          "blocked nothing: --resume ran, each step once in metrics.jsonl")
