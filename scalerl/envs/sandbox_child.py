"""The in-sandbox side of `scalerl.envs.sandbox`: set up the jail, then run the program.

Run as a script (`python -I sandbox_child.py '<json settings>'`), never imported by ScaleRL: it
imports only the standard library, reads the program from the file `program`, and
reports how the program ended as one JSON line on `status_fd` (closed before untrusted code runs).
The program gets `results_fd` as file descriptor 3, its results channel; every other process of
the jail closes it, so the parent sees its end when the program's tree is gone.

Isolation "namespaces":
  1. join the pids cgroup if one was made; unshare user (the host uid mapped to root inside),
     mount, PID and, unless network is allowed, network namespaces; fork: the child is PID 1;
  2. PID 1 builds the jail's root on a tmpfs (the `_visible_paths` bind-mounted, a few harmless
     devices, a fresh /proc, a private tmpfs /tmp holding the work directory), pivots into it and
     detaches the host's root, then remounts every mount read-only, nosuid and nodev, keeping
     each mount's locked flags;
  3. PID 1 forks the worker and reaps every process until the worker exits (when PID 1 exits the
     kernel kills everything left in the namespace), then reports the worker's exit status;
  4. the worker enters a second user + mount namespace, which locks the read-only flags (a less
     privileged namespace cannot undo them), sets the resource limits and runs the program.
Isolation "process" (no namespaces): resource limits, then a Landlock ruleset and a seccomp
filter (each reported on the status line as None or why it is missing), then an audit hook that
refuses in Python what they refuse in the kernel. See scalerl/envs/sandbox.py for what each holds.
"""

from __future__ import annotations

import json
import os
import platform
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
# what the jail shows of the host besides the interpreter's folders (_visible_paths)
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/passwd", "/etc/group",
                "/etc/hosts", "/etc/nsswitch.conf", "/etc/localtime", "/etc/ld.so.cache", "/etc/ld.so.conf",
                "/etc/ld.so.conf.d")
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}  # no glibc wrapper
MNT_DETACH = 2
MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
               "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
SETUP_FAILED = 120
RESULTS_FD = 3  # scalerl.envs.sandbox.RESULTS_FD


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


def _visible_paths() -> list[str]:
    """Host paths the jail shows, read-only: the system's program and library folders, the
    interpreter's own folders and the files of /etc that hold no secret. Nothing else of the host
    (home folders, /root, /etc/shadow, the trainer's files, /run's sockets) exists inside."""
    interpreter = [os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix, os.path.dirname(sys.executable))]
    paths: list[str] = []
    for path in (*SYSTEM_PATHS, *interpreter):
        if os.path.lexists(path) and not any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths):
            paths.append(path)
    return paths


def _show(path: str, root: str, libc, check) -> None:
    """Make host `path` appear at the same place under `root`: a symlink as the same symlink, a
    folder or file as a recursive bind mount (made read-only with everything else later)."""
    target = root + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(path):
        os.symlink(os.readlink(path), target)
        return
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        open(target, "w").close()
    check(libc.mount(path.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"bind {path}")


def _jail_filesystem(disk_bytes: int, root: str) -> None:
    """Build the jail's root on a fresh tmpfs at `root` and pivot into it: the paths of
    `_visible_paths`, a few harmless devices (/dev/null, ...), a fresh /proc and a private /tmp (a
    tmpfs of `disk_bytes` holding the work directory); then every mount but /tmp read-only, nosuid
    and (devices aside) nodev, keeping each mount's locked flags."""
    libc, check = _libc()
    check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    check(libc.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1048576,mode=0755"), "mount the root")
    os.makedirs(root + "/tmp")  # first: an interpreter under the host's /tmp is then bound over it
    opts = f"size={disk_bytes},mode=0700".encode()
    check(libc.mount(b"tmpfs", (root + "/tmp").encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts), "mount tmpfs on /tmp")
    os.mkdir(root + WORKDIR, 0o700)
    for path in _visible_paths():
        _show(path, root, libc, check)
    os.makedirs(root + "/dev")
    devices = [d for d in SAFE_DEVICES if os.path.exists(d)]
    for dev in devices:
        open(root + dev, "w").close()
        check(libc.mount(dev.encode(), (root + dev).encode(), None, MS_BIND, None), f"bind {dev}")
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                       ("stderr", "/proc/self/fd/2")):
        os.symlink(link, f"{root}/dev/{name}")
    os.makedirs(root + "/proc")
    check(libc.mount(b"proc", (root + "/proc").encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    os.chdir(root)
    check(libc.syscall(SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")  # the old root lands on top ...
    check(libc.umount2(b".", MNT_DETACH), "detach the host's root")  # ... and goes, with every host mount under it
    os.chdir("/")
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


# The process level's kernel filter (seccomp, `_install_seccomp`): syscalls by number, per architecture.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SYSCALLS = {  # name: (x86_64, aarch64); None where the architecture has no such call
    "fork": (57, None), "vfork": (58, None), "execve": (59, 221), "execveat": (322, 281), "clone": (56, 220),
    "clone3": (435, 435), "kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131),
    "rt_sigqueueinfo": (129, 138), "rt_tgsigqueueinfo": (297, 240), "pidfd_open": (434, 434),
    "pidfd_send_signal": (424, 424), "pidfd_getfd": (438, 438), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272), "socket": (41, 198),
    "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "chroot": (161, 51), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427), "bpf": (321, 280),
    "perf_event_open": (298, 241), "userfaultfd": (323, 282), "keyctl": (250, 219), "add_key": (248, 217),
    "request_key": (249, 218),
}
DENIED = ("fork", "vfork", "execve", "execveat", "tkill", "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "ptrace",
          "process_vm_readv", "process_vm_writev", "kcmp", "unshare", "setns", "mount", "umount2", "pivot_root",
          "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
          "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open", "userfaultfd", "keyctl",
          "add_key", "request_key")
TO_SELF_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # first argument: the target's pid
CLONE_THREAD = 0x00010000
# refused at import by the audit hook: ctypes reaches any syscall, _posixsubprocess.fork_exec starts
# processes without an audit event
REFUSED_MODULES = ("ctypes", "_ctypes", "_posixsubprocess")
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_KILL, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
EPERM, ENOSYS = 1, 38
X32_SYSCALL_BIT = 0x40000000


def _seccomp_program(machine: str, pid: int, network: bool) -> list[tuple[int, int, int, int]]:
    """A classic-BPF seccomp filter as (code, jt, jf, k) rows: no new processes (threads only), no
    exec, signals only to this process, no reading or tracing of other processes, no namespaces,
    mounts, io_uring, bpf, perf or keyrings, and no sockets unless `network`; all else allowed."""
    ld, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JSET|K, JMP|JGE|K, RET|K
    nr_of = {name: nrs[0 if machine == "x86_64" else 1] for name, nrs in SYSCALLS.items()}
    deny = [nr_of[n] for n in DENIED + (() if network else ("socket",)) if nr_of[n] is not None]
    rows = [(ld, 0, 0, 4), (jeq, 1, 0, AUDIT_ARCH[machine]), (ret, 0, 0, RET_KILL), (ld, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI's numbers would pass every check below
        rows += [(jge, 0, 1, X32_SYSCALL_BIT), (ret, 0, 0, RET_ERRNO | EPERM)]
    for nr in deny:
        rows += [(jeq, 0, 1, nr), (ret, 0, 0, RET_ERRNO | EPERM)]
    for nr in (nr_of[n] for n in TO_SELF_ONLY):  # args[0]'s low half (little-endian) against our pid
        rows += [(jeq, 0, 4, nr), (ld, 0, 0, 16), (jeq, 0, 1, pid), (ret, 0, 0, RET_ALLOW), (ret, 0, 0, RET_ERRNO | EPERM)]
    rows += [(jeq, 0, 4, nr_of["clone"]), (ld, 0, 0, 16), (jset, 0, 1, CLONE_THREAD), (ret, 0, 0, RET_ALLOW),
             (ret, 0, 0, RET_ERRNO | EPERM)]
    rows += [(jeq, 0, 1, nr_of["clone3"]), (ret, 0, 0, RET_ERRNO | ENOSYS)]  # flags out of reach: C libraries fall back to clone
    return rows + [(ret, 0, 0, RET_ALLOW)]


def _install_seccomp(network: bool) -> str | None:
    """no_new_privs, then the `_seccomp_program` filter on this process (and threads it starts).
    None when installed, else why not (the audit hook then stands alone)."""
    machine = platform.machine()
    if machine not in AUDIT_ARCH or sys.byteorder != "little":
        return f"no seccomp filter for {machine}"
    import ctypes

    libc, check = _libc()
    rows = _seccomp_program(machine, os.getpid(), network)

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    program = (SockFilter * len(rows))(*(SockFilter(*row) for row in rows))
    try:
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        fprog = SockFprog(len(rows), program)
        check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "prctl(PR_SET_SECCOMP)")
    except OSError as err:
        return str(err)
    return None


# The process level's file, signal and network scope (Landlock, `_install_landlock`; Linux >= 5.13).
SYS_LANDLOCK = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}  # create_ruleset, add_rule, restrict_self
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}  # + REFER, TRUNCATE, IOCTL_DEV
FILE_ONLY_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | (1 << 14) | (1 << 15)  # what a rule on a file may grant
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1


def _install_landlock(workdir: str, network: bool) -> str | None:
    """Confine this process's file access to reading `_visible_paths` (the same host files the
    namespace level shows), its own /proc entry and the harmless devices, and everything in
    `workdir`; where the kernel's Landlock is new enough, also no TCP (unless `network`) and no
    signals or abstract Unix sockets outside the sandbox. None when installed, else why not."""
    import ctypes

    machine = platform.machine()
    if machine not in SYS_LANDLOCK:
        return f"no Landlock numbers for {machine}"
    create, add_rule, restrict = SYS_LANDLOCK[machine]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(create, None, ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        return f"Landlock is not available ({os.strerror(ctypes.get_errno())})"
    fs_all = FS_RIGHTS_BY_ABI[max(v for v in FS_RIGHTS_BY_ABI if v <= abi)]

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(fs_all, 0 if network or abi < 4 else NET_BIND_TCP | NET_CONNECT_TCP,
                       SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}"
    read = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    rules = [(p, read) for p in _visible_paths()] + [(f"/proc/{os.getpid()}", read), (workdir, fs_all)]
    rules += [(d, FS_READ_FILE | FS_WRITE_FILE) for d in SAFE_DEVICES if os.path.exists(d)]
    try:
        for path, allowed in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)  # follows a symlink (/bin -> usr/bin) to what it names
            try:
                rights = allowed & fs_all & (FILE_ONLY_RIGHTS if not os.path.isdir(f"/proc/self/fd/{fd}") else ~0)
                if libc.syscall(add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(PathBeneath(rights, fd)),
                                ctypes.c_uint32(0)) != 0:
                    return f"landlock_add_rule {path}: {os.strerror(ctypes.get_errno())}"
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(restrict, ruleset, ctypes.c_uint32(0)) != 0:
            return f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(ruleset)
    return None


def _audit_hook(workdir: str, network: bool):
    """Refuse what the process mode cannot stop with the kernel (best effort, see module doc)."""
    root = os.path.realpath(workdir) + os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    spawning = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen"}
    path_events = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod",
                   "os.chown", "os.truncate", "os.utime", "shutil.rmtree", "os.replace"}
    realpath, isinstance_, str_, bytes_ = os.path.realpath, isinstance, str, bytes
    own_pid = os.getpid()
    own_proc = (f"/proc/{own_pid}", "/proc/self", "/proc/thread-self")

    def as_str(path) -> str:
        return path.decode(errors="replace") if isinstance_(path, bytes_) else str_(path)

    def other_process(path) -> bool:
        """A path into another process's /proc folder (its environ, memory, open files...)."""
        if isinstance_(path, int):
            return False
        parts = realpath(as_str(path)).split("/")
        return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and int(parts[2]) != own_pid

    def outside(path) -> bool:
        if isinstance_(path, int):
            return False  # an already open descriptor
        path = as_str(path)
        return not (realpath(path) + "/").startswith(root) and path != "/dev/null"

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writing = (isinstance_(mode, str_) and any(c in mode for c in "wax+")) or bool(flags & write_flags)
            if writing and path is not None and outside(path):
                raise PermissionError(f"sandbox: writing outside the work directory is not allowed: {path}")
            if path is not None and other_process(path):
                raise PermissionError(f"sandbox: other processes' /proc entries are not readable: {path}")
        elif event in path_events:
            if any(isinstance_(a, (str_, bytes_)) and outside(a) for a in args[:2]):
                raise PermissionError(f"sandbox: {event} outside the work directory is not allowed")
        elif event in spawning:
            raise PermissionError(f"sandbox: {event} is not allowed (no process isolation on this machine)")
        elif event == "import" and args[0] in REFUSED_MODULES:
            raise PermissionError(f"sandbox: {args[0]} is not allowed")
        elif event in ("os.kill", "os.killpg") and args[0] != own_pid:
            raise PermissionError(f"sandbox: {event} of another process is not allowed")
        elif not network and event.startswith("socket.") and event != "socket.__new__":
            raise PermissionError(f"sandbox: network access is not allowed ({event})")

    return hook


def _run_program(source: str, s: dict) -> None:
    """Run the untrusted program as `__main__` in this interpreter; never returns."""
    if s["results_fd"] != RESULTS_FD:
        os.dup2(s["results_fd"], RESULTS_FD)
        os.close(s["results_fd"])
    os.chdir(s["workdir"])
    os.environ.clear()
    os.environ.update({"HOME": s["workdir"], "TMPDIR": s["workdir"], "PATH": "/usr/local/bin:/usr/bin:/bin",
                       "LANG": "C.UTF-8"})
    path = os.path.join(s["workdir"], "main.py")
    with open(path, "w") as f:  # tracebacks show the program's lines
        f.write(source)
    sys.dont_write_bytecode = True
    if s["isolation"] == "process":
        for name in [m for m in sys.modules if m.split(".")[0] in REFUSED_MODULES]:
            del sys.modules[name]  # imported again, they meet the hook's import check
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
        _jail_filesystem(s["disk_bytes"], s["workdir"])
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
    os.close(s["results_fd"])
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
        limit = s["max_processes"]
        _set_limits(s, None if limit is None else limit + _count_processes(os.getuid()))
        libc, _ = _libc()
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the caller gone (killed too): the program goes with it
        _report(status_fd, {"landlock": _install_landlock(s["workdir"], s["network"]),
                            "seccomp": _install_seccomp(s["network"])})
        os.close(status_fd)
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
    os.close(s["results_fd"])
    _, status = os.waitpid(init, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


if __name__ == "__main__":
    main()
