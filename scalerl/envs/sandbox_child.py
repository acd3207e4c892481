"""The in-sandbox side of `scalerl.envs.sandbox`: set up the jail, then run the program.

Run as a script (`python -I sandbox_child.py '<json settings>'`), never imported by ScaleRL: it
imports only the standard library, reads the program from the file `program`, and
reports how the program ended as one JSON line on `status_fd` (closed before untrusted code runs).

Isolation "namespaces":
  1. join the pids cgroup if one was made; unshare user (the host uid mapped to root inside),
     mount, PID and, unless network is allowed, network namespaces; fork: the child is PID 1;
  2. PID 1 mounts a fresh /proc, a private tmpfs on /tmp (holding the work directory) and empty
     tmpfs on /run and /var/run, then remounts every mount read-only, nosuid and nodev (harmless
     devices bind-mounted first so they keep working), keeping each mount's locked flags;
  3. PID 1 forks the worker and reaps every process until the worker exits (when PID 1 exits the
     kernel kills everything left in the namespace), then reports the worker's exit status;
  4. the worker enters a second user + mount namespace, which locks the read-only flags (a less
     privileged namespace cannot undo them), sets the resource limits and runs the program.
Isolation "process" (no namespaces): resource limits plus an audit hook that refuses network
calls, process creation, `ctypes` and writes outside the work directory. Audit hooks are not a
security boundary (PEP 578); this mode is the documented weaker fallback.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 32, 4096, 1024, 2048, 1 << 21
MS_REC, MS_PRIVATE = 16384, 1 << 18
CLONE_NEWNET, CLONE_NEWPID = 0x40000000, 0x20000000
PR_SET_PDEATHSIG = 1
WORKDIR = "/tmp/work"  # inside the namespace's private /tmp
SAFE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
               "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
SETUP_FAILED = 120


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def check(ret: int, what: str) -> None:
        if ret != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    return libc, check


def _enter_namespaces(flags: int, outer_uid: int, outer_gid: int) -> None:
    """unshare(flags | CLONE_NEWUSER) and become root of the new user namespace, mapped to
    `outer_uid`/`outer_gid` of the parent namespace (a process may always map its own ids)."""
    libc, check = _libc()
    check(libc.unshare(CLONE_NEWUSER | flags), "unshare")
    if outer_uid < 0:
        return  # no id map: files are still accessed as the same host user
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {outer_uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {outer_gid} 1")


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, flags to keep) for every mount this process sees, from /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # octal escapes such as \\040
            flags = 0
            for opt in fields[5].split(","):
                flags |= MOUNT_FLAGS.get(opt, 0)
            points.append((point, flags))
    return points


def _jail_filesystem(disk_bytes: int) -> None:
    """Private /tmp (a tmpfs of `disk_bytes`, holding the work directory) and a fresh /proc; empty
    /run and /var/run (their Unix sockets would stay connectable on a read-only mount); then every
    mount read-only, nosuid and nodev except /tmp and a few harmless devices (/dev/null, ...)."""
    libc, check = _libc()
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    opts = f"size={disk_bytes},mode=0700".encode()
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mount tmpfs on /tmp")
    os.mkdir(WORKDIR, 0o700)
    for hidden in ("/run", "/var/run"):
        if os.path.isdir(hidden) and not os.path.islink(hidden):
            check(libc.mount(b"tmpfs", hidden.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=4096,mode=0755"), hidden)
    devices = [d for d in SAFE_DEVICES if os.path.exists(d)]
    for dev in devices:  # own mounts, so /dev itself can become nodev
        check(libc.mount(dev.encode(), dev.encode(), None, MS_BIND, None), f"bind {dev}")
    for point, flags in _mount_points():
        if point == "/tmp":
            continue
        flags |= MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if point in devices else MS_NODEV)
        ret = libc.mount(None, point.encode(), None, flags, None)
        if ret != 0 and not _is_readonly(point):
            check(ret, f"remount {point} read-only")


def _is_readonly(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:  # hidden under another mount or unreachable: nothing to write through
        return True


def _set_limits(s: dict, nproc: int | None) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (s["cpu_s"], s["cpu_s"] + 1))  # SIGXCPU, then SIGKILL
    resource.setrlimit(resource.RLIMIT_AS, (s["memory_bytes"], s["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (s["disk_bytes"], s["disk_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if nproc is not None:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _count_processes(uid: int) -> int:
    """Processes of `uid` now (RLIMIT_NPROC counts them all when there is no user namespace)."""
    count = 0
    for name in os.listdir("/proc"):
        try:
            count += name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid
        except FileNotFoundError:  # ended while we counted
            pass
    return count


def _audit_hook(workdir: str, network: bool):
    """Refuse what the process mode cannot stop with the kernel (best effort, see module doc)."""
    root = os.path.realpath(workdir) + os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    spawning = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen"}
    path_events = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod",
                   "os.chown", "os.truncate", "os.utime", "shutil.rmtree", "os.replace"}
    realpath, isinstance_, str_, bytes_ = os.path.realpath, isinstance, str, bytes

    def outside(path) -> bool:
        if isinstance_(path, int):
            return False  # an already open descriptor
        if isinstance_(path, bytes_):
            path = path.decode(errors="replace")
        return not (realpath(str_(path)) + "/").startswith(root) and path != "/dev/null"

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writing = (isinstance_(mode, str_) and any(c in mode for c in "wax+")) or bool(flags & write_flags)
            if writing and path is not None and outside(path):
                raise PermissionError(f"sandbox: writing outside the work directory is not allowed: {path}")
        elif event in path_events:
            if any(isinstance_(a, (str_, bytes_)) and outside(a) for a in args[:2]):
                raise PermissionError(f"sandbox: {event} outside the work directory is not allowed")
        elif event in spawning:
            raise PermissionError(f"sandbox: {event} is not allowed (no process isolation on this machine)")
        elif event == "import" and args[0] in ("ctypes", "_ctypes"):
            raise PermissionError("sandbox: ctypes is not allowed")
        elif not network and event.startswith("socket.") and event != "socket.__new__":
            raise PermissionError(f"sandbox: network access is not allowed ({event})")

    return hook


def _run_program(source: str, s: dict) -> None:
    """Run the untrusted program as `__main__` in this interpreter; never returns."""
    os.chdir(s["workdir"])
    os.environ.clear()
    os.environ.update({"HOME": s["workdir"], "TMPDIR": s["workdir"], "PATH": "/usr/local/bin:/usr/bin:/bin",
                       "LANG": "C.UTF-8"})
    path = os.path.join(s["workdir"], "main.py")
    with open(path, "w") as f:  # tracebacks show the program's lines
        f.write(source)
    sys.dont_write_bytecode = True
    if s["isolation"] == "process":
        sys.addaudithook(_audit_hook(s["workdir"], s["network"]))
    sys.argv = [path]
    code = compile(source, path, "exec")
    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    exit_code = 0
    try:
        exec(code, namespace)
    except SystemExit as exc:
        code_ = exc.code
        exit_code = code_ if isinstance(code_, int) else (0 if code_ is None else 1)
        if not isinstance(code_, int) and code_ is not None:
            print(code_, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        exit_code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(exit_code & 0xFF)


def _report(status_fd: int, status: dict) -> None:
    os.write(status_fd, (json.dumps(status) + "\n").encode())


def _reap_until(worker: int) -> int:
    """Reap every child (PID 1 inherits orphans) until `worker` ends; its status as a returncode."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == worker:
            return os.waitstatus_to_exitcode(status)


def _init(source: str, s: dict, status_fd: int) -> None:
    """PID 1 of the new namespace: build the jail, run the worker, reap everything; never returns."""
    libc, _ = _libc()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the bootstrap outside dies -> the namespace dies
    try:
        _jail_filesystem(s["disk_bytes"])
    except OSError as err:
        _report(status_fd, {"setup_error": str(err)})
        os._exit(SETUP_FAILED)
    worker = os.fork()
    if worker == 0:
        try:
            _enter_namespaces(CLONE_NEWNS, -1, -1)  # locks the read-only mounts; /proc is read-only now
        except OSError as err:
            _report(status_fd, {"setup_error": str(err)})
            os._exit(SETUP_FAILED)
        os.close(status_fd)
        _set_limits(s, s["max_processes"])  # counted inside this user namespace only
        _run_program(source, {**s, "workdir": WORKDIR})
    _report(status_fd, {"returncode": _reap_until(worker)})
    os._exit(0)


def main() -> None:
    s = json.loads(sys.argv[1])
    with open(s["program"]) as f:
        source = f.read()
    status_fd = s["status_fd"]
    if s["cgroup"] is not None:  # a pids cgroup bounds the whole tree (RLIMIT_NPROC spares root)
        try:
            with open(os.path.join(s["cgroup"], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except OSError as err:
            _report(status_fd, {"setup_error": f"join cgroup {s['cgroup']}: {err}"})
            os._exit(SETUP_FAILED)
    if s["isolation"] == "process":
        os.close(status_fd)
        limit = s["max_processes"]
        _set_limits(s, None if limit is None else limit + _count_processes(os.getuid()))
        _run_program(source, s)
    try:
        flags = CLONE_NEWNS | CLONE_NEWPID | (0 if s["network"] else CLONE_NEWNET)
        _enter_namespaces(flags, os.geteuid(), os.getegid())
    except OSError as err:
        _report(status_fd, {"setup_error": str(err)})
        os._exit(SETUP_FAILED)
    init = os.fork()  # the first child of a new PID namespace is its PID 1
    if init == 0:
        _init(source, s, status_fd)
    os.close(status_fd)
    _, status = os.waitpid(init, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


if __name__ == "__main__":
    main()
