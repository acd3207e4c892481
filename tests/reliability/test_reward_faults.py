"""Reward worker processes that die between calls, are signalled, or lose their trainer: a worker
that died while idle is replaced and the call goes to the fresh one (no scores lost, the restart
counted); SIGINT and SIGTERM (a Ctrl-C, a scancel reaching every process) leave the workers to the
trainer, which stops gracefully; a SIGKILLed trainer leaves no worker behind; and a broken pipe is
never a silent exit 1."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import hostile_rewards
from conftest import ROOT, tiny_overrides
from faults_common import run_cli_train
from scalerl.cli.common import run_guarded
from scalerl.jsonl import read_metrics
from scalerl.rewards.safe_call import FunctionWorker
from scalerl.rewards.workers import RewardPool

HERE = Path(__file__).resolve().parent
AREA = "reward workers"


def _args(runs: Path, name: str, component: dict, **extra) -> list[str]:
    over = tiny_overrides(runs, name, **{"train.steps": 4, "eval.every": 0, **extra,
                                         "reward.components": [{"name": "env", "env": True}, component]})
    return [arg for key, value in over.items() for arg in ("--set", f"{key}={json.dumps(value) if isinstance(value, list) else value}")]


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an exited child its parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_dead(pids, timeout: float = 10.0) -> list[int]:
    """The pids still alive after `timeout` seconds (empty: all gone)."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _group_members(pgid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


# --- a worker that dies between calls -----------------------------------------------------------

@pytest.mark.parametrize("fn, code", [("exits_after_returning", "0"), ("sigkills_after_returning", "-9")],
                         ids=["os._exit", "SIGKILL"])
def test_a_function_worker_that_dies_after_returning_loses_no_scores(runs, fault, monkeypatch, fn, code):
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    proc = run_cli_train(*_args(runs, "run", {"name": "hostile", "function": f"hostile_rewards:{fn}"}), "--overwrite",
                         process=True)  # PYTHONPATH is read when a process starts
    assert proc.returncode == 0, proc.stderr
    rows = read_metrics(runs / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["reward/hostile_mean"] for r in rows] == [1.0] * 4  # every score arrived: none is the fallback 0
    assert [r["reward/hostile_failures"] for r in rows] == [0.0] * 4
    restarts = [r["reward/hostile_restarts"] for r in rows]
    assert restarts == [0.0, 1.0, 1.0, 1.0]  # the death after each call is found, counted, and replaced
    deaths = [line for line in proc.stderr.splitlines() if "died between calls" in line]
    assert len(deaths) == 3 and f"(exit code {code})" in deaths[0] and f"hostile_rewards:{fn}" in deaths[0], proc.stderr
    how = "exits with os._exit(0)" if code == "0" else "SIGKILLs its own process"
    fault(AREA, f"a reward function whose thread {how} just after each call returned (CLI, 4 steps)",
          f"exit 0, all 4 steps; reward/hostile_mean 1.0 and _failures 0 every step; reward/hostile_restarts "
          f"{restarts}; one warning per death naming the function and exit code {code}")


def test_a_function_worker_killed_while_idle_is_replaced_and_the_call_answered(fault, caplog):
    worker = FunctionWorker("hostile_rewards:ones", timeout_s=10)
    try:
        assert worker.call(["p"] * 3, ["a", "b", "c"], {}) == [1.0] * 3
        old = worker._process.pid
        os.kill(old, signal.SIGKILL)
        worker._process.join(timeout=10)
        assert not worker._process.is_alive()
        with caplog.at_level(logging.WARNING, logger="scalerl.rewards.safe_call"):
            assert worker.call(["p"] * 3, ["a", "b", "c"], {}) == [1.0] * 3
        assert worker.restarts == 1 and worker._process.pid != old
        assert "died between calls (exit code -9)" in caplog.text and "hostile_rewards:ones" in caplog.text
    finally:
        worker.close()
    fault(AREA, "a function's worker SIGKILLed while idle (unit)",
          "the next call answered by a fresh worker with the right scores; restarts == 1; one warning with exit code -9")


def test_a_function_worker_that_dies_after_the_request_was_sent_but_not_taken(fault):
    """The death lands between the parent's send and the worker's read: the request sits unread in the
    pipe. The worker acknowledges each request before calling the function, so the parent knows the
    call was never attempted and sends it to a fresh worker."""
    worker = FunctionWorker("hostile_rewards:ones", timeout_s=10)
    try:
        worker.wait_ready()
        pid = worker._process.pid
        os.kill(pid, signal.SIGSTOP)  # alive at submit, but it will never read the request
        worker.submit(["p"] * 2, ["a", "b"], {})
        os.kill(pid, signal.SIGKILL)
        assert worker.result() == [1.0, 1.0] and worker.restarts == 1
        assert worker.call(["p"], ["a"], {}) == [1.0] and worker.restarts == 1
    finally:
        worker.close()
    fault(AREA, "a function's worker killed after the request was sent, before it read it (unit)",
          "the call went to a fresh worker and returned the right scores; restarts == 1")


@pytest.mark.parametrize("victims", ["one", "both"])
def test_a_pool_worker_killed_between_calls_loses_nothing(fault, victims):
    items = [(float(i),) for i in range(12)]
    with RewardPool(2, {"echo": hostile_rewards.echo}, fail_value=-1.0) as pool:
        pids = pool.start()
        assert pool.map_scores("echo", items) == [float(i) for i in range(12)]
        killed = pids[:1] if victims == "one" else pids
        executor = pool._executor
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10  # until the executor has noticed (at once, in practice)
        while not getattr(executor, "_broken", False) and time.monotonic() < deadline:
            time.sleep(0.01)
        out = pool.map_scores("echo", items)
        assert out == [float(i) for i in range(12)] and -1.0 not in out
        assert pool.pop_metrics() == {"reward_failed_items": 0.0, "reward_pool_restarts": 1.0, "reward_hung_workers": 0.0}
        assert _wait_dead(pids) == []  # the survivor of a broken pool is gone too (it ignores SIGTERM)
        assert set(pool.start()).isdisjoint(pids)
    fault(AREA, f"{victims} of 2 env-score pool workers SIGKILLed between calls (unit)",
          "the next call rebuilt the pool and returned every score (no fail_value); reward_pool_restarts 1, "
          "reward_failed_items 0; no old worker left")


# --- signals ------------------------------------------------------------------------------------

def test_function_and_pool_workers_ignore_sigint_and_sigterm(fault):
    worker = FunctionWorker("hostile_rewards:ones", timeout_s=10)
    try:
        with RewardPool(2, {"echo": hostile_rewards.echo}) as pool:
            worker.wait_ready()
            pids = pool.start()
            targets = [worker._process.pid, *pids]
            for pid in targets:
                os.kill(pid, signal.SIGINT)
                os.kill(pid, signal.SIGTERM)
            time.sleep(0.5)
            assert all(_alive(pid) for pid in targets)
            assert worker.call(["p"] * 2, ["a", "b"], {}) == [1.0, 1.0] and worker.restarts == 0
            assert pool.map_scores("echo", [(1.0,), (2.0,), (3.0,)]) == [1.0, 2.0, 3.0]
            assert pool.pop_metrics() == {"reward_failed_items": 0.0, "reward_pool_restarts": 0.0, "reward_hung_workers": 0.0}
            assert pool.start() == pids and worker._process.pid == targets[0]  # the same processes
    finally:
        worker.close()
    fault(AREA, "SIGINT and SIGTERM sent to a function worker and to 2 pool workers (unit)",
          "all alive; the next calls answered by the same processes, no restart, no failed item")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_whole_process_group_mid_reward_call_loses_no_scores(runs, fault, sig):
    """What scancel (SIGTERM to every process of the job) and a Ctrl-C (SIGINT to the foreground
    process group) do: the function sends the signal to its group during its second call."""
    fn = f"hostile_rewards:{sig.name.lower()}_group_on_call_2"
    args = _args(runs, "run", {"name": "mine", "function": fn}, **{"train.steps": 6, "reward.num_workers": 2})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    proc = subprocess.Popen([sys.executable, "-m", "scalerl.cli.main", "train", *args, "--overwrite"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err
    rows = read_metrics(runs / "run")
    assert [r["step"] for r in rows] == [1, 2]  # the step in progress finished, then the run stopped
    assert [r["reward/mine_mean"] for r in rows] == [1.0, 1.0] and [r["reward/mine_failures"] for r in rows] == [0.0, 0.0]
    assert all(r["reward/mine_restarts"] == 0 and r["reward/env_failures"] == 0 and r["reward/env_restarts"] == 0
               for r in rows), rows
    deadline = time.monotonic() + 10
    while (left := _group_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []  # the trainer closed its workers: nothing of the run is left
    fault(AREA, f"{sig.name} to the trainer's whole process group during a reward call (reward.num_workers=2)",
          f"exit {proc.returncode} after finishing step 2; its function and env scores all arrived (no failure, "
          "no restart); no process of the run left")


# --- the trainer SIGKILLed ----------------------------------------------------------------------

PARENT = textwrap.dedent("""
    import json, os, sys, time
    import hostile_rewards
    from scalerl.rewards.safe_call import FunctionWorker
    from scalerl.rewards.workers import RewardPool

    if __name__ == "__main__":
        idle = FunctionWorker("hostile_rewards:ones", timeout_s=120)
        busy = FunctionWorker("hostile_rewards:sleeps", timeout_s=120)
        idle.wait_ready()
        busy.submit(["p"], ["a"], {})  # busy for a minute when the parent is killed
        pool = RewardPool(2, {"echo": hostile_rewards.echo})
        pids = {"idle": idle._process.pid, "busy": busy._process.pid, "pool": pool.start()}
        time.sleep(0.5)
        print(json.dumps(pids), flush=True)
        time.sleep(300)
""")


def test_workers_exit_when_the_trainer_is_sigkilled(tmp_path, fault):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(proc.stdout.readline())
        workers = [pids["idle"], pids["busy"], *pids["pool"]]
        assert len(workers) == 4 and all(_alive(p) for p in workers)
        proc.kill()
        proc.wait(timeout=10)
        left = _wait_dead(workers, 10)
    finally:
        if proc.poll() is None:
            proc.kill()
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"still running 10 s after the trainer was SIGKILLed: {left} of {pids}"
    fault(AREA, "the trainer SIGKILLed with an idle and a busy function worker and 2 pool workers",
          "all 4 worker processes gone within 10 s")


# --- a broken pipe is never silent ---------------------------------------------------------------

@pytest.mark.parametrize("error", [BrokenPipeError(errno.EPIPE, "Broken pipe"), OSError(errno.EPIPE, "Broken pipe")],
                         ids=["BrokenPipeError", "OSError-EPIPE"])
def test_a_broken_pipe_in_the_run_prints_its_traceback_and_exits_1(capsys, fault, error):
    def fn():
        raise error

    with pytest.raises(SystemExit) as stop:
        run_guarded(fn, debug=False)
    err = capsys.readouterr().err
    assert stop.value.code == 1
    assert "Traceback (most recent call last)" in err and f"{type(error).__name__}: [Errno 32] Broken pipe" in err
    if type(error) is BrokenPipeError:
        fault(AREA, "a BrokenPipeError raised inside the run (e.g. a pipe to a dead worker)",
              "exit 1 with its traceback on stderr (click alone would have exited 1 without a word)")


def test_stdout_closed_by_its_reader_stays_quiet(monkeypatch):
    """`scalerl ... | head`: a broken stdout is left to click, which exits quietly."""
    r, w = os.pipe()
    os.close(r)
    out = os.fdopen(w, "w")
    monkeypatch.setattr(sys, "stdout", out)

    def fn():
        print("x" * 100, file=out, flush=True)

    try:
        with pytest.raises(BrokenPipeError):
            run_guarded(fn, debug=False)
    finally:
        monkeypatch.undo()
        try:
            out.close()
        except BrokenPipeError:
            pass
