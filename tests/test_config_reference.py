"""The config reference from the code (scalerl/config/reference.py, `scalerl config`), and errors that help:
the nearest key for a misspelled one, an environment's allowed keys, a YAML error's line and column."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from scalerl.config import ALGORITHMS, Config, load_config
from scalerl.config.reference import config_reference, model_keys
from scalerl.envs.registry import ENVIRONMENTS
from scalerl.errors import ScaleRLError
from scalerl.jobs.config_reference import env_args_reference
from tests.conftest import run_cli


def _leaf_fields(model: type[BaseModel], prefix: str = ""):
    """Every leaf field of a model and its sub-models (a list of sections too), walked independently of reference.py."""
    from typing import get_args

    for name, field in model.model_fields.items():
        sections = [k for k in (field.annotation, *get_args(field.annotation)) if isinstance(k, type) and issubclass(k, BaseModel)]
        for section in sections:
            yield from _leaf_fields(section, f"{prefix}{name}.")
        if not sections:
            yield f"{prefix}{name}", field


def test_every_config_key_has_a_description():
    """A key added to the schema without a description fails here (the reference and its docs page would show none)."""
    models = [Config, *ALGORITHMS.values(), *(cls.Config for cls in ENVIRONMENTS.values())]
    missing = [f"{m.__name__}.{key}" for m in models for key, field in _leaf_fields(m)
               if not (field.description or "").strip()]
    assert missing == []
    assert all(k.description for k in config_reference())
    assert all(k.description for keys in env_args_reference().values() for k in keys)


def test_the_reference_covers_every_leaf_with_type_and_default():
    keys = {k.key: k for k in config_reference()}
    assert keys["optim.lr"].type == "float" and keys["optim.lr"].default == "0.0001" and "learning rate" in keys["optim.lr"].description
    assert keys["rollout.group_size"].default == "8"
    assert keys["algorithm.kl.beta"].type == "float"
    assert "ppo only" in keys["algorithm.gamma"].description  # a key only some objectives have says so
    assert keys["model.tokenizer"].type == "str | null"
    assert "reward.components[].function" in keys
    # every leaf of every section appears
    for section, field in Config.model_fields.items():
        if section != "algorithm" and isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            assert {k.key for k in model_keys(field.annotation, section + ".")} <= set(keys)
    assert [k.key for k in config_reference("optim")][:2] == ["optim.lr", "optim.betas"]
    assert all(k.key.startswith("algorithm.kl.") for k in config_reference("algorithm.kl"))


def test_env_args_reference_lists_each_environments_options():
    ref = env_args_reference()
    assert set(ref) == set(ENVIRONMENTS)
    math = {k.key: k for k in ref["math"]}
    assert math["env.args.eval_split"].default == "null" and math["env.args.eval_split"].description


def test_scalerl_config_prints_keys_and_env_args():
    out = run_cli("-m", "scalerl.cli.main", "config", "optim", timeout=60)
    assert out.returncode == 0, out.stderr
    assert "optim.lr: float = 0.0001" in out.stdout and "AdamW peak learning rate." in out.stdout
    assert "rollout." not in out.stdout
    env = run_cli("-m", "scalerl.cli.main", "config", "env.args.code", timeout=60)
    assert env.returncode == 0 and "# env.name: code" in env.stdout and "env.args.timeout_s" in env.stdout
    bad = run_cli("-m", "scalerl.cli.main", "config", "optimm", timeout=60)
    assert bad.returncode == 2 and "did you mean `optim`?" in bad.stderr


@pytest.mark.parametrize("key,suggested", [("optim.learning_rate", "optim.lr"), ("rollout.group", "rollout.group_size"),
                                           ("rollout.num_generations", "rollout.group_size"), ("trian.steps", "train")])
def test_unknown_key_suggests_the_nearest(key, suggested):
    with pytest.raises(ScaleRLError) as err:
        load_config(None, [f"{key}=1"])
    assert f"did you mean `{suggested}`?" in str(err.value) and "\n" not in str(err.value)


def test_unknown_env_arg_lists_the_allowed_keys():
    from scalerl.envs.registry import validate_env_args

    with pytest.raises(ScaleRLError) as err:
        validate_env_args("math", {"eval_sise": 3})
    msg = str(err.value)
    assert msg.startswith("env.args.eval_sise: unknown option of environment math; did you mean `env.args.eval_size`?")
    assert "allowed: data_file, hf_dataset" in msg


def test_broken_yaml_keeps_line_and_column(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  path: builtin\noptim:\n  lr: [1e-4\n  eps: 1\n")
    with pytest.raises(ScaleRLError) as err:
        load_config(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "line 5, column 6" in msg, msg


def test_dry_run_output_is_commented_and_shows_env_args(tmp_path):
    """--dry-run prints each key's description as a comment above it, every section too, and the environment's own
    options in full (not `args: {}`); the YAML still loads back into the same config."""
    import yaml

    from scalerl.config import dump_config
    from scalerl.config.reference import SECTIONS

    proc = run_cli("-m", "scalerl.cli.main", "train", "--dry-run", "--set", "env.name=math", "--set", f"log.run_dir={tmp_path}",
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for section in SECTIONS:
        at = lines.index(f"{section}:")
        assert lines[at - 1].startswith("# ") and len(lines[at - 1]) > 10, section
    assert lines[lines.index("  lr: 0.0001") - 1] == "  # AdamW peak learning rate"
    assert lines[lines.index("    eval_size: 50") - 1].startswith("    # Held-out problems for the greedy pass rate")
    shown = yaml.safe_load(proc.stdout)
    assert shown["env"]["args"]["prompt_column"] == "prompt" and shown["env"]["args"]["data_file"] is None
    expected = load_config(None, ["env.name=math", f"log.run_dir={tmp_path}"])
    assert load_config(None, {k: v for k, v in _flat(shown).items()}) == expected.model_copy(
        update={"env": expected.env.model_copy(update={"args": shown["env"]["args"]})})
    assert dump_config(expected)  # the saved config (run folder) stays the plain dump


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key != "args":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
