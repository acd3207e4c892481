"""The config reference, from the code: every key of the run configuration with its type, default and
description (the pydantic fields of scalerl/config/schema.py and root.py), and every environment's own
`env.args` (each environment's `Config`: `env_args_reference` in scalerl/jobs/config_reference.py, as the config
package imports no environment). `scalerl config [SECTION]` prints both; a docs page can be generated from them.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from scalerl.config.root import Config
from scalerl.config.schema import ALGORITHMS


@dataclass(frozen=True)
class ConfigKey:
    """One setting: its dotted key, its type as written in YAML, its default (as YAML would show it) and its description."""

    key: str
    type: str
    default: str
    description: str


def type_name(annotation: Any) -> str:
    """A field's type as a reader of YAML thinks of it: int, float | null, one of a | b, list[str], ..."""
    origin = get_origin(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(str(a) for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in get_args(annotation))
    if origin in (list, tuple, dict):
        inner = ", ".join(type_name(a) for a in get_args(annotation) if a is not Ellipsis)
        return f"{origin.__name__}[{inner}]" if inner else origin.__name__
    if origin is not None and get_args(annotation):  # Annotated and the like: the first argument
        return type_name(get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "(required)"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, tuple):
        value = list(value)
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def _section_type(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def model_keys(model: type[BaseModel], prefix: str = "") -> list[ConfigKey]:
    """Every leaf field of `model` and its sub-sections, depth first, dotted under `prefix`."""
    keys: list[ConfigKey] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        inner = get_args(field.annotation)[0] if get_origin(field.annotation) is list and get_args(field.annotation) else None
        section = _section_type(field.annotation)
        if section is not None:
            keys += model_keys(section, dotted + ".")
        elif _section_type(inner) is not None:  # a list of sections (reward.components): its items' keys
            keys.append(ConfigKey(dotted, f"list[{inner.__name__}]", _default(field), field.description or ""))
            keys += model_keys(inner, dotted + "[].")
        else:
            keys.append(ConfigKey(dotted, type_name(field.annotation), _default(field), field.description or ""))
    return keys


def _algorithm_keys() -> list[ConfigKey]:
    """algorithm.*: the union of the objectives' fields, each key once, naming the objectives that have it when not all do."""
    seen: dict[str, tuple[ConfigKey, list[str]]] = {}
    for tag, cls in ALGORITHMS.items():
        for key in model_keys(cls, "algorithm."):
            seen.setdefault(key.key, (key, []))[1].append(tag)
    keys = []
    for key, tags in seen.values():
        if key.key == "algorithm.name":
            key = ConfigKey(key.key, " | ".join(ALGORITHMS), json.dumps("grpo"), key.description)
        elif len(tags) < len(ALGORITHMS):
            key = ConfigKey(key.key, key.type, key.default, f"({', '.join(tags)} only) {key.description}".rstrip())
        keys.append(key)
    return keys


def config_reference(section: str | None = None) -> list[ConfigKey]:
    """Every key of the run config (or of one section, or keys under a dotted prefix), with type, default and description."""
    keys: list[ConfigKey] = []
    for name, field in Config.model_fields.items():
        if name == "algorithm":
            keys += _algorithm_keys()
        elif _section_type(field.annotation) is not None:
            keys += model_keys(field.annotation, name + ".")
        else:
            keys.append(ConfigKey(name, type_name(field.annotation), _default(field), field.description or ""))
    if section is None:
        return keys
    section = section.rstrip(".")
    return [k for k in keys if k.key == section or k.key.startswith(section + ".") or k.key.startswith(section + "[]")]


def section_descriptions() -> dict[str, str]:
    """Each top-level section's one-line description (its class's docstring's first line, else its field's description)."""
    out = {}
    for name, field in Config.model_fields.items():
        cls = _section_type(field.annotation)
        doc = field.description or (cls.__doc__ or "" if cls is not None and cls.__doc__ != BaseModel.__doc__ else "")
        out[name] = " ".join(doc.split()).split(". ")[0].rstrip(".") if doc else ""
    return out


def dotted_keys() -> list[str]:
    """Every dotted key (sections included), for suggestions: `optim.learning_rate` -> `optim.lr`."""
    keys = [k.key.replace("[]", "") for k in config_reference()]
    sections = {".".join(k.split(".")[:i]) for k in keys for i in range(1, k.count(".") + 1)}
    return sorted(set(keys) | sections)
