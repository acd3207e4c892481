"""`scalerl launch --ray` (scalerl/cli/launch.py, scalerl/rollout/ray_producer.py): the run's roles as Ray
actors. The slow tests start a real Ray head on 127.0.0.1 with 2 CPUs and run jobs through it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from conftest import run_cli
from scalerl.cli.launch import rank_envs
from scalerl.jsonl import read_metrics

TINY = ["--set", "rollout.prompts_per_step=4", "--set", "rollout.group_size=4", "--set", "eval.every=1000",
        "--set", "eval.max_tasks=16", "--set", "log.console=none", "--set", "log.run_dir=runs"]
ASYNC = ["--set", "rollout.mode=async", "--set", "rollout.max_staleness=1", "--set", "algorithm.tis_cap=2"]


pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster at a time when the suite runs on several workers (-n 2)


def test_rank_envs_follow_where_ray_put_the_ranks():
    """torchrun's variables per rank: rank 0's node hosts the group; local ranks count per node; a rank shown only
    its own GPU uses cuda:0 of what it sees; one rank needs none of them."""
    places = [{"ip": "10.0.0.1", "node_id": "a", "port": 29500, "gpus": []},
              {"ip": "10.0.0.2", "node_id": "b", "port": 29501, "gpus": []},
              {"ip": "10.0.0.1", "node_id": "a", "port": 29502, "gpus": []}]
    envs = rank_envs(places)
    assert [e["RANK"] for e in envs] == ["0", "1", "2"] and {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "0", "1"] and [e["LOCAL_WORLD_SIZE"] for e in envs] == ["2", "1", "2"]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.0.0.1", "29500")}
    with_gpus = rank_envs([{**p, "gpus": [str(i)]} for i, p in enumerate(places)])
    assert [e["LOCAL_RANK"] for e in with_gpus] == ["0", "0", "0"]
    assert rank_envs(places[:1]) == [{}]


def test_launch_refuses_bad_input_in_one_line_before_ray_starts(tmp_path):
    """Checked before Ray is imported or started, so these hold without Ray installed too; without it, the
    install command (Ray made unimportable here by a module that raises ImportError)."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('Ray is not installed here')\n")
    proc = run_cli("-m", "scalerl.cli.main", "launch", "--ray", "local", timeout=60, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2 and proc.stderr.strip() == "error: scalerl launch --ray needs Ray: pip install 'scalerl[ray]'", proc.stderr
    cases = [
        (["--ray", "local", "--nproc", "2", *ASYNC], "--nproc > 1 with rollout.mode=async"),
        (["--ray", "127.0.0.1:1"], "no Ray head answers there"),
        (["--ray", "nowhere"], "expected local, auto"),
        (["--ray", "local", "--strategy", "CLOSE"], "--strategy CLOSE"),
        (["--ray", "local", "--set", "rollout.nosuch=1"], "nosuch"),
        (["--ray", "local", "--name", "r", "--resume", "--overwrite"], "--resume and --overwrite contradict"),
    ]
    for args, message in cases:
        proc = run_cli("-m", "scalerl.cli.main", "launch", *args, timeout=60, env={"PYTHONPATH": str(tmp_path)})
        assert proc.returncode == 2, (args, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (args, proc.stderr)


# the head and every launch share a token of this test's own, whatever ~/.ray/auth_token holds; Ray's single-machine
# mode keeps every address on the loopback (otherwise it swaps 127.0.0.1 for the machine's outward address)
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex,
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head on 127.0.0.1 with 2 CPUs (its own session folder and token), its processes killed at the end."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'scalerl[ray]'")
    ray_cli = Path(sys.executable).with_name("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    session = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live under it
    start = subprocess.Popen([str(ray_cli), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "2",
                              "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", session],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             env={**os.environ, **RAY_ENV, HEAD_MARK: session})
    try:
        out, _ = start.communicate(timeout=120)
        assert start.returncode == 0, out[-3000:]
        yield f"127.0.0.1:{port}"
    finally:
        _kill_head(start.pid, session)
        shutil.rmtree(session, ignore_errors=True)


HEAD_MARK = "SCALERL_TEST_RAY_HEAD"


def _kill_head(group: int, session: str) -> None:
    """SIGKILL every process of this test's Ray head: its process group (`ray start` ran in a session of its own, and
    the daemons it left keep its group) and any process with HEAD_MARK=session in its environment (the workers the
    raylet started). Not `ray stop --force`, which stops every Ray cluster on the machine: when pytest-xdist ran this
    module's tests on both workers, each with its head, one worker's teardown killed the other's raylet mid-test."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if f"{HEAD_MARK}={session}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue


def _launch(cwd: Path, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **RAY_ENV}
    return subprocess.Popen([sys.executable, "-m", "scalerl.cli.main", "launch", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


@pytest.mark.slow
def test_an_async_job_through_ray_stops_on_sigterm_and_resumes(ray_head, tmp_path):
    """Learner and producer as Ray actors: the run folder is where `scalerl train` puts it (relative to the
    working directory), staleness stays within k while they overlap; SIGTERM at the driver reaches the
    learner, which checkpoints and stops (exit 143); `--resume` through Ray goes on from the next step."""
    run = tmp_path / "runs" / "r"
    proc = _launch(tmp_path, "--ray", ray_head, "--name", "r", "--steps", "3000", *ASYNC, *TINY)
    deadline = time.monotonic() + 240
    while not (run / "metrics.jsonl").is_file() or len(read_metrics(run)) < 12:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "ray: learner rank 0 on node 127.0.0.1" in err and "the rollout producer is Ray actor" in err, err
    assert "SIGTERM: finishing the current step" in err, err
    stopped = len(read_metrics(run))
    assert (run / "checkpoints" / f"step_{stopped:07d}").is_dir(), sorted(os.listdir(run / "checkpoints"))
    rows = read_metrics(run)
    assert all(r["staleness"] <= 1 for r in rows) and sum(r["staleness"] for r in rows) >= stopped // 2, rows

    proc = _launch(tmp_path, "--ray", ray_head, "--name", "r", "--resume", "--steps", str(stopped + 4), "--set", "log.console=none")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert [r["step"] for r in read_metrics(run)] == list(range(1, stopped + 5))
    assert json.loads((run / "summary.json").read_text())["steps"] == stopped + 4


@pytest.mark.slow
def test_two_sync_learner_ranks_through_ray_form_one_group(ray_head, tmp_path):
    """--nproc 2: two learner actors join one torch.distributed group (gloo), each sampling its share."""
    proc = _launch(tmp_path, "--ray", ray_head, "--name", "ddp", "--nproc", "2", "--steps", "3", *TINY, "--set", "train.threads=1")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "ray: learner rank 0 on node" in err and "ray: learner rank 1 on node" in err, err
    assert "world_size: 2" in (tmp_path / "runs" / "ddp" / "resolved.yaml").read_text()
    rows = read_metrics(tmp_path / "runs" / "ddp")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert {r["completions"] for r in rows} == {32.0}  # 2 ranks × 4 prompts × 4 completions
