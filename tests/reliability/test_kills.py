"""SIGKILL cannot be caught: what it must never do is lose a complete checkpoint, leave a marked
one partial, or empty the metrics log. Kills at random moments (inside saves and rotations too) and
at the two worst moments, each followed by --resume to the end, compared with a run never killed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, run_cli
from faults_common import cli_args, run_cli_train, same_run, start_cli, train, wait_for_step
from scalerl.jsonl import read_metrics
from scalerl.trainer import checkpoint as ckpt

EVERY_STEP = {"checkpoint.every": 1, "checkpoint.keep_last": 2, "train.steps": 12, "eval.every": 4}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    runs = tmp_path_factory.mktemp("straight")
    train(runs, "run", **EVERY_STEP)
    return runs / "run"


def _leftovers(root):
    return sorted(p.name for p in root.iterdir() if not ckpt._NAME.match(p.name)) if root.is_dir() else []


def _all_marked_verify(root):
    return all(ckpt.verify_checkpoint(p) is None for p in ckpt.complete_checkpoints(root))


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing(straight, runs, fault):
    rng, run, root = random.Random(11), runs / "run", runs / "run" / "checkpoints"
    kills, inside = 0, 0
    for attempt in range(6):
        args = cli_args(runs, "run", **EVERY_STEP)
        proc = start_cli(*(["--resume"] if attempt else []), *args)
        done = read_metrics(run)[-1]["step"] if (run / "metrics.jsonl").exists() else 0
        if done >= 11:
            proc.kill()
            proc.wait()
            break
        wait_for_step(run, done + 1, proc)
        time.sleep(rng.uniform(0.0, 0.3))
        proc.kill()
        proc.wait()
        kills += 1
        inside += bool(_leftovers(root))  # a .tmp or .deleting folder: the kill landed in a save or a rotation
        assert _all_marked_verify(root), "a marked checkpoint is partial"
    finished = run_cli_train("--resume", *cli_args(runs, "run", **EVERY_STEP))
    assert finished.returncode == 0, finished.stderr
    assert _leftovers(root) == []
    assert same_run(run, straight, 12)
    fault("SIGKILL", f"{kills} SIGKILLs at random moments of a 12-step run saving every step (seed 11)",
          f"{inside} landed inside a save or rotation; every marked checkpoint verified after each kill; "
          "the final --resume removed the leftovers; metrics and final weights identical to the run never killed")


# Stops for good at one moment (SIGKILL to itself): inside a rotation's deletion, or inside the
# rewrite of metrics.jsonl on resume.
DRIVER = textwrap.dedent("""
    import os, signal, sys
    from scalerl import jsonl
    from scalerl.trainer import checkpoint as ckpt

    where = sys.argv[1]
    real_rmtree, real_replace = ckpt.shutil.rmtree, jsonl.os.replace

    def rmtree(path, *a, **k):
        if where == "rotation" and str(path).endswith(".deleting") and os.path.isdir(path):
            os.remove(os.path.join(path, "dcp", "__0_0.distcp"))  # half deleted, then killed
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rmtree(path, *a, **k)

    def replace(src, dst):
        if where == "metrics_rewrite" and str(dst).endswith("metrics.jsonl"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_replace(src, dst)

    ckpt.shutil.rmtree, jsonl.os.replace = rmtree, replace
    from scalerl.cli.main import main
    sys.argv = ["scalerl", "train", *sys.argv[2:]]
    main()
""")


def _driver(where, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", DRIVER, where, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_sigkill_inside_a_rotation_leaves_no_marked_partial_folder(straight, runs, fault):
    killed = _driver("rotation", *cli_args(runs, "run", **EVERY_STEP))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    root = runs / "run" / "checkpoints"
    left = _leftovers(root)
    assert left and left[0].endswith(".deleting") and _all_marked_verify(root)
    finished = run_cli_train("--resume", *cli_args(runs, "run", **EVERY_STEP))
    assert finished.returncode == 0, finished.stderr
    assert _leftovers(root) == [] and same_run(runs / "run", straight, 12)
    fault("SIGKILL", "SIGKILL in a rotation, the old checkpoint half deleted (its DCP shard gone)",
          f"the half-deleted folder was already {left[0]} (no COMPLETE folder partial); --resume removed it and ended "
          "identical to the run never killed")


@pytest.mark.slow
def test_sigkill_while_resume_rewrites_the_metrics_log_keeps_it(straight, runs, fault):
    proc = start_cli(*cli_args(runs, "run", **EVERY_STEP))
    wait_for_step(runs / "run", 5, proc)
    proc.kill()
    proc.wait()
    before = (runs / "run" / "metrics.jsonl").read_bytes()
    killed = _driver("metrics_rewrite", "--resume", *cli_args(runs, "run", **EVERY_STEP))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (runs / "run" / "metrics.jsonl").read_bytes() == before  # the old log, whole
    finished = run_cli_train("--resume", *cli_args(runs, "run", **EVERY_STEP))
    assert finished.returncode == 0, finished.stderr
    assert same_run(runs / "run", straight, 12)
    fault("SIGKILL", "SIGKILL while --resume rewrites metrics.jsonl",
          f"metrics.jsonl unchanged ({len(before)} bytes, {before.count(b'{')} rows); the next --resume ended identical to the run never killed")


@pytest.mark.slow
def test_a_torn_last_line_is_dropped_by_resume_predict_and_report(straight, runs, fault, tmp_path):
    proc = start_cli(*cli_args(runs, "run", **EVERY_STEP))
    wait_for_step(runs / "run", 5, proc)
    proc.kill()
    proc.wait()
    for log in ("metrics.jsonl", "events.jsonl"):
        with open(runs / "run" / log, "a") as f:
            f.write('{"step": 99, "reward_mean": 0.')  # a write cut off by the kill
    tools = [run_cli("-m", "scalerl.cli.main", *cmd) for cmd in (["predict", str(runs / "run")],
                                                                ["report", str(runs / "run"), "--out", str(tmp_path / "r.html")])]
    for tool in tools:
        assert "Traceback" not in tool.stderr and "JSONDecodeError" not in tool.stderr, tool.stderr
    assert any("torn last line" in t.stderr for t in tools)
    finished = run_cli_train("--resume", *cli_args(runs, "run", **EVERY_STEP))
    assert finished.returncode == 0, finished.stderr
    assert "torn last line" in finished.stderr
    assert same_run(runs / "run", straight, 12)
    fault("logs", "torn last line in metrics.jsonl and events.jsonl (kill mid-write)",
          f"predict exit {tools[0].returncode}, report exit {tools[1].returncode}, no traceback, the line dropped with a note; "
          "--resume dropped it too and ended identical to the run never killed")
