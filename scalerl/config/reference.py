"""The config reference, read off the schema: every key with its type, default and description.
`scalerl config` prints it; the documentation site's config page is generated from it."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from scalerl.config.root import Config


@dataclass(frozen=True)
class Key:
    key: str  # dotted, e.g. "optim.lr"; "[]" marks the items of a list, "(name=ppo)" a variant of a union
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class Section:
    key: str
    description: str
    keys: list[Key]


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (a model, a union of models, a list of models), else []."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models(typing.get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if origin in (Union, types.UnionType, list, tuple):
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


def _type_name(annotation: Any) -> str:
    text = repr(annotation).replace("typing.", "").replace("pathlib._local.", "").replace("pathlib.", "")
    return text.removeprefix("<class '").removesuffix("'>")


def _default(field) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def sections(model: type[BaseModel] = Config, prefix: str = "") -> list[Section]:
    """The schema as sections of keys; raises ValueError naming any key that has no description."""
    keys, out = [], []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = _models(field.annotation)
        if sub:
            many = typing.get_origin(field.annotation) in (list, tuple)
            for variant in sub:
                tag = variant.model_fields.get("name")
                label = f"{key}[]" if many else key
                if len(sub) > 1 and tag is not None and tag.default not in (None, PydanticUndefined):
                    label = f"{key} (name={tag.default})"
                doc = (variant.__doc__ or "").strip() or (field.description or "")
                out += _section(variant, label, doc)
            continue
        if not field.description:
            raise ValueError(f"config key {key} has no description: add Field(..., description=...) in scalerl/config/")
        keys.append(Key(key, _type_name(field.annotation), _default(field), field.description))
    return ([Section(prefix.rstrip("."), (model.__doc__ or "").strip(), keys)] if keys else []) + out


def _section(model: type[BaseModel], label: str, doc: str) -> list[Section]:
    found = sections(model, label + ".")
    if found and found[0].key == label:
        found[0] = Section(label, doc, found[0].keys)
    return found


def config_reference_markdown() -> str:
    lines = ["# Config keys", "",
             "Every key of the run configuration, generated from the code (`scalerl/config/`). A YAML file holds any subset "
             "(`scalerl train --config run.yaml`); `--set key=value` overrides one on the command line; `scalerl train --dry-run` "
             "prints the whole resolved config.", ""]
    for section in sections():
        lines += [f"## `{section.key or 'top level'}`", ""]
        if section.description:
            lines += [" ".join(section.description.split()), ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        for k in section.keys:
            cell = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
            lines.append(f"| `{k.key}` | `{cell(k.type)}` | `{cell(k.default)}` | {cell(k.description)} |")
        lines.append("")
    return "\n".join(lines)
