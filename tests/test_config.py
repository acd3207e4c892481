"""load_config / dump_config: defaults, YAML, --set overrides and the error messages."""

import sys
import textwrap
from pathlib import Path

import pytest

from scalerl.config.checks import check_config
from scalerl.config import Config, dump_config, load_config, parse_override
from scalerl.errors import ScaleRLError


def _error(path=None, overrides=None) -> str:
    """The one-line error of building the config and checking what it names (as the CLI does)."""
    with pytest.raises(ScaleRLError) as info:
        check_config(load_config(path, overrides))
    return str(info.value)


def test_defaults_are_valid():
    config = load_config()
    assert config == Config()
    assert config.env.name == "arithmetic"
    assert config.batch_size == config.rollout.prompts_per_step * config.rollout.group_size


def test_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent("""\
        optim:
          lr: 0.001
          schedule: cosine
        rollout:
          group_size: 4
        algorithm:
          kl:
            beta: 0.05
    """))
    config = load_config(path)
    assert config.optim.lr == 0.001
    assert config.optim.schedule == "cosine"
    assert config.rollout.group_size == 4
    assert config.algorithm.kl.beta == 0.05
    assert config.algorithm.kl.needs_reference
    assert config.train.steps == Config().train.steps  # untouched defaults stay
    assert config.batch_size == config.rollout.prompts_per_step * 4


def test_empty_yaml_file_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_config(path) == Config()


def test_overrides_parse_types():
    config = load_config(None, ["optim.lr=3e-5", "train.steps=7", "model.trust_remote_code=true",
                                "optim.max_grad_norm=null", "optim.betas=[0.8, 0.95]", "log.name=run1"])
    assert isinstance(config.optim.lr, float) and config.optim.lr == 3e-5
    assert isinstance(config.train.steps, int) and config.train.steps == 7
    assert config.model.trust_remote_code is True
    assert config.optim.max_grad_norm is None
    assert config.optim.betas == (0.8, 0.95)
    assert config.log.name == "run1"


def test_overrides_win_over_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  lr: 0.001\n  warmup_steps: 5\n")
    config = load_config(path, ["optim.lr=0.002"])
    assert config.optim.lr == 0.002
    assert config.optim.warmup_steps == 5


def test_overrides_as_dict():
    config = load_config(None, {"optim.lr": 3e-5, "env.args.max_operand": 50})
    assert config.optim.lr == 3e-5
    assert config.env.args == {"max_operand": 50}


def test_parse_override_values():
    assert parse_override("train.steps=7") == ("train.steps", 7)
    assert parse_override("optim.lr=0.5") == ("optim.lr", 0.5)
    assert parse_override("a.b=true") == ("a.b", True)
    assert parse_override("a.b=null") == ("a.b", None)
    assert parse_override("a.b=[1, 2]") == ("a.b", [1, 2])
    assert parse_override(" a.b =x") == ("a.b", "x")  # the key is stripped
    assert parse_override("a.b=") == ("a.b", "")


def test_parse_override_exponent_without_dot_is_a_float():
    assert parse_override("optim.lr=1e-4") == ("optim.lr", 1e-4)


@pytest.mark.parametrize("bad", ["optim.lr", "=3", ""])
def test_malformed_override(bad):
    msg = _error(None, [bad])
    assert "expected key.sub=value" in msg


def test_override_into_a_value_raises():
    msg = _error(None, ["optim.lr=1", "optim.lr.x=2"])
    assert "optim.lr.x" in msg and "not a section" in msg


def test_unknown_key_names_dotted_key_and_allowed_keys():
    msg = _error(None, ["optim.lrr=1"])
    assert msg.startswith("optim.lrr:")
    assert "unknown key" in msg
    for allowed in ("lr", "betas", "warmup_steps", "schedule", "max_grad_norm"):
        assert allowed in msg


def test_unknown_nested_and_top_level_keys():
    msg = _error(None, ["algorithm.kl.bet=1"])
    assert msg.startswith("algorithm.kl.bet:")
    assert "beta" in msg and "estimator" in msg and "track" in msg
    msg = _error(None, ["optimizer.lr=1"])
    assert msg.startswith("optimizer:") or msg.startswith("optimizer.")
    assert "optim" in msg and "rollout" in msg


def test_unknown_key_in_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  stepz: 3\n")
    msg = _error(path)
    assert msg.startswith(f"train.stepz in {path}: unknown key; did you mean `train.steps`?"), msg  # the file to fix, named
    path.write_text("optim:\n  lr: -1\n")
    assert _error(path) == f"optim.lr in {path}: Input should be greater than 0 (got -1)"
    assert _error(path, ["optim.lr=-2"]) == "optim.lr: Input should be greater than 0 (got -2)"  # --set's value: not the file's
    assert _error(None, ["train.stepz=3"]).startswith("train.stepz: unknown key")


def test_wrong_type_names_key_and_value():
    msg = _error(None, ["optim.lr=abc"])
    assert msg.startswith("optim.lr:")
    assert "'abc'" in msg
    msg = _error(None, ["train.steps=0"])  # ge=1
    assert msg.startswith("train.steps:")


def test_bad_literal_names_key_and_allowed_values():
    msg = _error(None, ["optim.schedule=foo"])
    assert msg.startswith("optim.schedule:")
    for allowed in ("'constant'", "'linear'", "'cosine'"):
        assert allowed in msg
    assert "'foo'" in msg


def test_missing_config_file(tmp_path):
    path = tmp_path / "nope.yaml"
    msg = _error(path)
    assert str(path) in msg and "does not exist" in msg


def test_invalid_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("optim: [1, 2\n")
    msg = _error(path)
    assert str(path) in msg and "not valid YAML" in msg
    assert "\n" not in msg  # one line


def test_yaml_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    assert "must hold a mapping" in _error(path)


def test_mini_batch_must_divide_batch():
    # batch = 8 prompts x 8 completions = 64; 5 does not divide it, 16 does.
    batch = ["rollout.prompts_per_step=8", "rollout.group_size=8"]
    msg = _error(None, batch + ["train.mini_batch_size=5"])
    assert "train.mini_batch_size (5)" in msg and "64" in msg
    assert load_config(None, batch + ["train.mini_batch_size=16"]).train.mini_batch_size == 16


def test_micro_batch_must_divide_mini_batch():
    msg = _error(None, ["rollout.prompts_per_step=8", "rollout.group_size=8",
                        "train.mini_batch_size=8", "train.micro_batch_size=3"])
    assert "train.micro_batch_size (3)" in msg


def test_env_args_validated_through_env_config():
    msg = _error(None, ["env.args.max_operand=x"])
    assert "env.args.max_operand" in msg
    msg = _error(None, ["env.args.max_operandd=5"])
    assert "env.args.max_operandd" in msg
    assert load_config(None, ["env.args.max_operand=50"]).env.args == {"max_operand": 50}


def test_env_args_cross_field_error_mentions_the_problem():
    msg = _error(None, ["env.args.min_operand=10", "env.args.max_operand=5"])
    assert msg.startswith("env.args")
    assert "max_operand (5) must be >= min_operand (10)" in msg


def test_env_args_cross_field_error_has_no_dangling_dot():
    msg = _error(None, ["env.args.min_operand=10", "env.args.max_operand=5"])
    assert not msg.startswith("env.args.:")


def test_unknown_env_name_lists_known_names():
    msg = _error(None, ["env.name=arithmatic"])
    assert "env.name" in msg and "'arithmatic'" in msg
    from scalerl.envs.registry import ENVIRONMENTS

    assert f"[{', '.join(sorted(ENVIRONMENTS))}]" in msg and "arithmetic, " in msg
    assert "module:Class" in msg


def test_plugin_module_that_does_not_import():
    msg = _error(None, ["env.name=no_such_module_xyz:MyEnv"])
    assert msg.startswith("env.name:")
    assert "cannot import module 'no_such_module_xyz'" in msg


def test_plugin_attribute_missing_or_not_an_env():
    msg = _error(None, ["env.name=json:NoSuchClass"])
    assert "has no attribute 'NoSuchClass'" in msg
    msg = _error(None, ["env.name=json:JSONDecoder"])
    assert "is not an environment" in msg and "train_tasks" in msg


def test_plugin_env_args_validated(tmp_path, monkeypatch):
    (tmp_path / "my_test_plugin_env.py").write_text(textwrap.dedent("""\
        from pydantic import BaseModel, ConfigDict

        class Cfg(BaseModel):
            model_config = ConfigDict(extra="forbid")
            size: int = 3

        class MyEnv:
            Config = Cfg
            def __init__(self, config): self.config = config
            def train_tasks(self): return []
            def eval_tasks(self): return []
            def score(self, task, completion): return 0.0
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config(None, ["env.name=my_test_plugin_env:MyEnv", "env.args.size=5"])
    assert config.env.args == {"size": 5}
    msg = _error(None, ["env.name=my_test_plugin_env:MyEnv", "env.args.size=big"])
    assert "env.args.size" in msg
    sys.modules.pop("my_test_plugin_env", None)


def test_dump_config_round_trips(tmp_path):
    config = load_config(None, ["optim.lr=3e-5", "train.steps=7", "optim.max_grad_norm=null", "log.name=x",
                                "env.args.max_operand=50", "algorithm.loss_agg=sequence", "optim.betas=[0.8, 0.9]"])
    text = dump_config(config)
    path = tmp_path / "resolved.yaml"
    path.write_text(text)
    again = load_config(path)
    assert again == config
    assert dump_config(again) == text
    assert isinstance(again.log.run_dir, Path)


def test_plugin_imports_name_the_key_and_the_problem():
    from scalerl.plugins import import_function, import_object

    assert import_object("os.path:join", "x") is __import__("os").path.join
    assert import_function("json:dumps", "reward.components.0.function") is __import__("json").dumps
    for spec, needle in [("nocolon", "is not 'module:attribute'"), ("no_such_mod_xyz:f", "cannot import module 'no_such_mod_xyz'.*looked for in the current folder, the --config YAML's folder and PYTHONPATH"),
                         ("json:nope", "module 'json' has no attribute 'nope'"), ("json:decoder", "is a module, not a function")]:
        with pytest.raises(ScaleRLError, match=needle) as info:
            import_function(spec, "some.key")
        assert str(info.value).startswith("some.key: ")
    with pytest.raises(ScaleRLError) as info:  # a misspelt name: the closest one the module has
        import_function("json:dunps", "reward.components.0.function")
    assert str(info.value) == ("reward.components.0.function: module 'json' has no attribute 'dunps'; did you mean "
                               "'json:dumps'?")
    with pytest.raises(ScaleRLError, match=r"has no attribute 'decoder.JSONDecodr'; did you mean 'json:decoder.JSONDecoder'\?$"):
        import_object("json:decoder.JSONDecodr", "x")


def test_text_settings_keep_the_override_text():
    """The CLI passes `--name 2024` as log.name=2024, which YAML reads as an int: text settings take
    the text as typed, numeric settings still get numbers."""
    config = load_config(None, ["log.name=2024", "model.path=builtin", "log.project=0x1F", "log.run_dir=2024-01-01",
                                "train.steps=7", "optim.lr=1e-4"])
    assert config.log.name == "2024" and config.log.project == "0x1F" and config.log.run_dir == Path("2024-01-01")
    assert config.train.steps == 7 and config.optim.lr == 1e-4
    assert load_config(None, ["log.name=2024-01-01"]).log.name == "2024-01-01"  # a YAML date
    assert load_config(None, ["log.name='quoted'"]).log.name == "quoted"  # YAML's own strings are kept
    assert load_config(None, ["log.name=null"]).log.name is None  # null still means unset


@pytest.mark.parametrize("override", ["optim.lr=.inf", "optim.lr=inf", "rollout.temperature=inf", "rollout.temperature=nan",
                                      "algorithm.kl.beta=.nan", "optim.betas=[.nan, 0.9]", "reward.components=[{name: x, env: true, fallback: .inf}]"])
def test_float_settings_refuse_inf_and_nan(override):
    msg = _error(None, [override])
    assert msg.startswith(override.partition("=")[0]) and "finite number" in msg, msg


@pytest.mark.parametrize("override, needle", [("optim.betas=[2, 3]", "[0, 1)"), ("optim.betas=[0.9, 1.0]", "[0, 1)"),
                                              ("optim.betas=[-0.1, 0.9]", "[0, 1)"), ("optim.eps=-1", "greater than 0"),
                                              ("optim.eps=0", "greater than 0")])
def test_adamw_settings_out_of_range(override, needle):
    msg = _error(None, [override])
    assert msg.startswith(override.partition("=")[0] + ":") and needle in msg, msg


@pytest.mark.parametrize("algorithm, refused", [(["algorithm.name=grpo"], True), (["algorithm.name=cispo"], True),
                                                (["algorithm.name=rloo"], True),
                                                (["algorithm.name=reinforce_pp", "algorithm.baseline=group"], True),
                                                (["algorithm.name=reinforce_pp", "algorithm.baseline=batch"], False),
                                                (["algorithm.name=ppo"], False)])
def test_group_size_one_is_refused_where_advantages_are_group_relative(algorithm, refused):
    overrides = ["rollout.group_size=1", *algorithm]
    if not refused:
        assert load_config(None, overrides).rollout.group_size == 1  # a critic, or a batch baseline, still learns
        return
    msg = _error(None, overrides)
    assert msg.startswith("rollout.group_size=1") and algorithm[0].partition("=")[2] in msg, msg


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".", "", "a\\b", "x" * 256])
def test_log_name_is_one_folder_name(name):
    msg = _error(None, {"log.name": name})
    assert msg.startswith("log.name:") and "one folder name" in msg, msg


def test_preset_with_a_value_where_sections_go_is_a_one_line_error():
    for overrides, where in ((["preset=scalerl", "algorithm=5"], "algorithm:"), (["preset=scalerl", "algorithm=[1]"], "algorithm:"),
                             (["preset=[[]]"], "preset:")):
        assert _error(None, overrides).startswith(where)


def test_config_file_that_is_a_folder_or_not_utf8(tmp_path):
    assert "is a directory" in _error(tmp_path) and "does not exist" not in _error(tmp_path)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("log:\n  name: caf\u00e9\n".encode("latin-1"))
    msg = _error(latin1)
    assert str(latin1) in msg and "not UTF-8" in msg and "0xe9" in msg


@pytest.mark.parametrize("module, body, needle", [
    ("probe_plugin_exits", "import os\nos._exit(3)\n", "exit code 3"),
    ("probe_plugin_raises", "raise ValueError('nope')\n", "ValueError: nope"),
    ("probe_plugin_syntax", "def f(:\n", "SyntaxError"),
    ("probe_plugin_sys_exit", "import sys\nsys.exit(0)\n", "SystemExit"),
    ("probe_plugin_dependency", "import no_such_dependency_xyz\n", "imports 'no_such_dependency_xyz'"),
])
def test_a_plugin_that_breaks_at_import_is_stopped_in_a_child_process(tmp_path, monkeypatch, module, body, needle):
    """The probe imports the module in a child with this process's sys.path: an os._exit there
    would otherwise end the test run itself."""
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    msg = _error(None, [f"env.name={module}:Env"])
    assert msg.startswith("env.name:") and module in msg and needle in msg, msg
    assert module not in sys.modules  # never imported here


def test_a_plugin_that_hangs_at_import_times_out(tmp_path, monkeypatch):
    (tmp_path / "probe_plugin_hangs.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SCALERL_IMPORT_TIMEOUT_S", "0.5")
    msg = _error(None, ["env.name=probe_plugin_hangs:Env"])
    assert msg.startswith("env.name:") and "did not finish within 0.5 s" in msg, msg


@pytest.mark.parametrize("overrides, expected", [
    ({}, False), ({"precision.mode": "standard"}, False), ({"precision.mode": "compressed"}, True),
    ({"train.precision": "fp32"}, False), ({"precision.mode": "compressed", "model.gradient_checkpointing": False}, False),
])
def test_compressed_recomputes_activations_unless_told_otherwise(overrides, expected, tmp_path):
    config = load_config(overrides=overrides)
    assert config.model.gradient_checkpointing is expected
    (tmp_path / "c.yaml").write_text(dump_config(config))  # the resolved value is what the run's config.yaml records
    assert load_config(tmp_path / "c.yaml").model.gradient_checkpointing is expected


def test_fp16_compute_is_for_standard_only():
    assert load_config(overrides={"precision.mode": "standard", "precision.compute": "fp16"}).precision_policy.loss_scaling
    with pytest.raises(ScaleRLError, match="precision.compute=fp16 applies to precision.mode=standard"):
        load_config(overrides={"precision.mode": "compressed", "precision.compute": "fp16"})


@pytest.mark.parametrize("overrides, needle", [
    ({"algorithm.policy_loss": "sapo", "algorithm.delta": 1.5}, "algorithm.delta with algorithm.policy_loss=sapo"),
    ({"algorithm.policy_loss": "vespo", "algorithm.importance_level": "sequence"},
     "algorithm.importance_level=sequence with algorithm.policy_loss=vespo"),
    ({"algorithm.policy_loss": "gmpo", "algorithm.importance_level": "sequence"},
     "algorithm.importance_level=sequence with algorithm.policy_loss=gmpo"),
    ({"algorithm.policy_loss": "clip_cov", "algorithm.clip_cov_low": 5.0, "algorithm.clip_cov_high": 1.0}, "algorithm.clip_cov_low"),
    ({"algorithm.name": "cispo", "algorithm.policy_loss": "sapo"}, "policy_loss"),  # CISPO is its own policy loss
    ({"algorithm.top_entropy_quantile": 0.0}, "top_entropy_quantile"),
    ({"algorithm.rollout_correction": "token_tis", "algorithm.tis_cap": 2.0}, "algorithm.rollout_correction=token_tis with algorithm.tis_cap"),
    ({"algorithm.rollout_correction": "icepop", "algorithm.policy_loss": "vespo"}, "algorithm.rollout_correction with algorithm.policy_loss=vespo"),
    ({"algorithm.rollout_correction": "geo_mis", "algorithm.rollout_rs_low": 3.0}, "algorithm.rollout_rs_low"),
    ({"algorithm.name": "ppo", "algorithm.distill_teacher": "builtin"}, "algorithm.distill_teacher with algorithm.name=ppo"),
])
def test_incompatible_policy_loss_pairs_are_refused_in_one_line(overrides, needle):
    message = _error(overrides=[f"{k}={v}" for k, v in overrides.items()])
    assert needle in message and "\n" not in message


def test_new_objective_options_are_accepted():
    config = load_config(overrides=["algorithm.name=cispo", "algorithm.importance_level=sequence", "algorithm.loss_agg=sequence_sum",
                                    "algorithm.top_entropy_quantile=0.2", "algorithm.kl.estimator=k3+"])
    assert config.algorithm.importance_level == "sequence" and config.algorithm.loss_agg == "sequence_sum"
    # a rollout-correction preset counts as the off-policy correction that async rollouts need
    check_config(load_config(overrides=["rollout.mode=async", "rollout.max_staleness=1", "algorithm.rollout_correction=geo_mis_token_tis"]))


@pytest.mark.parametrize("overrides, needle", [
    (["reward.normalize_components=true"], "reward.normalize_components needs reward.components"),
    (["reward.normalize_components=true", "rollout.group_size=1", "algorithm.name=reinforce_pp", "reward.components=[{name: env, env: true}]"],
     "reward.normalize_components with rollout.group_size=1"),
])
def test_normalize_components_is_refused_where_it_means_nothing(overrides, needle):
    message = _error(overrides=overrides)
    assert needle in message and "\n" not in message
