"""Writing files so that a kill at any moment leaves the old version or the new one, never a torn one:
write a temporary file beside the target, fsync it, rename it over the target, fsync the folder.
Imports nothing of the project."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


def fsync_dir(folder: Path | str) -> None:
    """Make the entries of `folder` (a rename, a new file) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path | str, data: str | bytes, *, sync_folder: bool = True) -> None:
    """Replace `path` with `data` through `path.tmp` (fsynced, then renamed over); the folder is fsynced too
    unless `sync_folder` is False (a caller that writes several files fsyncs it once). A failed write removes
    the temporary file and leaves `path` as it was."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_folder:
        fsync_dir(path.parent)



@contextlib.contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """`with writing(path): f.write(...)`: an OSError without a file name (a buffered write, a flush, a background
    writer's) is raised again naming `path`, so the run's one-line error says which file failed."""
    try:
        yield
    except OSError as err:
        if err.errno is None or err.filename:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from err
