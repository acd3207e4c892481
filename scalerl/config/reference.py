"""The config reference, from the code: every key of the run configuration with its type, default and
description (the pydantic fields of scalerl/config/schema.py and root.py), and every environment's own
`env.args` (each environment's `Config`: `env_args_reference` in scalerl/jobs/config_reference.py, as the config
package imports no environment). `scalerl config [SECTION]` prints both; a docs page can be generated from them.
"""

from __future__ import annotations

import json
import re
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


# What each top-level section is for, shown above it in --dry-run's output and in the reference.
SECTIONS = {
    "model": "The policy: a local Hugging Face folder, 'builtin' or a hub id; its tokenizer, attention and LoRA.",
    "env": "Where prompts come from and how completions are scored; env.args are the environment's own options.",
    "rollout": "Sampling: prompts per step, completions per prompt, lengths, temperature, sync or async, the engine.",
    "algorithm": "The objective (grpo, cispo, rloo, reinforce_pp, ppo) with its clipping, KL and filters.",
    "reward": "What scores a completion beyond the environment: reward models and functions, fused; caps and dumps.",
    "optim": "AdamW and its learning-rate schedule.",
    "train": "Steps, epochs over each batch, mini- and micro-batches, seed, threads and device.",
    "precision": "What weights, states and matmuls are stored and run in (fp32, standard, aggressive, compressed).",
    "parallel": "How the ranks of torchrun (scalerl train --nproc N) split the learner.",
    "eval": "The held-out pass rate: how often, on how many tasks, how sampled.",
    "forgetting": "Keeping an earlier task: anchor data, EWC.",
    "replay": "Replaying earlier groups (needs an off-policy correction).",
    "continual": "scalerl continual: training on data files as they arrive.",
    "checkpoint": "When checkpoints are saved and how many are kept.",
    "log": "The run folder, console, TensorBoard and Prometheus.",
    "health": "Health rules checked every step: events, warnings and automatic responses.",
    "sft": "scalerl sft: supervised fine-tuning data, updates, batch, packing and where the model is written.",
}


def section_descriptions() -> dict[str, str]:
    """Each top-level section's one-line description (SECTIONS; a top-level setting's own description)."""
    return {name: SECTIONS.get(name) or field.description or "" for name, field in Config.model_fields.items()}


def key_descriptions() -> dict[str, str]:
    """Dotted key -> description, for every key and every section (top level and nested ones with a description)."""
    out = {k.key: k.description for k in config_reference()}
    out.update(section_descriptions())
    return out


def _comment(text: str, width: int = 110) -> str:
    first = re.split(r"(?<!e\.g)(?<!i\.e)\. ", text)[0].strip().rstrip(".")
    return first if len(first) <= width else first[: width - 3].rstrip() + "..."


def commented_yaml(text: str, descriptions: dict[str, str]) -> str:
    """YAML text (block style, as yaml.safe_dump writes it) with each key's description as a comment line above it.
    Keys inside list items get none (their descriptions are the reference's `key[].sub`)."""
    out, stack = [], []  # stack: (indent, key) of the enclosing mappings
    for line in text.splitlines():
        stripped = line.lstrip()
        indent = len(line) - len(stripped)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if stripped.startswith(("- ", "#")) or ":" not in stripped or any(k is None for _, k in stack):
            if stripped.startswith("- "):
                stack.append((indent, None))
            out.append(line)
            continue
        key = stripped.split(":", 1)[0]
        stack.append((indent, key))
        description = descriptions.get(".".join(k for _, k in stack))
        if description:
            out.append(" " * indent + "# " + _comment(description))
        out.append(line)
    return "\n".join(out) + "\n"


def dotted_keys() -> list[str]:
    """Every dotted key (sections included), for suggestions: `optim.learning_rate` -> `optim.lr`."""
    keys = [k.key.replace("[]", "") for k in config_reference()]
    sections = {".".join(k.split(".")[:i]) for k in keys for i in range(1, k.count(".") + 1)}
    return sorted(set(keys) | sections)


def missing_descriptions() -> list[str]:
    """The keys that have no description (a test and the documentation build refuse any)."""
    return [k.key for k in config_reference() if not k.description]


def config_reference_markdown() -> str:
    """The documentation site's config page (docs/hooks/reference.py writes it before each build)."""
    if missing := missing_descriptions():
        raise ValueError(f"config keys without a description: {', '.join(missing)}; add Field(..., description=...) in scalerl/config/")
    cell = lambda text: text.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["# Config keys", "",
             "Every key of the run configuration, generated from the code (`scalerl/config/`); `scalerl config [SECTION]` "
             "prints the same, and `scalerl config env.args.NAME` an environment's own options. A YAML file holds any subset "
             "(`scalerl train --config run.yaml`); `--set key=value` overrides one on the command line; `scalerl train "
             "--dry-run` prints the whole resolved config with these descriptions as comments.", ""]
    keys = config_reference()
    for section, description in section_descriptions().items():
        mine = [k for k in keys if k.key == section or k.key.startswith(section + ".")]
        lines += [f"## `{section}`", "", description, "", "| key | type | default | description |", "|---|---|---|---|"]
        lines += [f"| `{k.key}` | `{cell(k.type)}` | `{cell(k.default)}` | {cell(k.description)} |" for k in mine]
        lines.append("")
    return "\n".join(lines)
