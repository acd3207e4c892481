"""Bad input through the real CLI: every case must end in exit code 2 and exactly one stderr line,
`error: ...`, that names the field or file at fault, and no traceback.

Cases the config checks catch run with --dry-run (well under a second each); the ones only a run
can meet (the environment is built, scored, the model loaded) run one tiny step and are marked slow.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from scalerl.models.paths import builtin_model_dir


TINY_RUN = ["--set", "train.steps=1", "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2",
            "--set", "eval.max_tasks=2", "--set", "log.console=none"]

PLUGINS = {
    "env_exits.py": "import os\nos._exit(3)\n",
    "env_hangs.py": "import time\ntime.sleep(600)\n",
    "env_syntax.py": "class Env(:\n    pass\n",
    "env_raises.py": "raise RuntimeError('env module broken at import')\n",
    "rew_exits.py": "import os\nos._exit(3)\n",
    "rew_hangs.py": "import time\ntime.sleep(600)\n",
    "rew_syntax.py": "def f(prompts, completions, **kw)\n    return [0.0] * len(completions)\n",
    "rew_raises.py": "raise RuntimeError('reward module broken at import')\n",
    "bad_envs.py": textwrap.dedent("""\
        from scalerl.envs.arithmetic import ArithmeticEnv

        class InitRaises(ArithmeticEnv):
            def __init__(self, config=None):
                raise RuntimeError("cannot open the task database")

        class EmptyPool(ArithmeticEnv):
            def train_tasks(self):
                return []

        class ScoreRaises(ArithmeticEnv):
            def score(self, task, completion):
                return 1 / 0
    """),
}


def _unwritable(base: Path) -> Path | None:
    """A folder this process really cannot create folders in (chmod does not stop root; /sys does)."""
    locked = base / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    for candidate in (locked, Path("/sys"), Path("/proc")):
        try:
            os.rmdir(tempfile.mkdtemp(dir=candidate))
        except OSError:
            return candidate
    return None


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> dict[str, str]:
    """The bad files, made once: {name: path} for the placeholders of the cases' arguments."""
    d = tmp_path_factory.mktemp("bad")
    (d / "plugins").mkdir()
    for name, text in PLUGINS.items():
        (d / "plugins" / name).write_text(text)
    (d / "binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    (d / "latin1.yaml").write_bytes("optim:\n  lr: 1.0e-4\n# r\u00e9sum\u00e9\n".encode("latin-1"))
    (d / "a_folder").mkdir()
    (d / "a_file").write_text("not a folder\n")
    (d / "tasks_latin1.jsonl").write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9=", "answer": "1"}\n')
    for name in ("truncated", "list_config", "no_tokenizer"):
        shutil.copytree(builtin_model_dir(), d / name)
    weights = d / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (d / "list_config" / "config.json").write_text("[1, 2]\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (d / "no_tokenizer" / name).unlink()
    unwritable = _unwritable(d)
    return {"d": str(d), "unwritable": str(unwritable) if unwritable else ""}


def reward(module: str) -> list[str]:
    return ["--set", f"reward.components=[{{name: mine, function: '{module}:f'}}]"]


@dataclass
class Case:
    id: str
    description: str
    args: list[str]
    needles: list[str]  # what the error line must say (the field, the file, the problem)
    forbidden: list[str] = field(default_factory=list)  # what it must not (the wrong field, the wrong diagnosis)
    run: bool = False  # True: a tiny run (the check happens while training starts); False: --dry-run
    env: dict[str, str] = field(default_factory=dict)


CASES = [
    # item 14: tracebacks before
    Case("betas", "optim.betas=[2,3]", ["--set", "optim.betas=[2,3]"], ["optim.betas", "[0, 1)"]),
    Case("eps", "optim.eps=-1", ["--set", "optim.eps=-1"], ["optim.eps", "greater than 0"]),
    Case("lr-inf", "optim.lr=.inf", ["--set", "optim.lr=.inf"], ["optim.lr", "finite"]),
    Case("binary-config", "a binary --config file (PNG header)", ["--config", "{d}/binary.yaml"], ["binary.yaml", "not UTF-8"]),
    Case("latin1-config", "a Latin-1 --config file", ["--config", "{d}/latin1.yaml"], ["latin1.yaml", "not UTF-8", "offset"]),
    Case("latin1-tasks", "a Latin-1 tasks JSONL (env.args.data_file)", ["--set", "env.args.data_file={d}/tasks_latin1.jsonl"],
         ["env.args.data_file", "tasks_latin1.jsonl:2", "not UTF-8"], run=True),
    Case("truncated-weights", "model folder whose model.safetensors is cut to half", ["--set", "model.path={d}/truncated"],
         ["model.path", "model.safetensors", "cut short"]),
    Case("list-config-json", "model folder whose config.json is a JSON list", ["--set", "model.path={d}/list_config"],
         ["model.path", "config.json", "JSON list"]),
    Case("env-syntax", "env plug-in module with a syntax error", ["--set", "env.name=env_syntax:Env"], ["env.name", "env_syntax", "SyntaxError"]),
    Case("env-raises-import", "env plug-in module that raises at import", ["--set", "env.name=env_raises:Env"],
         ["env.name", "env_raises", "RuntimeError", "broken at import"]),
    Case("env-raises-init", "env plug-in whose __init__ raises", ["--set", "env.name=bad_envs:InitRaises"],
         ["env.name=bad_envs:InitRaises", "RuntimeError", "cannot open the task database"], run=True),
    Case("reward-syntax", "reward module with a syntax error", reward("rew_syntax"), ["reward.components.0.function", "rew_syntax", "SyntaxError"]),
    Case("reward-raises-import", "reward module that raises at import", reward("rew_raises"),
         ["reward.components.0.function", "rew_raises", "RuntimeError"]),
    Case("empty-pool", "environment with an empty training pool", ["--set", "env.name=bad_envs:EmptyPool"],
         ["env.name=bad_envs:EmptyPool", "training pool is empty"], run=True),
    Case("score-raises", "environment whose score raises", ["--set", "env.name=bad_envs:ScoreRaises"],
         ["env.name=bad_envs:ScoreRaises", "score()", "ZeroDivisionError", "prompt '"], run=True),
    Case("unwritable-run-dir", "unwritable log.run_dir", ["--set", "log.run_dir={unwritable}/runs"], ["log.run_dir", "cannot create"]),
    Case("file-in-run-dir", "log.run_dir below a regular file", ["--set", "log.run_dir={d}/a_file/runs"],
         ["log.run_dir", "a_file is a file"]),
    Case("no-tokenizer", "model folder without tokenizer files", ["--set", "model.path={d}/no_tokenizer"],
         ["model.path", "no tokenizer files", "model.tokenizer"]),
    Case("no-tokenizer-separate", "model.tokenizer folder without tokenizer files", ["--set", "model.tokenizer={d}/no_tokenizer"],
         ["model.tokenizer", "no tokenizer files"]),
    # item 10: imports that end or freeze the trainer
    Case("env-exits-import", "env plug-in module that calls os._exit(3) at import", ["--set", "env.name=env_exits:Env"],
         ["env.name", "env_exits", "exit code 3"]),
    Case("env-hangs-import", "env plug-in module that sleeps at import (SCALERL_IMPORT_TIMEOUT_S=1)", ["--set", "env.name=env_hangs:Env"],
         ["env.name", "env_hangs", "did not finish within 1 s"], env={"SCALERL_IMPORT_TIMEOUT_S": "1"}),
    Case("reward-exits-import", "reward module that calls os._exit(3) at import", reward("rew_exits"),
         ["reward.components.0.function", "rew_exits", "exit code 3"]),
    Case("reward-hangs-import", "reward module that sleeps at import (SCALERL_IMPORT_TIMEOUT_S=1)", reward("rew_hangs"),
         ["reward.components.0.function", "rew_hangs", "did not finish within 1 s"], env={"SCALERL_IMPORT_TIMEOUT_S": "1"}),
    # item 15: accepted before, meaningless
    Case("group-size-1", "rollout.group_size=1 with grpo", ["--set", "rollout.group_size=1"], ["rollout.group_size=1", "grpo"]),
    Case("group-size-1-rloo", "rollout.group_size=1 with rloo", ["--set", "rollout.group_size=1", "--set", "algorithm.name=rloo"],
         ["rollout.group_size=1", "rloo"]),
    Case("temperature-inf", "rollout.temperature=inf", ["--set", "rollout.temperature=inf"], ["rollout.temperature", "finite"]),
    Case("temperature-nan", "rollout.temperature=nan", ["--set", "rollout.temperature=nan"], ["rollout.temperature", "finite"]),
    Case("name-escapes", "log.name=../../x", ["--set", "log.name=../../x"], ["log.name", "../../x", "one folder name"]),
    Case("name-escapes-flag", "--name ../x", ["--name", "../x"], ["log.name", "one folder name"]),
    Case("max-new-tokens", "rollout.max_new_tokens=64 on the built-in model's 64 positions", ["--set", "rollout.max_new_tokens=64"],
         ["rollout.max_new_tokens=64", "64 positions", "at most 63"]),
    Case("eval-max-new-tokens", "eval.max_new_tokens=1000 on 64 positions", ["--set", "eval.max_new_tokens=1000"],
         ["eval.max_new_tokens=1000", "64 positions"]),
    # item 16: wrong or misleading messages before
    Case("metrics-host", "log.metrics_host=no-such-host.invalid (blamed log.metrics_port)",
         ["--set", "log.metrics_port=0", "--set", "log.metrics_host=no-such-host.invalid"],
         ["log.metrics_host", "no-such-host.invalid"], forbidden=["log.metrics_port"]),
    Case("config-is-folder", "--config given a folder (said 'does not exist')", ["--config", "{d}/a_folder"],
         ["a_folder", "is a directory", "YAML file"], forbidden=["does not exist"]),
    Case("tasks-is-folder", "env.args.data_file given a folder (said 'does not exist')", ["--set", "env.args.data_file={d}/a_folder"],
         ["env.args.data_file", "is a directory", "JSONL file"], forbidden=["does not exist"], run=True),
    Case("hub-id-offline", "unreachable hub id in model.path (blamed model.tokenizer)", ["--set", "model.path=nobody/no-such-model"],
         ["model.path", "nobody/no-such-model"], forbidden=["model.tokenizer"], run=True, env={"HF_HUB_OFFLINE": "1"}),
]


def _params():
    return [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.run else []) for c in CASES]


@pytest.mark.parametrize("case", _params())
def test_bad_input_ends_in_one_line_naming_the_field(case, bad, fault, tmp_path):
    if "{unwritable}" in " ".join(case.args) and not bad["unwritable"]:
        pytest.skip("no folder on this machine that this process cannot write in")
    args = [a.replace("{d}", bad["d"]).replace("{unwritable}", bad["unwritable"]) for a in case.args]
    mode = TINY_RUN if case.run else ["--dry-run"]
    proc = run_cli("-m", "scalerl.cli.main", "train", "--set", f"log.run_dir={tmp_path / 'runs'}", *args, *mode,
                   timeout=120, env={"PYTHONPATH": f"{bad['d']}/plugins", **case.env})
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    fault("bad input", case.description, f"exit {proc.returncode}: {' | '.join(lines)}")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in case.needles:
        assert needle in lines[0], (needle, lines[0])
    for wrong in case.forbidden:
        assert wrong not in lines[0], (wrong, lines[0])


def test_numeric_run_names_stay_text_and_numbers_stay_numbers(fault, tmp_path):
    """`--name 2024` was refused (YAML read the override log.name=2024 as an int); a date too."""
    seen = []
    for name in ("2024", "2024-01-01", "1e3"):
        proc = run_cli("-m", "scalerl.cli.main", "train", "--name", name, "--set", "train.steps=7", "--set", "optim.lr=1e-4",
                       "--set", f"log.run_dir={tmp_path}", "--dry-run", timeout=60)
        assert proc.returncode == 0, proc.stderr
        resolved = yaml.safe_load(proc.stdout)
        assert resolved["log"]["name"] == name  # the text as typed, a str
        assert resolved["train"]["steps"] == 7 and resolved["optim"]["lr"] == 1e-4  # numeric fields still parse
        seen.append(f"--name {name} -> log.name {resolved['log']['name']!r}")
    fault("bad input", "--name 2024 / 2024-01-01 / 1e3 (refused before: YAML read them as int, date, float)",
          "exit 0: " + "; ".join(seen) + "; train.steps=7 and optim.lr=1e-4 still numbers")


def test_the_metrics_endpoint_blames_the_host_for_a_bad_address(fault):
    """At run time too (the config check catches it first in the CLI): the address is metrics_host's fault."""
    from scalerl.errors import ScaleRLError
    from scalerl.monitor.prometheus import PrometheusExporter

    with pytest.raises(ScaleRLError) as info:
        PrometheusExporter("run", host="no-such-host.invalid", port=0)
    message = str(info.value)
    fault("bad input", "Prometheus endpoint started on log.metrics_host=no-such-host.invalid", f"ScaleRLError: {message}")
    assert message.startswith("log.metrics_host:") and "log.metrics_port" not in message
