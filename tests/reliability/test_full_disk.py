"""A full disk (a real tmpfs of 20 MiB, room for one checkpoint of the built-in model, not two):
the failed save says in one line what failed and how much space it needs, removes its partial
folder, and the previous checkpoint stays intact; with space freed, --resume ends the run exactly."""

from __future__ import annotations

import subprocess

import pytest

from faults_common import cli_args, run_cli_train, same_run, train
from scalerl.trainer import checkpoint as ckpt


def _mount(path, size):
    path.mkdir(parents=True, exist_ok=True)
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if got.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({got.stderr.strip() or 'not root'}); the full-disk test needs one")


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    _mount(disk, "20m")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_fails_the_save_cleanly_and_the_run_resumes_after(small_disk, tmp_path, fault):
    killed = run_cli_train(*cli_args(small_disk, "run"))
    assert killed.returncode == 2, killed.stderr
    lines = [line for line in killed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: checkpoint of step 4 not saved"), killed.stderr
    assert "No space left on device" in lines[0] and "MiB are free" in lines[0] and "step 2 is intact" in lines[0]
    root = small_disk / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_0000002"]  # no .tmp left behind
    assert ckpt.verify_checkpoint(root / "step_0000002") is None

    subprocess.run(["mount", "-o", "remount,size=200m", str(small_disk)], check=True)  # the user frees space
    resumed = run_cli_train("--resume", *cli_args(small_disk, "run"))
    assert resumed.returncode == 0, resumed.stderr
    straight = tmp_path / "straight"
    train(straight, "run")
    assert same_run(small_disk / "run", straight / "run", 8)
    fault("disk", "disk full during the second checkpoint (20 MiB tmpfs, 13 MiB per checkpoint)",
          f"exit 2, one line: {lines[0].split(' in ')[0]}: ...{lines[0].split(': ', 2)[2].split('; (free')[0][:150]}; "
          "no .tmp left; step 2 verified; after freeing space --resume ended identical to the run with room")


def test_a_full_disk_outside_a_save_is_one_line_and_exit_2(capsys, fault):
    import errno

    from scalerl.cli.common import run_guarded

    def write_log():
        raise OSError(errno.ENOSPC, "No space left on device", "runs/r/metrics.jsonl")

    with pytest.raises(SystemExit) as code:
        run_guarded(write_log, debug=False)
    err = capsys.readouterr().err.strip()
    assert code.value.code == 2 and "\n" not in err and err.startswith("error: disk full writing runs/r/metrics.jsonl")
    fault("disk", "disk full while appending to metrics.jsonl (ENOSPC from a write)", f"exit 2, one line: {err}")
