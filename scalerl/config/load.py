"""Loading the run configuration: a YAML file and `--set key.sub=value` overrides on the defaults,
validated into a `Config` (scalerl/config/root.py), with the first error on one line naming the dotted
key; and `dump_config`, the YAML written into the run directory.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from scalerl.config.root import Config
from scalerl.config.schema import ALGORITHMS
from scalerl.errors import ScaleRLError


def _location(loc: tuple) -> tuple:
    """The user's dotted path: without pydantic's validator names and the algorithm union's tag."""
    parts = [p for p in loc if not str(p).startswith(("function-after", "function-before"))]
    if len(parts) > 1 and parts[0] == "algorithm" and parts[1] in ALGORITHMS:
        parts.pop(1)
    return tuple(parts)


_NAMES_A_KEY = re.compile(r"^[a-z_]+\.[a-z_.]+[=: ]")


def _shown(value: Any) -> str:
    """A user's value in a one-line message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _format_error(err: ValidationError) -> str:
    """The first error, on one line, naming the dotted key."""
    return " ".join(_first_error(err).splitlines())


def _first_error(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = _location(first["loc"])
    where = ".".join(str(p) for p in loc)
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        parent = _section_at(first["loc"][:-1])
        where = ".".join(str(p) for p in loc)
        allowed = ", ".join(parent.model_fields) if parent else ""
        return f"{where}: unknown key{_suggestion(where)}; allowed here: {allowed}"
    if first["type"] == "literal_error":
        return f"{where}: {msg} (got {_shown(first['input'])})"
    if not where and _NAMES_A_KEY.match(msg):  # a cross-field check whose message starts with the key at fault
        return msg
    return f"{where or 'config'}: {msg}" + (f" (got {_shown(first['input'])})" if where and "input" in first and not isinstance(first["input"], dict) else "")


def _suggestion(where: str) -> str:
    """'; did you mean `optim.lr`?' for an unknown key (scalerl/config/suggest.py), or ''."""
    from scalerl.config.reference import dotted_keys
    from scalerl.config.suggest import nearest

    return nearest(re.sub(r"\.\d+\.", ".", where), dotted_keys())


def _section_at(loc: tuple) -> type[BaseModel] | None:
    cls: type[BaseModel] = Config
    for key in loc:
        if cls is Config and key in ALGORITHMS:  # the union's tag, right after "algorithm"
            cls = ALGORITHMS[key]
            continue
        if key == "algorithm" and cls is Config:
            continue
        if isinstance(key, int):  # an item of a list of sections, e.g. reward.components.0
            continue
        field = cls.model_fields.get(str(key))
        annotation = field.annotation if field is not None else None
        if get_origin(annotation) is list:
            annotation = get_args(annotation)[0]
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        cls = annotation
    return cls


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ScaleRLError(f"--set {dotted}: '{key}' is a value, not a section")
    node[keys[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """`key.sub=value` with the value parsed as YAML (so 1e-4, true, [1, 2] and null work)."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ScaleRLError(f"--set {item!r}: expected key.sub=value, e.g. --set optim.lr=3e-5")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    return key.strip(), value


def _holds_text(schema: type[BaseModel], dotted: str) -> bool:
    """Whether the setting at `dotted` is text (str or Path, possibly null) in `schema`."""
    *sections, leaf = dotted.split(".")
    for key in sections:
        field = schema.model_fields.get(key)
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return False
        schema = field.annotation
    field = schema.model_fields.get(leaf)
    kinds = set(get_args(field.annotation) or (field.annotation,)) if field is not None else set()
    return bool(kinds & {str, Path}) and kinds <= {str, Path, type(None)}


def _typed_override(item: str, schema: type[BaseModel] | None) -> tuple[str, Any]:
    """`parse_override`, except that a text setting gets the text as typed when YAML read something
    else: `--name 2024` (which the CLI passes as log.name=2024) names the run "2024", not the int."""
    key, value = parse_override(item)
    if schema is not None and value is not None and not isinstance(value, str) and _holds_text(schema, key):
        value = item.partition("=")[2].strip()
    return key, value


def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error on one line, with the line and column (1-based) where the parser stopped."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    what = " ".join(p for p in (getattr(err, "context", None), getattr(err, "problem", None)) if p) or str(err).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


def read_yaml_mapping(path: Path | None, example: str) -> dict[str, Any]:
    """The mapping in a --config YAML file ({} without one); one-line ScaleRLError otherwise."""
    if path is None:
        return {}
    if os.path.isdir(path):
        raise ScaleRLError(f"config file {path} is a directory: pass a YAML file ({example}) to --config")
    if not os.path.isfile(path):
        raise ScaleRLError(f"config file {path} does not exist: pass an existing YAML file to --config")
    try:
        tree = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as err:
        raise ScaleRLError(f"config file {path}: cannot read it ({err.strerror}); pass a readable YAML file to --config") from None
    except UnicodeDecodeError as err:
        raise ScaleRLError(f"config file {path} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}): "
                           "pass a YAML file to --config") from None
    except yaml.YAMLError as err:
        raise ScaleRLError(f"config file {path} is not valid YAML: {yaml_problem(err)}") from None
    if not isinstance(tree, dict):
        raise ScaleRLError(f"config file {path} must hold a mapping ({example})")
    return tree


_PATH_KEYS = (("model", "path"), ("model", "tokenizer"), ("reward", "model"), ("env", "chat_template"))


def _local(value: Any, folder: Path) -> Any:
    """`value` as an absolute path when it is a relative path naming something in `folder`, else `value`."""
    if not isinstance(value, str) or not value or os.path.isabs(value) or value.startswith("~") or ":" in value:
        return value
    return str((folder / value).resolve()) if os.path.exists(folder / value) else value


def resolve_relative_paths(tree: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Relative paths in a YAML file name files beside it, not in the current folder: the model and tokenizer
    folders, reward models, the chat template and every env.args value, each made absolute when it names
    something in the YAML's folder (so the saved config.yaml works from any folder). Hub ids, 'builtin' and
    other values are kept."""
    for section, key in _PATH_KEYS:
        if isinstance(tree.get(section), dict) and key in tree[section]:
            tree[section][key] = _local(tree[section][key], folder)
    reward = tree.get("reward")
    components = [tree.get("reward_components"), reward.get("components") if isinstance(reward, dict) else None]
    for comp in [c for group in components if isinstance(group, list) for c in group]:
        if isinstance(comp, dict) and "model" in comp:
            comp["model"] = _local(comp["model"], folder)
    args = tree.get("env", {}).get("args") if isinstance(tree.get("env"), dict) else None
    if isinstance(args, dict):
        for key, value in args.items():
            args[key] = _local(value, folder)
    return tree


def add_plugin_folder(folder: Path) -> None:
    """Plug-in modules (`module:function`, `module:Class`) named in a YAML file are found in the file's folder
    (after the import path's own entries, so they shadow nothing)."""
    text = str(folder.resolve())
    if text not in sys.path:
        sys.path.append(text)


def override_items(overrides: list[str] | dict[str, Any] | None, schema: type[BaseModel] | None = None):
    """(dotted key, value) pairs from `--set` strings or a dict; with `schema`, a `--set` string for
    a text setting keeps its text (`_typed_override`)."""
    if isinstance(overrides, dict):
        return overrides.items()
    return [_typed_override(item, schema) for item in overrides or []]


def load_config(path: Path | None = None, overrides: list[str] | dict[str, Any] | None = None) -> Config:
    """Defaults <- YAML file <- overrides, validated against the schema; raises ScaleRLError with a
    one-line message. What the config names outside itself (environment options, model folders,
    reward functions) is checked by `scalerl.config.checks.check_config`."""
    tree = read_yaml_mapping(path, "model:, env:, ...")
    if path is not None:
        resolve_relative_paths(tree, Path(path).resolve().parent)
        add_plugin_folder(Path(path).parent)
    items = override_items(overrides, Config)
    for key, value in items:
        _set_dotted(tree, key, value)
    try:
        config = Config.model_validate(tree)
    except ValidationError as err:
        message = _format_error(err)
        if path is not None and _in_file(path, err.errors()[0]["loc"], [str(key) for key, _ in items]):
            key, sep, rest = message.partition(": ")  # the file is where to fix it: say which
            message = f"{key} in {path}: {rest}" if sep and " " not in key else f"{message} (in {path})"
        raise ScaleRLError(message) from None
    return config


def _in_file(path: Path, loc: tuple, overridden: list[str]) -> bool:
    """Whether a validation error at `loc` is the YAML file's entry: the file has it and no override set it (or a
    section above or below it)."""
    parts = [str(p) for p in loc]
    if not loc or any(parts[:len(k)] == k or k[:len(parts)] == parts for k in (key.split(".") for key in overridden)):
        return False
    tree: Any = read_yaml_mapping(path, "model:, env:, ...")
    for part in loc:
        if not ((isinstance(tree, dict) and part in tree) or (isinstance(tree, list) and isinstance(part, int) and part < len(tree))):
            return False
        tree = tree[part]
    return True


def with_overrides(config: Config, overrides: dict[str, Any]) -> Config:
    """`config` with dotted-key `overrides` set, validated again (the Python API's keyword overrides)."""
    tree = yaml.safe_load(dump_config(config))
    for key, value in overrides.items():
        _set_dotted(tree, key, value)
    try:
        return Config.model_validate(tree)
    except ValidationError as err:
        raise ScaleRLError(_format_error(err)) from None


def dump_config(config: Config) -> str:
    tree = config.model_dump(mode="json")
    algorithm = tree["algorithm"]
    tree["algorithm"] = {"name": algorithm.pop("name"), **algorithm}  # the union's tag first, for the reader
    return yaml.safe_dump(tree, sort_keys=False)
