"""One run per folder: an exclusive `flock` on `<run_dir>/.lock`, held for the run's life.

Taken (by rank 0) before anything of the run is written, so a second `scalerl train --name same`,
started together or later, and a `--resume` of a run whose process is alive, are refused in one line
naming the holder's pid and host. The kernel releases the lock when the holding process dies, so a
stale lock file never blocks: whoever opens it next takes the lock.

The file is unlinked on release; a process that opened the old file before that and locks it after
sees that the path no longer names its file, and opens it again (the usual flock-and-unlink dance).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from scalerl.errors import ScaleRLError

LOCK_FILE = ".lock"


class RunLock:
    """`take(run_dir)` once; the lock lasts until `release()` or the process's end."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.path: Path | None = None
        self.created: list[Path] = []  # the folders `take` made, innermost first: a run that could not start leaves none

    def take(self, run_dir: Path) -> None:
        missing = [run_dir, *run_dir.parents]
        self.created = missing[: next(i for i, p in enumerate(missing) if p.exists())]
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_FILE
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # a run that could not start removed the folder it had made: make it again
                run_dir.mkdir(parents=True, exist_ok=True)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ScaleRLError(f"log.name: {run_dir} is in use by another run ({_holder(path)}); wait for it to end, "
                                   "stop it, or choose another --name") from None
            if _same_file(fd, path):
                break
            os.close(fd)  # the holder released and unlinked it between our open and our lock: open the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode())
        self.fd, self.path = fd, path

    def release(self) -> None:
        """Unlink the file and let go; the folders this lock created that nothing else wrote into go too."""
        if self.fd is None:
            return
        path, fd = self.path, self.fd
        self.fd = None
        try:
            path.unlink(missing_ok=True)
            for folder in self.created:  # a run that could not start leaves nothing
                if any(folder.iterdir()):
                    break
                folder.rmdir()
        except OSError:
            pass  # a read-only folder: the kernel still drops the lock below, and a stale file never blocks
        finally:
            os.close(fd)

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _holder(path: Path) -> str:
    """What the holder wrote in the file ("pid N on host H"); it writes just after locking, so wait a moment."""
    for _ in range(50):
        try:
            text = path.read_text().strip()
        except OSError:
            text = ""
        if text:
            return f"held by {text}"
        time.sleep(0.02)
    return "held by a process that has not yet said who it is"

