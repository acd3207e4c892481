"""What every entry point shares: logging setup, and turning errors into one line and exit code 2."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from scalerl.errors import ScaleRLError


def setup_logging() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no weight-loading bars or notices
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    # bitsandbytes (imported by peft and the compressed mode) tries an optional CPU kernel from the hub at import and
    # warns that it could not; it then runs its own torch kernels, which is what a run without the hub wants.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


# what the disk under a run can refuse mid-run: full, over quota, read-only (a remount), an I/O error, a file too
# big, permissions taken away (only with a file name: without one it is more likely a bug than the folder)
WRITE_FAULTS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG, errno.EACCES, errno.EPERM)


@contextlib.contextmanager
def guarded(debug: bool) -> Iterator[None]:
    """Around a command's work: a ScaleRLError becomes `error: <message>` on stderr and exit code 2
    (traceback only with --debug), and so does a write the disk refuses (full, read-only, an I/O error: `WRITE_FAULTS`). A run stopped by SIGTERM/SIGINT (`Stopped`,
    after its checkpoint) exits with 128 + the signal's number; a second signal (KeyboardInterrupt) with
    130. Anything else is a bug in ScaleRL and keeps its traceback: a broken pipe (EPIPE) too, printed
    here with exit code 1, unless it is stdout's reader that went away (`scalerl ... | head`).
    (A context manager, not a wrapper: it adds no call between a command and its work.)"""
    from scalerl.errors import Stopped

    try:
        yield
    except ScaleRLError as err:
        if debug:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as err:
        if err.errno == errno.EPIPE and not _stdout_closed():
            # a pipe to some other process (a worker, a socket) broke: a bug, never silent. Left to
            # click it would exit 1 without a word; only a reader of our stdout gone (`| head`) is quiet.
            traceback.print_exc()
            raise SystemExit(1) from None
        if err.errno not in WRITE_FAULTS or (err.errno in (errno.EACCES, errno.EPERM) and not err.filename):
            raise
        if debug:
            traceback.print_exc()
        what = f"[Errno {err.errno}] {err.strerror}"
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            print(f"error: disk full writing {err.filename or 'a file'} ({what}); free space, then resume with --resume", file=sys.stderr)
        else:
            verb = "cannot write" if err.errno in (errno.EROFS, errno.EFBIG) else "cannot use"
            print(f"error: {verb} {err.filename or 'a file'} ({what}); a run writing there stopped and its newest complete checkpoint "
                  "is intact: make the folder writable, then resume with --resume", file=sys.stderr)
        raise SystemExit(2) from None
    except Stopped as stop:
        print(f"{stop}; resume with --resume", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    except KeyboardInterrupt:
        print("aborted; the newest complete checkpoint is intact: resume with --resume", file=sys.stderr)
        raise SystemExit(130) from None


def run_guarded(fn: Callable[[], Any], debug: bool) -> None:
    """`fn()` inside `guarded(debug)`."""
    with guarded(debug):
        fn()


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reading end is closed (poll reports an error on the writer)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no real descriptor (captured, closed) or no poll()
        return False


def command_overrides(set_: list[str], name: str | None, steps: int | None) -> list[str]:
    """The --set values, then --name and --steps as the keys they stand for."""
    return [*set_, *([f"log.name={name}"] if name is not None else []), *([f"train.steps={steps}"] if steps is not None else [])]


def checked_config(config_path: Path | None, overrides: list[str], resume: bool, overwrite: bool = False):
    """The run's config (on --resume: from the run's saved one, scalerl/config/resume.py), checked: one-line errors."""
    from scalerl.config.checks import check_config
    from scalerl.config import load_config
    from scalerl.config.resume import resume_config

    if resume and overwrite:
        raise ScaleRLError("--resume and --overwrite contradict each other: continue the run, or replace it")
    return check_config(resume_config(config_path, overrides) if resume else load_config(config_path, overrides))


def launch_ranks(nproc: int, max_restarts: int, argv: list[str], config_path: Path | None, overrides: list[str],
                 resume: bool, overwrite: bool = False, command: str = "train") -> None:
    """`scalerl train --nproc N` (or `sft`, `command`): check the config here (a bad key is one line, exit 2, before
    any process starts), then run `torchrun --standalone --nproc_per_node N --max-restarts K -m scalerl.cli.main
    COMMAND ...` and exit with its code. A restart resumes (see `launch`), so it needs the run's --name."""
    import subprocess

    config = checked_config(config_path, overrides, resume, overwrite)
    if max_restarts and config.log.name is None:
        raise ScaleRLError("--max-restarts needs --name: a restarted run resumes the run of that name")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               "--max-restarts", str(max_restarts), "-m", "scalerl.cli.main", command, *argv]
    code = subprocess.run(command).returncode
    if code not in (0, 2):  # 2: a rank already printed its one-line error
        from scalerl.trainer.checkpoint import latest_checkpoint

        name = config.log.name
        newest = latest_checkpoint(config.log.run_dir / name / "checkpoints") if name else None
        kept = f"the newest complete checkpoint is {newest}" if newest else "no checkpoint was complete"
        again = f"resume with --resume --name {name}" if newest else "start it again"
        print(f"error: a process of the run stopped (torchrun exit code {code}; its summary is above); {kept}; {again}",
              file=sys.stderr)
    raise SystemExit(code)


def restarted(resume: bool, overwrite: bool) -> tuple[bool, bool]:
    """(resume, overwrite) as this process must take them: a torchrun restart of failed ranks continues the run."""
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return True, False
    return resume, overwrite


def run_config(config_path: Path | None, overrides: list[str], *, dry_run: bool, resume: bool, overwrite: bool = False):
    """The checked config of a `train` command (on --resume: the run's saved one, scalerl/config/resume.py), or None
    after printing it for --dry-run."""
    config = checked_config(config_path, overrides, resume, overwrite)
    if dry_run:
        from scalerl.jobs.config_reference import commented_dump

        print(commented_dump(config), end="")
        dry_run_checks(config)
        return None
    return config


def dry_run_checks(config) -> None:
    """--dry-run: what can be checked without training (scalerl/jobs/preflight.py), as YAML comments after the config;
    each problem one `error:` line on stderr, then exit 2."""
    from scalerl.jobs.preflight import preflight

    report, problems = preflight(config)
    print("".join(f"# checked: {line}\n" for line in report), end="", flush=True)
    if problems:
        print("".join(f"error: {line}\n" for line in problems), end="", file=sys.stderr)
        raise SystemExit(2)


def launch(config_path: Path | None, overrides: list[str], *, dry_run: bool, resume: bool, debug: bool,
           overwrite: bool = False, producer: Any = None) -> None:
    """`python -m scalerl.train`, `rl-train` and `scalerl launch --ray`: build the config, then print it (--dry-run)
    or train. `producer`: where an async run's producer runs (a Ray actor under `scalerl launch --ray`; default a
    process beside the learner). (`scalerl train` does the same in scalerl/cli/main.py.)"""
    setup_logging()
    resume, overwrite = restarted(resume, overwrite)
    with guarded(debug):
        config = run_config(config_path, overrides, dry_run=dry_run, resume=resume, overwrite=overwrite)
        if config is not None:
            from scalerl.trainer.loop import train  # torch is imported only now

            train(config, resume=resume, overwrite=overwrite, producer=producer)
