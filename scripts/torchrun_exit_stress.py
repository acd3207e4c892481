"""Run the torchrun form of a tiny 2-rank job many times and count the runs whose processes did not exit cleanly.

    python scripts/torchrun_exit_stress.py --runs 40 --busy

A rank that aborts *after* its run finished ("terminate called without an active exception": a process group that
outlived destroy_process_group, its gloo worker thread needing the GIL at interpreter exit) shows only under load,
so `--busy` keeps a third process spinning beside the two ranks. Each run trains 3 steps of DDP on the built-in
model with a checkpoint (tests/distributed/test_gloo.py's torchrun test). Prints one line a run and the count.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = {"rollout.prompts_per_step": 4, "rollout.group_size": 4, "train.steps": 3, "train.threads": 1, "eval.every": 3,
        "eval.max_tasks": 16, "log.console": "none", "log.name": "ddp", "checkpoint.every": 3}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(scratch: Path) -> subprocess.CompletedProcess:
    settings = [arg for key, value in {**TINY, "log.run_dir": str(scratch)}.items() for arg in ("--set", f"{key}={value}")]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
               "-m", "scalerl.train", *settings]
    return subprocess.run(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--busy", action="store_true", help="keep one more process spinning on the CPU beside the ranks")
    args = ap.parse_args()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    failed = 0
    try:
        for i in range(args.runs):
            with tempfile.TemporaryDirectory() as scratch:
                done = one_run(Path(scratch))
            aborted = "terminate called without an active exception" in done.stderr
            failed += done.returncode != 0
            print(f"run {i + 1}: exit {done.returncode}{' (a rank aborted at exit)' if aborted else ''}", flush=True)
    finally:
        if busy is not None:
            busy.kill()
    print(f"{failed} of {args.runs} runs failed{' beside a busy process' if args.busy else ''}")


if __name__ == "__main__":
    main()
