"""Run a console entry point of this checkout inside the test process, as `python -m MODULE ARGS` would run it.

Why: a test that starts `python -m scalerl.cli.main ...` pays the interpreter's import of torch and transformers
first, 4-7 s on a loaded 2-core machine, often more than the command itself (a dry run, an estimate, an export);
the suite's workers have them imported already. `conftest.run_cli` runs the commands of ENTRY_POINTS here unless a
test asks for a real process (`process=True`: signals, timeouts, a process's environment read at import); the tests
that start real processes (`scalerl train --nproc`, the fault-injection suite, `--help`'s import time) still do.

What stays as in a process: the exit code (SystemExit's code, 1 and the traceback for an exception), stdout and
stderr (file descriptors 1 and 2 captured too, so C++ and child-process output is kept), the working directory (the
checkout), the environment (the test's additions and OMP_NUM_THREADS=1), the logging setup of the CLI (the root
logger's handlers are set aside, so its `basicConfig` writes to the captured stderr). Restored after the call: the
environment, working directory, sys.argv, torch's thread count, the SIGINT/SIGTERM handlers, threading's excepthook,
warning filters, the root logger."""

from __future__ import annotations

import faulthandler
import importlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import warnings
from pathlib import Path

# module run as `python -m MODULE` -> the function its `if __name__ == "__main__"` block calls
ENTRY_POINTS = {"scalerl.cli.main": "main", "scalerl.cli.rl_train": "main", "scalerl.train": "main"}


def run_module(module: str, argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """`python -m module *argv` in this process: a CompletedProcess with its exit code, stdout and stderr. Past
    `timeout` seconds the test process prints every thread's stack and exits (pytest-xdist reports the test and
    starts a new worker): a command that hangs fails its test instead of holding the suite."""
    import torch

    saved_env, saved_argv, saved_cwd, saved_threads = dict(os.environ), sys.argv, os.getcwd(), torch.get_num_threads()
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    saved_excepthook = threading.excepthook
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    saved_streams = sys.stdout, sys.stderr
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        for stream in saved_streams:
            stream.flush()
        saved_fds = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 (closed below)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
        root.handlers = []
        try:
            os.environ.update(env)
            os.chdir(cwd)
            sys.argv = [module, *argv]
            faulthandler.dump_traceback_later(timeout, exit=True, file=saved_fds[1])  # the stderr outside the capture
            with warnings.catch_warnings():
                getattr(importlib.import_module(module), ENTRY_POINTS[module])()
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
                code = 1
        except Exception:  # noqa: BLE001 (what the interpreter does with an uncaught one: the traceback, exit 1)
            traceback.print_exc()
            code = 1
        finally:
            faulthandler.cancel_dump_traceback_later()
            for stream in (sys.stdout, sys.stderr):
                stream.close()  # flushed; its file descriptor stays open (closefd=False)
            sys.stdout, sys.stderr = saved_streams
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            root.handlers, root.level = saved_handlers, saved_level
            for sig, handler in saved_signals.items():
                signal.signal(sig, handler)
            threading.excepthook = saved_excepthook
            torch.set_num_threads(saved_threads)
            sys.argv = saved_argv
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([sys.executable, "-m", module, *argv], code,
                                           out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"))
