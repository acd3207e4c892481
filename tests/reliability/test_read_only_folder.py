"""The run folder turning read-only mid-run, for real: an ext4 file system on a loop device, mounted
with errors=remount-ro, told to fail (`/sys/fs/ext4/<dev>/trigger_fs_error`, the kernel's own test hook)
while the run writes its metrics, TensorBoard events and checkpoints. The run stops in one line naming
the path and the errno (no writer-thread traceback), and the checkpoint before the fault stays intact."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from faults_common import cli_args, start_cli, wait_for_step
from scalerl.trainer import checkpoint as ckpt


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), capture_output=True, text=True)


@pytest.fixture
def ext4(tmp_path):
    """(mount point, its /sys/fs/ext4 folder), or a skip saying why this machine cannot make one."""
    image, disk = tmp_path / "disk.img", tmp_path / "disk"
    disk.mkdir()
    made = _run("mkfs.ext4", "-q", "-F", str(image), "96M") if _run("truncate", "-s", "96M", str(image)).returncode == 0 else None
    if made is None or made.returncode:
        pytest.skip(f"cannot make an ext4 image here ({made.stderr.strip() if made else 'truncate failed'})")
    before = set(os.listdir("/sys/fs/ext4")) if os.path.isdir("/sys/fs/ext4") else set()
    mounted = _run("mount", "-o", "loop,errors=remount-ro", str(image), str(disk))
    if mounted.returncode:
        pytest.skip(f"cannot loop-mount an ext4 image here ({mounted.stderr.strip() or 'not root'}); the test needs one")
    new = set(os.listdir("/sys/fs/ext4")) - before
    try:
        if len(new) != 1 or not (Path("/sys/fs/ext4") / next(iter(new)) / "trigger_fs_error").exists():
            pytest.skip("this kernel has no ext4 trigger_fs_error to turn the file system read-only")
        yield disk, Path("/sys/fs/ext4") / next(iter(new))
    finally:
        _run("umount", "-l", str(disk))  # lazy: a file a failed test left open must not keep it


@pytest.mark.slow
def test_a_read_only_remount_mid_run_is_one_line_and_keeps_the_checkpoint(ext4, fault):
    disk, sysfs = ext4
    extra = {"train.steps": 40, "checkpoint.every": 2, "checkpoint.keep_last": 1, "eval.every": 0}
    proc = start_cli(*cli_args(disk, "run", **extra))
    wait_for_step(disk / "run", 3, proc)
    (sysfs / "trigger_fs_error").write_text("scalerl fault test\n")
    proc.wait(timeout=300)
    lines = [line for line in proc.stderr.read().splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert str(disk / "run") in lines[0] and "[Errno 30] Read-only file system" in lines[0], lines[0]
    newest = ckpt.latest_checkpoint(disk / "run" / "checkpoints")
    assert newest is not None and ckpt.verify_checkpoint(newest) is None
    fault("disk", "run folder remounted read-only mid-run (ext4 errors=remount-ro, trigger_fs_error), TensorBoard on",
          f"exit 2, one line: {lines[0].replace(str(disk), '<disk>')}; checkpoint of step {newest.name[5:].lstrip('0')} verified intact")


@pytest.mark.parametrize("code", [errno.EROFS, errno.EIO])
def test_a_refused_write_outside_a_save_is_one_line_and_exit_2(capsys, fault, code):
    from scalerl.cli.common import run_guarded
    from scalerl.files import writing

    def write_log():
        with writing("runs/r/tensorboard"):  # what TensorBoard's writer raises: the errno, no file name
            raise OSError(code, os.strerror(code))

    with pytest.raises(SystemExit) as exit_code:
        run_guarded(write_log, debug=False)
    err = capsys.readouterr().err.strip()
    assert exit_code.value.code == 2 and "\n" not in err, err
    assert err.startswith("error: cannot ") and f"runs/r/tensorboard ([Errno {code}] {os.strerror(code)})" in err
    fault("disk", f"{errno.errorcode[code]} from a write without a file name (TensorBoard's writer thread)",
          f"exit 2, one line: {err}")


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # a thread's traceback fails it
def test_tensorboard_failing_in_its_thread_is_reported_once_naming_the_folder(ext4, capfd, fault):
    import time

    from scalerl.monitor.metrics import MetricsLogger

    disk, sysfs = ext4
    logger = MetricsLogger(disk, tensorboard=True)
    # TensorBoard's thread flushes every 120 s: make it flush at every write, as a run longer than that meets it
    logger._tb._get_file_writer().event_writer._async_writer._worker._flush_secs = 0
    logger.log(1, {"loss": 1.0})
    (sysfs / "trigger_fs_error").write_text("scalerl fault test\n")
    seen = []
    for step in range(2, 50):  # metrics.jsonl fails at once; TensorBoard in its thread, or at the latest when it closes
        try:
            logger.log(step, {"loss": 1.0})
        except OSError as err:
            seen.append(err)
        time.sleep(0.01)
    try:
        logger.close()
    except OSError as err:
        seen.append(err)
    assert seen and all(err.errno == errno.EROFS and err.filename for err in seen), seen
    named = sorted({Path(err.filename).name for err in seen})
    printed = capfd.readouterr().err
    assert "Traceback" not in printed and "Exception in thread" not in printed, printed
    fault("disk", "metrics.jsonl and TensorBoard's writer (its own thread) on a file system turned read-only",
          f"every OSError names its path ({', '.join(named)}); no thread traceback printed")
