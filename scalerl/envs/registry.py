"""Environments by name, plus user plug-ins given as `module:Class`."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from scalerl.envs.arithmetic import ArithmeticEnv
from scalerl.envs.base import Environment
from scalerl.envs.calculator import CalculatorEnv
from scalerl.envs.code import CodeEnv
from scalerl.envs.math_env import MathEnv
from scalerl.envs.open_prompts import OpenPromptsEnv
from scalerl.errors import ScaleRLError
from scalerl.plugins import import_object

ENVIRONMENTS: dict[str, type] = {"arithmetic": ArithmeticEnv, "calculator": CalculatorEnv, "math": MathEnv, "reward_model": OpenPromptsEnv, "code": CodeEnv}


def resolve_env_class(name: str) -> type:
    """The class for a registered name or a `module:Class` import path."""
    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name]
    if ":" not in name:
        known = ", ".join(sorted(ENVIRONMENTS))
        raise ScaleRLError(f"env.name: unknown environment '{name}'; use one of [{known}] or a plug-in as 'module:Class'")
    cls = import_object(name, "env.name", example="my_module:MyEnv")
    for method in ("train_tasks", "eval_tasks", "score"):
        if not callable(getattr(cls, method, None)):
            raise ScaleRLError(f"env.name: {name} is not an environment: it lacks a '{method}' method (see scalerl/envs/base.py)")
    return cls


def validate_env_args(name: str, args: dict[str, Any]) -> None:
    """Check an environment's keyword arguments against its `Config` model, naming the bad key."""
    cls = resolve_env_class(name)
    config_cls = getattr(cls, "Config", None)
    if config_cls is None:
        return
    try:
        config_cls.model_validate(args)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(["env.args", *(str(p) for p in first["loc"])])
        raise ScaleRLError(f"{where}: {first['msg']}") from None


def build_env(name: str, args: dict[str, Any]) -> Environment:
    cls = resolve_env_class(name)
    config_cls = getattr(cls, "Config", None)
    return cls(config_cls.model_validate(args)) if config_cls is not None else cls(**args)
