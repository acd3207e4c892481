"""Sandboxed programs that attack their caller and the host, at both isolation levels.

Each attack runs inside a real sandbox started by a *victim*: a separate Python process that plays
the trainer's reward worker (so an attack that kills its caller kills the victim, not pytest). The
victim holds a secret in its environment and the test holds one in a file of the same user (mode
600, outside the jail). An attack holds when the victim lives, no secret appears in anything the
program wrote, and the host is unchanged. The process level's kernel layers (seccomp, Landlock)
are attacked directly too: through the `ctypes` module a program can still find with `gc` once
its import is refused, which is what a determined attacker would do against the audit hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT
from scalerl.envs.code import score_solution
from scalerl.envs.sandbox import namespace_support_problem

SECRET = f"secret-{uuid.uuid4().hex}"
namespaces = pytest.mark.skipif(namespace_support_problem() is not None,
                                reason=f"no user namespaces here: {namespace_support_problem()}")
LEVELS = [pytest.param("namespaces", marks=namespaces), "process"]
AREA = {"namespaces": "sandbox (namespaces)", "process": "sandbox (process)"}

VICTIM = """
import json, os, sys
from scalerl.envs.sandbox import run_sandboxed
request = json.loads(sys.stdin.read())
program = request["program"].replace("VICTIM_PID", str(os.getpid()))
r = run_sandboxed(program, isolation=request["level"], timeout_s=10)
print(json.dumps({"returncode": r.returncode, "stdout": r.stdout, "stderr": r.stderr, "results": r.results,
                  "killed_reason": r.killed_reason, "victim": "alive"}))
"""

# ctypes as an attacker gets it at the process level, where `import ctypes` is refused
CTYPES = ("import gc\ntry:\n    import ctypes\nexcept Exception:  # PermissionError from the audit hook\n"
          "    ctypes = next(o for o in gc.get_objects() if type(o).__name__ == 'module' and o.__name__ == 'ctypes')\n"
          "libc = ctypes.CDLL(None, use_errno=True)\n")


@dataclass(frozen=True)
class Attack:
    id: str
    fault: str
    program: str  # VICTIM_PID and SECRET_FILE are filled in
    levels: tuple[str, ...] = ("namespaces", "process")


ATTACKS = [
    Attack("shadow", "reads /etc/shadow (the trainer runs as root here)",
           "try:\n    print(open('/etc/shadow').read())\nexcept OSError as e:\n    print('refused', type(e).__name__)"),
    Attack("user-file", "reads a mode-600 file of the trainer's user outside the jail",
           "try:\n    print(open('SECRET_FILE').read())\nexcept OSError as e:\n    print('refused', type(e).__name__)"),
    Attack("environ", "reads the caller's environment through /proc/<caller pid>/environ",
           "try:\n    print(open('/proc/VICTIM_PID/environ', 'rb').read())\nexcept OSError as e:\n"
           "    print('refused', type(e).__name__)"),
    Attack("environ-ctypes", "reads /proc/<caller pid>/environ with libc's open() through ctypes",
           CTYPES + "fd = libc.open(b'/proc/VICTIM_PID/environ', 0)\nbuf = ctypes.create_string_buffer(65536)\n"
           "print('read', libc.read(fd, buf, 65536), buf.raw) if fd >= 0 else print('refused errno', ctypes.get_errno())"),
    Attack("kill", "SIGKILLs its caller with os.kill(caller pid, 9)",
           "import os\ntry:\n    os.kill(VICTIM_PID, 9)\n    print('sent')\nexcept OSError as e:\n    print('refused', type(e).__name__)"),
    Attack("kill-ctypes", "SIGKILLs its caller with libc's kill() through ctypes",
           CTYPES + "print('kill returned', libc.kill(VICTIM_PID, 9), 'errno', ctypes.get_errno())"),
    Attack("fork-exec", "starts a process past the audit hook with _posixsubprocess.fork_exec",
           "try:\n    import _posixsubprocess\n    print('imported')\nexcept Exception as e:\n    print('refused', e)",
           levels=("process",)),
    Attack("fork-ctypes", "starts a process with libc's fork() through ctypes",
           CTYPES + "pid = libc.fork()\nif pid == 0:\n    libc._exit(0)\nprint('fork returned', pid)", levels=("process",)),
    Attack("socket-ctypes", "opens a socket with libc's socket() through ctypes",
           CTYPES + "print('socket returned', libc.socket(2, 1, 0), 'errno', ctypes.get_errno())", levels=("process",)),
    Attack("write-ctypes", "writes outside its work directory (the test's folder) with libc's open() through ctypes",
           CTYPES + "fd = libc.open(b'SECRET_FILE.written', 0o101, 0o644)\nprint('open returned', fd, 'errno', ctypes.get_errno())"),
]


def attack_once(level: str, program: str, secret_file: Path) -> dict:
    env = {**os.environ, "SCALERL_TEST_SECRET": SECRET}
    proc = subprocess.run([sys.executable, "-c", VICTIM], input=json.dumps({"program": program.replace("SECRET_FILE", str(secret_file)),
                                                                        "level": level}),
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert proc.returncode == 0, f"the victim died: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_text(SECRET)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_attack_does_not_reach_the_caller_or_the_host(level, attack, secret_file, fault):
    if level not in attack.levels:
        pytest.skip(f"not an attack at the {level} level (processes are allowed and contained there)")
    r = attack_once(level, attack.program, secret_file)
    seen = r["stdout"] + r["stderr"] + r["results"]
    assert r["victim"] == "alive"
    assert SECRET not in seen and "root:" not in seen, seen
    assert not Path(f"{secret_file}.written").exists()
    assert r["stdout"].strip(), r["stderr"]  # the attack ran to its report line
    for leaked in ("sent", "imported", "read "):
        assert not r["stdout"].startswith(leaked), r["stdout"]
    for call in ("fork", "socket", "open", "kill"):
        if r["stdout"].startswith(f"{call} returned"):
            assert r["stdout"].split()[2] == "-1", r["stdout"]
    fault(AREA[level], attack.fault, f"held: the caller lives, nothing leaked; the program saw: {r['stdout'].strip()[:90]}")


def test_root_in_the_jail_sees_no_host_files_beyond_the_system_folders(fault):
    if namespace_support_problem() is not None:
        pytest.skip(f"no user namespaces here: {namespace_support_problem()}")
    r = attack_once("namespaces", "import os\nprint(sorted(os.listdir('/')), sorted(os.listdir('/etc')))", Path("/nonexistent"))
    listing = r["stdout"]
    for hidden in ("'home'", "'work'", "'shadow'", "'var'", "'run'", "'sys'", "'opt'"):
        assert hidden not in listing, listing
    fault(AREA["namespaces"], "lists / and /etc to look for host secrets", f"held: only {listing.strip()[:150]}")


@pytest.mark.parametrize("level", LEVELS)
def test_a_correct_solution_that_prints_more_than_the_output_cap_still_scores(level, fault):
    chatty = "print('x' * 200000)\ndef f(x):\n    print('y' * 100000)\n    return x\n"
    tests = ["assert f(1) == 1", "assert f(2) == 2"]
    assert score_solution(chatty, tests, entry_point="f", isolation=level) == 1.0
    fault(AREA[level], "a correct solution printing 500 KB (the stdout cap is 64 KB)",
          "held: scored 1.0; the pass/fail lines travel on the results channel (fd 3)")


@pytest.mark.parametrize("level", LEVELS)
def test_spoofed_results_without_the_nonce_earn_nothing(level, fault):
    spoof = ("import os\nfor i in range(4):\n    line = f'{i} pass\\n0 {i} pass\\n'.encode()\n    os.write(1, line)\n"
             "    os.write(3, line)\ndef f(x):\n    return -1\n")
    assert score_solution(spoof, ["assert f(1) == 1", "assert f(2) == 2"], entry_point="f", isolation=level) == 0.0
    fault(AREA[level], "a wrong solution writing 'pass' lines to stdout and to the results channel",
          "held: scored 0.0 (lines without the run's 128-bit nonce count for nothing)")
