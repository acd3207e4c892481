"""Config fuzz: hostile `--set key=value` overrides, keys drawn from the real config's fields.

Every input must end in one of two ways: a valid config (which also survives dump and reload), or
a ScaleRLError whose message is one line naming the key (or its section, for a cross-field check).
Any other exception is a traceback the user would see. The code path is the CLI's
(`load_config` + `check_config`), in-process for speed; a few examples also go through the real CLI.
"""

from __future__ import annotations

import random
import time
from typing import Literal, get_args, get_origin

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from conftest import run_cli
from scalerl.config.checks import check_config
from scalerl.config import ALGORITHMS, Config, dump_config, load_config
from scalerl.errors import ScaleRLError

MAX_EXAMPLES = 400


def _near(field: FieldInfo) -> list[str]:
    """Values at the edge of what a field takes: its literal choices, and each bound and its neighbours."""
    near = [str(v) for a in get_args(field.annotation) for v in (get_args(a) if get_origin(a) is Literal else ())]
    near += [str(v) for v in get_args(field.annotation) if get_origin(field.annotation) is Literal]
    for constraint in field.metadata:
        for bound in (getattr(constraint, name, None) for name in ("ge", "gt", "le", "lt")):
            if bound is not None:
                near += [repr(bound), repr(bound + 1), repr(bound - 1), repr(bound + 1e-9), repr(bound - 1e-9)]
    return near


def _keys(schema: type[BaseModel], prefix: str = "") -> dict[str, list[str]]:
    """{dotted setting: its edge values} for `schema`, sections included (a scalar where a section
    goes is hostile too); the algorithm union contributes the fields of all its members."""
    keys: dict[str, list[str]] = {}
    for name, field in schema.model_fields.items():
        annotation = field.annotation
        if name == "algorithm" and schema is Config:
            keys["algorithm"] = []
            for cls in ALGORITHMS.values():
                for key, near in _keys(cls, "algorithm.").items():
                    keys[key] = sorted(set(keys.get(key, []) + near))
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys[prefix + name] = []
            keys.update(_keys(annotation, f"{prefix}{name}."))
        else:
            keys[prefix + name] = _near(field)
    return keys


# The top-level spellings of two reward keys, and a few environment options (validated by its own Config).
NEAR = _keys(Config) | {k: [] for k in ("reward_components", "fusion_method", "env.args.max_operand", "env.args.operators",
                                        "env.args.train_file", "env.args.nope")}
KEYS = sorted(NEAR)

HOSTILE = [
    # wrong types, signs and sizes
    "", " ", "-1", "0", "-0", "1", "2", "3", "1.5", "-1e-9", "1e309", "-1e309", "1e-400", "9" * 400, str(2**63), str(2**64),
    "1_000", "0x1F", "0o17", "0b101",
    # inf / nan in every spelling YAML and float() know
    ".inf", "-.inf", ".nan", "inf", "-inf", "nan", "NaN", "Infinity",
    # YAML oddities: nulls, booleans of YAML 1.1, dates, quoting, anchors, tags, flow collections
    "null", "~", "Null", "true", "false", "yes", "no", "on", "off", "y", "2024", "2024-01-01", "2024-01-01 10:00:00", "12:30",
    "'quoted'", '"2024"', "'null'", "&a x", "*a", "!!binary aGVsbG8=", "!!python/object/apply:os.system ['true']", "!!str 5",
    "!!float 1", "? x", "- a", "a: b", ":", "=", "%", "@", "`", "#", "a #b", "[", "]", "{", "[]", "[1]", "[1, 2]", "[2, 3]",
    "[0.9, 1.0]", "[-1, 0.5]", "[.nan, 1]", "[1, 2, 3]", "{}", "{a: 1}", "{name: x}", "[{name: x}]", "[[]]", "[null]",
    # paths and names
    "..", ".", "/", "../../x", "a/b", "a\\b", "/etc/passwd", "/sys/nope", "~", "~/x", "~no_such_user_xyz/x", "builtin", "scalerl", "x" * 300,
    "nobody/no-such-model", "os:system", "json:loads", "no_such_mod_xyz:f", "a:b:c", "..:x", "é", "日本", "a\tb", "\u202e",
    # literals of the schema, valid and near-valid
    "grpo", "ppo", "cispo", "rloo", "reinforce_pp", "token", "tokens", "sequence", "prompt", "group", "batch", "none",
    "cosine", "bf16", "fp8", "cpu", "cuda", "hf", "vllm", "rich", "scalerl", "arithmetic", "math", "wandb", "[wandb]",
    "127.0.0.1", "0.0.0.0", "no-such-host.invalid", "::1",
]

values = st.one_of(
    st.sampled_from(HOSTILE),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
)


def _override(key: str) -> st.SearchStrategy[tuple[str, str]]:
    near = st.sampled_from(NEAR[key]) if NEAR[key] else values
    return st.tuples(st.just(key), st.one_of(near, values))


overrides = st.lists(st.sampled_from(KEYS).flatmap(_override), min_size=1, max_size=4)


# env.args' older spellings (scalerl/envs/base.py: renamed_args): the key is moved to its one name before validation,
# with a warning naming the new key, so an error about its value names the new one
OLDER_ENV_ARGS = {"train_file": "data_file", "data_path": "data_file", "file": "data_file", "num_eval": "eval_size"}


def _named(message: str, keys: list[str]) -> bool:
    """The message names one of the keys set (an older env.args spelling: its one name), or the section of one
    (a cross-field check of a section, e.g. reward.cap: warmup_steps ... window)."""
    def spelled(key: str) -> str:
        section, _, name = key.rpartition(".")
        return f"{section}.{OLDER_ENV_ARGS[name]}" if section == "env.args" and name in OLDER_ENV_ARGS else key
    return any(k in message or k.rpartition(".")[0] + ":" in message for key in keys for k in {key, spelled(key)})


def outcome_of(items: list[tuple[str, str]]) -> tuple[str, str]:
    """("valid", "") or ("error", message); anything else raises (the bug the fuzz looks for)."""
    args = [f"{key}={value}" for key, value in items]
    try:
        config = check_config(load_config(None, args))
    except ScaleRLError as err:
        return "error", str(err)
    return "valid", dump_config(config)


def test_hostile_overrides_give_a_valid_config_or_one_line_naming_the_key(fault, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative run folders and model paths resolve here, not in the checkout
    counts = {"valid": 0, "error": 0}

    @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(overrides)
    @example([("preset", "scalerl"), ("algorithm", "[1]")])  # combinations too rare to draw, each once a traceback
    @example([("preset", "scalerl"), ("algorithm", "5")])
    @example([("preset", "scalerl"), ("train.mini_batch_size", "1")])  # the derived micro-batch: name the key that set it
    @example([("preset", "[[]]")])
    @example([("log.name", "2024"), ("optim.betas", "[2, 3]")])
    @example([("log.metrics_port", "0"), ("log.metrics_host", "x" * 300)])
    @example([("log.run_dir", "x" * 300)])
    @example([("model.path", "x" * 300)])
    @example([("model.tokenizer", "~no_such_user_xyz/tok")])
    def prop(items):
        kind, text = outcome_of(items)
        counts[kind] += 1
        keys = [key for key, _ in items]
        if kind == "error":
            assert "\n" not in text and text.strip() == text and text, repr(text)
            assert _named(text, keys), (items, text)
        else:
            path = tmp_path / "resolved.yaml"
            path.write_text(text)
            assert dump_config(load_config(path)) == text, items  # a valid config survives dump and reload

    start = time.perf_counter()
    prop()
    elapsed = time.perf_counter() - start
    fault("bad input", f"config fuzz: {sum(counts.values())} hypothesis examples of 1-3 hostile --set overrides "
                       "(wrong types, negatives, inf/nan, huge, empty, paths, lists, YAML oddities) through load_config + check_config",
          f"{counts['valid']} valid configs (each survives dump and reload), {counts['error']} one-line ScaleRLErrors naming the key, "
          f"no other exception ({elapsed:.1f} s)")
    assert counts["error"] > 0 and counts["valid"] > 0


def test_a_few_hostile_overrides_through_the_real_cli_agree_with_in_process(fault, tmp_path):
    """The same check through `python -m scalerl.cli.main train --dry-run`: exit 0, or exit 2 with
    the in-process message as its one `error:` line, and never a traceback."""
    rng = random.Random(0)
    picks = [(rng.choice(KEYS), rng.choice(HOSTILE)) for _ in range(5)] + [("log.name", "2024"), ("optim.lr", ".inf")]
    seen = []
    for key, value in picks:
        proc = run_cli("-m", "scalerl.cli.main", "train", "--set", f"{key}={value}", "--set", f"log.run_dir={tmp_path}",
                       "--dry-run", timeout=60)
        kind, text = outcome_of([(key, value), ("log.run_dir", str(tmp_path))])
        assert "Traceback" not in proc.stderr, proc.stderr
        if kind == "valid":
            assert proc.returncode == 0, (key, value, proc.stderr)
        else:
            assert proc.returncode == 2 and proc.stderr.strip() == f"error: {text}", (key, value, proc.stderr)
        seen.append(f"{key}={value!r}: exit {proc.returncode}")
    fault("bad input", f"config fuzz through the real CLI: {len(picks)} hostile overrides with --dry-run",
          "; ".join(seen) + " (each matching the in-process result, no traceback)")
