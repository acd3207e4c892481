"""`--dry-run` checks what it can without training (scalerl/jobs/preflight.py): data files, the model id, reward
functions; one `error:` line per problem and exit 2. Plug-in modules and relative paths resolve from the YAML's folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT, run_cli

ROWS = "".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(30))


def _dry_run(tmp_path: Path, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`scalerl train --dry-run` run as the console script runs it: the current folder is not on the import path (-P)."""
    full_env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
                "PATH": "/usr/bin:/bin", **(env or {})}
    return subprocess.run([sys.executable, "-P", "-m", "scalerl.cli.main", "train", "--dry-run",
                           "--set", f"log.run_dir={tmp_path / 'runs'}", *args],
                          check=False, capture_output=True, text=True, timeout=60, env=full_env, cwd=cwd or tmp_path)


def _errors(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert all(line.startswith("error: ") for line in lines), lines
    return lines


def test_a_good_data_file_is_counted(tmp_path):
    (tmp_path / "train.jsonl").write_text(ROWS)
    proc = _dry_run(tmp_path, "--set", f"env.args.data_file={tmp_path / 'train.jsonl'}")
    assert proc.returncode == 0, proc.stderr
    assert "# checked: env arithmetic: 30 training tasks, 200 held-out tasks" in proc.stdout
    assert yaml.safe_load(proc.stdout)["env"]["name"] == "arithmetic"  # the report is YAML comments


def test_a_bad_jsonl_row_fails_the_dry_run(tmp_path):
    (tmp_path / "train.jsonl").write_text(ROWS + '{"prompt": "1+1=", "answer": \n')
    (line,) = _errors(_dry_run(tmp_path, "--set", f"env.args.data_file={tmp_path / 'train.jsonl'}"))
    assert "env.args.data_file" in line and "train.jsonl:31: not valid JSON" in line


def test_a_missing_column_fails_the_dry_run(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "1+1="}\n' * 70)
    (line,) = _errors(_dry_run(tmp_path, "--set", "env.name=math", "--set", f"env.args.data_file={tmp_path / 'train.jsonl'}",
                               "--set", "env.args.eval_size=5"))
    assert "column 'prompt' is missing" in line


def test_an_unreachable_model_id_fails_the_dry_run(tmp_path):
    (line,) = _errors(_dry_run(tmp_path, "--set", "model.path=nobody/no-such-model"))
    assert line.startswith("error: model.path: nobody/no-such-model is not a local folder and not in the Hugging Face cache")


def test_a_broken_reward_module_fails_the_dry_run(tmp_path):
    (tmp_path / "raises.py").write_text("def score(prompts, completions, **kw):\n    raise KeyError('label')\n")
    (tmp_path / "broken.py").write_text("import no_such_package_here\n")
    (line,) = _errors(_dry_run(tmp_path, "--set", "reward.components=[{name: mine, function: 'raises:score'}]"))
    assert "reward.components.0.function: raises:score raised KeyError: 'label' on a sample row" in line
    (line,) = _errors(_dry_run(tmp_path, "--set", "reward.components=[{name: mine, function: 'broken:score'}]"))
    assert "reward.components.0.function" in line and "no_such_package_here" in line


def test_every_problem_gets_its_line(tmp_path):
    (tmp_path / "train.jsonl").write_text("not json\n")
    (tmp_path / "raises.py").write_text("def score(prompts, completions, **kw):\n    return [1.0, 2.0]\n")
    proc = _dry_run(tmp_path, "--set", "model.path=nobody/no-such-model", "--set", f"env.args.data_file={tmp_path / 'train.jsonl'}",
                    "--set", "reward.components=[{name: mine, function: 'raises:score'}]")
    lines = _errors(proc)
    assert [line.split(":")[1].strip() for line in lines] == ["model.path", "env.args.data_file"]
    assert "raises:score imports; not called (no sample row: the environment did not build)" in proc.stdout
    (tmp_path / "good.jsonl").write_text(ROWS)  # with rows to call it on, the reward's own problem gets its line
    (line,) = _errors(_dry_run(tmp_path, "--set", f"env.args.data_file={tmp_path / 'good.jsonl'}",
                               "--set", "reward.components=[{name: mine, function: 'raises:score'}]"))
    assert line.startswith("error: reward.components.0.function") and "returned 2 scores for 1 completions" in line


def test_a_good_reward_is_not_blamed_for_a_bad_data_file(tmp_path):
    """Without the user's rows (the data file is missing) the reward is imported, not called on some other row."""
    (tmp_path / "color.py").write_text("def score(prompts, completions, color, **kw):\n    return [1.0 for _ in completions]\n")
    proc = _dry_run(tmp_path, "--set", "env.name=reward_model", "--set", f"env.args.data_file={tmp_path / 'missing.jsonl'}",
                    "--set", "reward.components=[{name: color, function: 'color:score'}]")
    (line,) = _errors(proc)
    assert "missing.jsonl" in line and "color" not in line
    assert "# checked: reward color: color:score imports; not called (no sample row: the environment did not build)" in proc.stdout


def test_a_reward_module_in_the_current_folder_needs_no_pythonpath(tmp_path):
    (tmp_path / "exact.py").write_text("def score(prompts, completions, answers, **kw):\n"
                                       "    return [float(c == a) for c, a in zip(completions, answers)]\n")
    proc = _dry_run(tmp_path, "--set", "reward.components=[{name: mine, function: 'exact:score'}]")
    assert proc.returncode == 0, proc.stderr
    assert "# checked: reward mine: exact:score scored 1 on the first training row (prompt '70+82=', its answer as the completion '152')" in proc.stdout


def test_yaml_paths_and_plugins_resolve_from_the_yaml_folder(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "data").mkdir(parents=True)
    elsewhere.mkdir()
    (project / "data" / "train.jsonl").write_text(ROWS)
    (project / "myreward.py").write_text("def score(prompts, completions, **kw):\n    return [0.5] * len(completions)\n")
    (project / "run.yaml").write_text("env:\n  args:\n    data_file: data/train.jsonl\n"
                                      "reward:\n  components:\n    - {name: mine, function: 'myreward:score'}\n")
    proc = _dry_run(tmp_path, "--config", "../project/run.yaml", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout)  # what the run folder's config.yaml holds: a resume from any folder finds the file
    assert resolved["env"]["args"]["data_file"] == str(project / "data" / "train.jsonl")
    assert "30 training tasks" in proc.stdout and "scored 0.5 on the first training row" in proc.stdout
    # --set keeps the command line's meaning: relative to the current folder
    assert run_cli("-m", "scalerl.cli.main", "train", "--dry-run", "--set", "env.args.data_file=data/train.jsonl").returncode == 2
