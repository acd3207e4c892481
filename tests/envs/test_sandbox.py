"""The sandbox: limits and containment, for both isolation levels where they apply.

Every test runs hostile code and then checks, from this (the trainer's) process, that it is still
here and that nothing leaked: no process, no file, no connection.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from scalerl.envs.sandbox import namespace_support_problem, resolve_isolation, run_sandboxed
from scalerl.errors import ScaleRLError

ROOT = Path(__file__).resolve().parents[2]
namespaces = pytest.mark.skipif(namespace_support_problem() is not None,
                                reason=f"no user namespaces here: {namespace_support_problem()}")
LEVELS = [pytest.param("namespaces", marks=namespaces), "process"]


def _processes_with(marker: bytes) -> list[int]:
    """Host PIDs whose command line contains `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if marker in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
            except OSError:  # ended while we looked
                continue
    return found


@pytest.mark.parametrize("level", LEVELS)
def test_runs_a_program_in_a_fresh_work_directory(level):
    r = run_sandboxed("import os, sys\nprint(os.getcwd() == os.environ['HOME'] == os.environ['TMPDIR'], os.listdir('.'))\n"
                      "print('err', file=sys.stderr)\nraise SystemExit(3)", isolation=level)
    assert (r.returncode, r.stdout, r.stderr, r.timed_out, r.killed_reason) == (3, "True ['main.py']\n", "err\n", False, None)
    assert r.isolation == level


def test_auto_picks_namespaces_where_available():
    assert resolve_isolation("auto") == ("namespaces" if namespace_support_problem() is None else "process")
    if namespace_support_problem() is not None:
        with pytest.raises(ScaleRLError, match="namespaces"):
            resolve_isolation("namespaces")


@pytest.mark.parametrize("level", LEVELS)
def test_infinite_loop_is_killed_at_the_wall_clock_limit(level):
    r = run_sandboxed("while True:\n    pass", timeout_s=1.0, cpu_s=30, isolation=level)
    assert r.timed_out and r.killed_reason == "timeout" and r.returncode == -9
    assert 1.0 <= r.wall_s < 2.5  # killed at the limit, not after the CPU limit of 30 s


@namespaces
def test_cpu_limit_kills_a_busy_program():
    r = run_sandboxed("while True:\n    pass", timeout_s=20, cpu_s=1)
    assert not r.timed_out and r.killed_reason == "cpu"


@pytest.mark.parametrize("level", LEVELS)
def test_20_gb_allocation_fails_inside_the_sandbox(level):
    r = run_sandboxed("x = bytearray(20 * 10**9)\nprint('allocated')", memory_bytes=512 << 20, isolation=level)
    assert r.killed_reason == "memory" and r.returncode == 1 and "allocated" not in r.stdout
    assert r.stderr.rstrip().endswith("MemoryError")


@namespaces
@pytest.mark.serial  # looks for any sandbox process on the machine: another xdist worker's sandboxed code would count
def test_fork_bomb_is_contained_and_leaves_no_process():
    marker = uuid.uuid4().hex
    bomb = f"# {marker}\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    start = time.monotonic()
    r = run_sandboxed(bomb, timeout_s=1.5, max_processes=16)
    assert r.killed_reason == "timeout" and time.monotonic() - start < 4
    time.sleep(0.2)
    assert _processes_with(b"sandbox_child.py") == []  # the whole tree is gone


@namespaces
def test_process_count_is_capped():
    program = ("import os, time\nn = 0\nfor _ in range(40):\n    try:\n        if os.fork() == 0:\n            time.sleep(5)\n"
               "            os._exit(0)\n        n += 1\n    except OSError:\n        break\nprint(n)")
    r = run_sandboxed(program, timeout_s=10, max_processes=8)
    assert r.returncode == 0 and int(r.stdout) == 7  # 8 processes: the program and 7 children
    assert r.wall_s < 4  # the sleeping children die with the program, nobody waits for them


@namespaces
def test_grandchild_that_outlives_its_parent_is_killed():
    marker = uuid.uuid4().hex
    program = ("import subprocess, sys\n"
               f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'], start_new_session=True)\n"
               "print('spawned')")
    r = run_sandboxed(program, timeout_s=10)
    assert r.returncode == 0 and r.stdout == "spawned\n" and r.wall_s < 5
    time.sleep(0.1)
    assert _processes_with(marker.encode()) == []


def test_process_level_refuses_to_start_processes():
    r = run_sandboxed("import subprocess\nsubprocess.run(['true'])", isolation="process")
    assert r.returncode == 1 and "_posixsubprocess is not allowed" in r.stderr  # subprocess imports it
    r = run_sandboxed("import os\nos.posix_spawn('/bin/true', ['true'], {})", isolation="process")
    assert r.returncode == 1 and "os.posix_spawn is not allowed" in r.stderr


@pytest.mark.parametrize("level", LEVELS)
def test_writes_outside_the_work_directory_do_not_reach_the_host(level):
    name = f"sandbox-escape-{uuid.uuid4().hex}"
    targets = [Path(tempfile.gettempdir()) / name, ROOT / name, Path.home() / name]
    program = (f"for path in {[str(t) for t in targets]!r}:\n    try:\n        open(path, 'w').write('x')\n"
               "        print('wrote', path)\n    except OSError as err:\n        print('refused', type(err).__name__)\n")
    r = run_sandboxed(program, isolation=level)
    assert r.returncode == 0, r.stderr
    assert not any(t.exists() for t in targets)
    refused = r.stdout.count("refused")
    # namespaces: /tmp is a private tmpfs there, so that write lands in the namespace and vanishes
    assert refused == (2 if level == "namespaces" else 3), r.stdout


@pytest.mark.parametrize("level", LEVELS)
def test_network_connection_does_not_arrive(level):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        program = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')\n"
                   "    print('connected')\nexcept OSError as err:\n    print('refused', type(err).__name__)\n")
        r = run_sandboxed(program, isolation=level)
        assert r.stdout.startswith("refused"), r.stdout + r.stderr
        with pytest.raises(socket.timeout):
            server.accept()


def test_output_is_capped_and_drained():
    r = run_sandboxed("import sys\nfor _ in range(200):\n    sys.stdout.write('x' * 10000)\nprint('done', file=sys.stderr)",
                      output_bytes=1000)
    assert r.returncode == 0 and r.stdout == "x" * 1000 and r.stderr == "done\n"


def test_stdin_is_delivered():
    r = run_sandboxed("print(input()[::-1])", stdin=b"abc\n")
    assert r.stdout == "cba\n"


@pytest.mark.parametrize("level", LEVELS)
def test_results_channel_is_kept_apart_from_the_capped_output(level):
    program = ("import os, sys\nos.write(3, b'first\\n')\nsys.stdout.write('x' * 200000)\nsys.stdout.flush()\n"
               "os.write(3, b'second\\n')\n")
    r = run_sandboxed(program, output_bytes=1000, isolation=level)
    assert r.returncode == 0 and r.stdout == "x" * 1000 and r.results == "first\nsecond\n"
