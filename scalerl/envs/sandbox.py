"""Run untrusted Python source in a sandboxed subprocess with time, memory, process and network limits.

`run_sandboxed(source, ...)` writes the program to a fresh temporary directory, starts
`python -I scalerl/envs/sandbox_child.py` in a new session, and returns a `SandboxResult`. Two
isolation levels; `isolation="auto"` picks the strongest this machine allows, found once per
process by running a tiny program through the whole namespace path:

"namespaces" (Linux with unprivileged user namespaces; unshare(2), mount(2) and pivot_root(2) via
  ctypes, no helper binary): new user, mount, PID and network namespaces.
  - network: a network namespace with no interface up; nothing, loopback included, is reachable;
  - filesystem: the jail's root is a fresh tmpfs showing only the system's program and library
    folders (/usr, /bin, /lib...), the interpreter's own folders and the files of /etc that hold no
    secret (passwd, group, hosts, localtime, ld.so.*): home folders, /root, /etc/shadow, the
    trainer's files and the sockets in /run do not exist inside. Every mount is read-only, nosuid
    and nodev (only /dev/null, zero, full, random and urandom are devices); /tmp is a private tmpfs
    of `disk_bytes` holding the work directory /tmp/work (cwd, HOME, TMPDIR), gone when the run
    ends. A second, nested user namespace locks the read-only flags: the program cannot remount;
  - processes: its own PID namespace; when the program's main process ends, or at the wall-clock
    limit, the namespace's PID 1 dies and the kernel kills every process left in it (grandchildren
    and `setsid` escapees too). `max_processes` is enforced by a fresh pids cgroup where this
    process may create one (root, or a delegated cgroup), else by RLIMIT_NPROC, which inside a
    user namespace counts only the sandbox's own processes (Linux >= 5.14) but spares root;
  - the program keeps the host uid of the trainer, without capabilities outside its namespaces:
    run as root, it is root over the few read-only files the jail shows and nothing else.
"process" (fallback where namespaces are missing; weaker), three layers:
  - seccomp (a kernel filter, with no_new_privs): no fork, vfork, exec or clone of anything but a
    thread; signals only to itself; no ptrace, process_vm_readv/writev, pidfd, namespaces, mounts,
    io_uring, bpf, perf or keyrings; no socket() unless `network`;
  - Landlock (Linux >= 5.13): it reads only what the namespace level shows (above), its own
    /proc entry and the harmless devices, and writes only in its work directory (a fresh temporary
    directory, also HOME and TMPDIR): not the trainer's /proc/<pid>/environ, not /etc/shadow, not
    the user's files. Where the kernel is new enough (Landlock ABI >= 4 / >= 6) also no TCP unless
    `network`, and no signals or abstract Unix sockets to processes outside the sandbox;
  - an audit hook (PEP 578) refusing the same in Python (process creation, os.kill of another
    process, sockets, writes outside the work directory, other processes' /proc entries, imports
    of ctypes and _posixsubprocess), with clear messages. Audit hooks are not a security
    boundary: they stop naive code; the kernel layers above are what hold.
  A layer the kernel lacks is skipped with one warning per process. It runs in its own session
  and process group (killed at exit and at the deadline), with an environment of PATH and LANG
  only, and dies with its caller (PR_SET_PDEATHSIG). What this level cannot promise: the program
  runs as the trainer's user, so without Landlock it can read every file that user can, and with
  it still read the system folders; it shares the host's PID and network namespaces (it sees
  other processes in /proc listings and, with `network`, has the host's network); a hole in the
  kernel's filters is a hole in the sandbox. Use the namespace level for code you do not trust.
Both levels: RLIMIT_CPU `cpu_s` (SIGXCPU, SIGKILL one second later), RLIMIT_AS `memory_bytes`
(allocations fail with MemoryError), RLIMIT_FSIZE `disk_bytes`, no core files, a wall-clock limit
`timeout_s` after which the whole tree gets SIGKILL, stdout and stderr kept up to `output_bytes`
each (the rest is read and dropped, so a chatty program can neither block nor fill memory).

Results channel: the program starts with file descriptor 3 (`RESULTS_FD`) open on a pipe of its
own, returned as `SandboxResult.results` (up to `results_bytes`). A harness reports on it what the
program's own prints must not be able to push out of the stdout cap (`scalerl.envs.code` writes
its pass/fail lines there).

No shared state but the probe cache: safe to call from worker processes and threads.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from scalerl.errors import ScaleRLError

Isolation = Literal["auto", "namespaces", "process"]
CHILD = Path(__file__).with_name("sandbox_child.py")
GRACE_S = 1.0  # how long to keep reading after the main process ended (leftovers are then killed)
RESULTS_FD = 3  # the program's results channel (see the module docstring)
logger = logging.getLogger(__name__)
_WARNED: set[str] = set()  # process-level layers this machine lacks, warned about once


class SandboxSetupError(RuntimeError):
    """The jail could not be built (not a failure of the program)."""


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed program ended.

    `returncode` is the program's exit status (negative: killed by that signal); `killed_reason`
    is None for a normal exit, else "timeout" (wall clock), "cpu" (RLIMIT_CPU), "memory" (the
    program died of MemoryError) or "signal <NAME>". `results`: what was written to RESULTS_FD.
    """

    returncode: int
    stdout: str
    stderr: str
    results: str
    timed_out: bool
    killed_reason: str | None
    wall_s: float
    isolation: str


def run_sandboxed(
    source: str,
    *,
    timeout_s: float = 10.0,
    cpu_s: int = 10,
    memory_bytes: int = 1 << 30,
    max_processes: int | None = 16,
    network: bool = False,
    stdin: bytes = b"",
    disk_bytes: int = 16 << 20,
    output_bytes: int = 64 << 10,
    results_bytes: int = 1 << 20,
    isolation: Isolation = "auto",
) -> SandboxResult:
    """Run `source` as `__main__` of a fresh `python -I` in the sandbox (see the module docstring)."""
    level = resolve_isolation(isolation)
    result, setup_error = _run(source, level, timeout_s=timeout_s, cpu_s=cpu_s, memory_bytes=memory_bytes,
                               max_processes=max_processes, network=network, stdin=stdin,
                               disk_bytes=disk_bytes, output_bytes=output_bytes, results_bytes=results_bytes)
    if setup_error is not None:
        raise SandboxSetupError(f"sandbox ({level}) setup failed: {setup_error}")
    return result


def resolve_isolation(isolation: Isolation) -> str:
    """'auto' -> the strongest level this machine allows; an explicit level must be available."""
    if isolation == "process":
        return "process"
    missing = namespace_support_problem()
    if isolation == "namespaces" and missing is not None:
        raise ScaleRLError(f"sandbox isolation 'namespaces' is not available here ({missing}); use 'auto' or 'process'")
    if isolation not in ("auto", "namespaces"):
        raise ScaleRLError(f"sandbox isolation: unknown level '{isolation}'; use auto, namespaces or process")
    return "namespaces" if missing is None else "process"


@functools.cache
def namespace_support_problem() -> str | None:
    """None when the namespace jail works on this machine, else why not (probed once per process)."""
    if not sys.platform.startswith("linux"):
        return f"needs Linux, this is {sys.platform}"
    result, setup_error = _run("print('sandbox-ok')", "namespaces", timeout_s=20.0, cpu_s=10, memory_bytes=1 << 30,
                               max_processes=4, network=False, stdin=b"", disk_bytes=1 << 20, output_bytes=4096,
                               results_bytes=4096)
    if setup_error is not None:
        return setup_error
    if result.returncode != 0 or result.stdout != "sandbox-ok\n":
        return f"probe exited {result.returncode}: {result.stderr.strip()[-300:]}"
    return None


def _run(source: str, level: str, *, timeout_s: float, cpu_s: int, memory_bytes: int, max_processes: int | None,
         network: bool, stdin: bytes, disk_bytes: int, output_bytes: int,
         results_bytes: int) -> tuple[SandboxResult, str | None]:
    base, cgroup = Path(tempfile.mkdtemp(prefix="scalerl-sandbox-")), None
    try:
        workdir = base / "work"
        workdir.mkdir(mode=0o700)
        program = base / "program.py"
        program.write_text(source)
        status_r, status_w = os.pipe()
        results_r, results_w = os.pipe()
        settings = {
            "isolation": level, "workdir": str(workdir), "program": str(program), "status_fd": status_w,
            "results_fd": results_w,
            "cpu_s": int(cpu_s), "memory_bytes": int(memory_bytes), "disk_bytes": int(disk_bytes),
            "network": network, "max_processes": max_processes, "cgroup": None,
        }
        cgroup = _make_pids_cgroup(max_processes)
        if cgroup is not None:
            settings["cgroup"] = str(cgroup)
        # The interpreter's real file, not a venv's symlink to it: the jail replaces /tmp, where a venv may live,
        # and the child and the program need only the standard library (`-I`: no site-packages, no env vars).
        cmd = [os.path.realpath(sys.executable), "-I", str(CHILD), json.dumps(settings)]
        start = time.monotonic()
        with os.fdopen(status_r, "rb") as status_file, os.fdopen(results_r, "rb") as results_file:
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        pass_fds=(status_w, results_w), start_new_session=True, cwd=workdir,
                                        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"})
            finally:
                os.close(status_w)  # only the child holds them now: EOF once the child side is done
                os.close(results_w)
            out, err, status, results, timed_out = _collect(proc, status_file, results_file, stdin, start + timeout_s,
                                                            output_bytes, results_bytes)
        wall_s = time.monotonic() - start
    finally:
        _remove_tree(base)
        if cgroup is not None:
            _remove_cgroup(cgroup)
    parsed = {k: v for line in status.splitlines() for k, v in json.loads(line).items()}
    for layer in ("landlock", "seccomp"):
        if parsed.get(layer) and layer not in _WARNED:
            _WARNED.add(layer)
            logger.warning("sandbox (process): %s is off, so this level is weaker than documented: %s", layer, parsed[layer])
    if "setup_error" in parsed:
        return _result(-1, out, err, results, False, wall_s, level), parsed["setup_error"]
    # namespaces: the program is not our child; PID 1 reports its status (none when killed at the deadline)
    return _result(parsed.get("returncode", proc.returncode), out, err, results, timed_out, wall_s, level), None


PIDS_OVERHEAD = 2  # the bootstrap outside the namespaces and the namespace's PID 1


@functools.cache
def _pids_cgroup_parent() -> Path | None:
    """A pids-controller cgroup directory (this process's own) we may create children in, or None."""
    try:
        own = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
        for line in Path("/proc/self/mounts").read_text().splitlines():
            _, mount, fstype, opts = line.split()[:4]
            if fstype == "cgroup" and "pids" in opts.split(","):
                path = next(p for k, p in own.items() if "pids" in k.split(","))
            elif fstype == "cgroup2" and "" in own:
                path = own[""]
                if "pids" not in (Path(mount) / path.lstrip("/") / "cgroup.subtree_control").read_text().split():
                    continue
            else:
                continue
            candidate = Path(mount) / path.lstrip("/")
            if os.access(candidate, os.W_OK):
                return candidate
    except (OSError, StopIteration, ValueError):  # no readable cgroup setup: rely on RLIMIT_NPROC
        return None
    return None


def _make_pids_cgroup(max_processes: int | None) -> Path | None:
    """A fresh cgroup with pids.max = max_processes (+ the bootstrap's own), or None where we may not."""
    parent = _pids_cgroup_parent()
    if max_processes is None or parent is None:
        return None
    path = parent / f"scalerl-sandbox-{os.getpid()}-{time.monotonic_ns()}"
    try:
        path.mkdir()
        (path / "pids.max").write_text(str(max_processes + PIDS_OVERHEAD))
    except OSError:  # not delegated to us after all: rely on RLIMIT_NPROC
        if path.exists():
            path.rmdir()
        return None
    return path


def _remove_cgroup(path: Path) -> None:
    """rmdir once the killed processes have left it (that takes a moment after SIGKILL)."""
    for _ in range(100):
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.01)
    path.rmdir()


def _collect(proc: subprocess.Popen, status_file, results_file, stdin: bytes, deadline: float,
             cap: int, results_cap: int) -> tuple[bytes, bytes, str, bytes, bool]:
    """Feed stdin, read stdout/stderr (first `cap` bytes of each kept), the results channel (first
    `results_cap`) and the status lines until all close or the deadline passes; then kill the whole
    session. Returns (out, err, status, results, timed_out)."""
    kept = {proc.stdout: bytearray(), proc.stderr: bytearray(), status_file: bytearray(), results_file: bytearray()}
    caps = {proc.stdout: cap, proc.stderr: cap, results_file: results_cap}
    sel = selectors.DefaultSelector()
    for f in kept:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    pending = memoryview(stdin)
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    timed_out, ended_at, reading = False, None, set(kept)
    while reading:
        now = time.monotonic()
        if now >= deadline:
            timed_out = proc.poll() is None
            break
        if ended_at is None and proc.poll() is not None:
            ended_at = now
            _kill_session(proc)  # leftovers of the process mode; a no-op once a PID namespace is gone
        if ended_at is not None and now - ended_at > GRACE_S:
            break
        for key, _ in sel.select(timeout=min(deadline - now, 0.05)):
            f = key.fileobj
            if f is proc.stdin:
                try:
                    pending = pending[os.write(f.fileno(), pending[:65536]):]
                except BrokenPipeError:
                    pending = memoryview(b"")
                if not pending:
                    sel.unregister(f)
                    f.close()
                continue
            chunk = os.read(f.fileno(), 65536)
            if not chunk:
                sel.unregister(f)
                reading.discard(f)
            elif f is status_file:
                kept[f] += chunk
            else:
                kept[f] += chunk[: max(0, caps[f] - len(kept[f]))]  # the rest is read and dropped
    _kill_session(proc)
    proc.wait()
    sel.close()
    if not proc.stdin.closed:
        proc.stdin.close()
    proc.stdout.close()
    proc.stderr.close()
    return (bytes(kept[proc.stdout]), bytes(kept[proc.stderr]), kept[status_file].decode(), bytes(kept[results_file]),
            timed_out)


def _kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (the child leads its own session: start_new_session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone: nothing left to kill


def _result(returncode: int, out: bytes, err: bytes, results: bytes, timed_out: bool, wall_s: float,
            level: str) -> SandboxResult:
    stderr = err.decode(errors="replace")
    return SandboxResult(returncode=returncode if not timed_out else -signal.SIGKILL, stdout=out.decode(errors="replace"),
                         stderr=stderr, results=results.decode(errors="replace"), timed_out=timed_out, killed_reason=_killed_reason(returncode, stderr, timed_out),
                         wall_s=wall_s, isolation=level)


def _killed_reason(returncode: int, stderr: str, timed_out: bool) -> str | None:
    """timeout > cpu (SIGXCPU, or the SIGKILL of the hard CPU limit) > memory > other signal > None."""
    if timed_out:
        return "timeout"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "cpu" if returncode == -signal.SIGXCPU else "signal SIGKILL"
    lines = [line for line in stderr.splitlines() if line.strip()]
    if returncode != 0 and lines and lines[-1].startswith("MemoryError"):
        return "memory"
    if returncode < 0:
        return f"signal {signal.Signals(-returncode).name}"
    return None


def _remove_tree(path: Path) -> None:
    """Delete the temporary directory even if the program took away its own permissions."""

    def retry(func, p, _exc):
        os.chmod(os.path.dirname(p), 0o700)
        func(p)

    shutil.rmtree(path, onerror=retry)
