"""Environments by name, plus user plug-ins given as `module:Class`."""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from pydantic import ValidationError

from scalerl.envs.agent import AgentEnv
from scalerl.envs.arithmetic import ArithmeticEnv
from scalerl.envs.base import Environment
from scalerl.envs.calculator import CalculatorEnv
from scalerl.envs.code import CodeEnv
from scalerl.envs.math_env import MathEnv
from scalerl.envs.open_prompts import OpenPromptsEnv
from scalerl.envs.reasoning_gym import ReasoningGymEnv
from scalerl.errors import ScaleRLError
from scalerl.plugins import import_object
from scalerl.types import Completion, Task

ENVIRONMENTS: dict[str, type] = {"arithmetic": ArithmeticEnv, "calculator": CalculatorEnv, "math": MathEnv, "reward_model": OpenPromptsEnv, "code": CodeEnv,
                               "agent": AgentEnv, "reasoning_gym": ReasoningGymEnv}


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


def _env_args_error(err: ValidationError, name: str, config_cls: type) -> ScaleRLError:
    """One line naming the key; an unknown key gets the nearest allowed one and the list of allowed keys."""
    first = err.errors()[0]
    where = ".".join(["env.args", *(str(p) for p in first["loc"])])
    if first["type"] != "extra_forbidden" or len(first["loc"]) != 1:
        return ScaleRLError(f"{where}: {first['msg']}")
    allowed = list(config_cls.model_fields)
    close = difflib.get_close_matches(str(first["loc"][0]), allowed, n=1, cutoff=0.6)
    hint = f"; did you mean `env.args.{close[0]}`?" if close else ""
    return ScaleRLError(f"{where}: unknown option of environment {name}{hint}; allowed: {', '.join(allowed)}")


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:200] if lines else ""


def validate_env_args(name: str, args: dict[str, Any]) -> None:
    """Check an environment's keyword arguments against its `Config` model, naming the bad key."""
    cls = resolve_env_class(name)
    config_cls = getattr(cls, "Config", None)
    if config_cls is None:
        return
    try:
        config_cls.model_validate(args)
    except ValidationError as err:
        raise _env_args_error(err, name, config_cls) from None
    except ScaleRLError:  # a Config's own one-line error (reasoning_gym: an unknown dataset, a missing extra)
        raise
    except Exception as err:  # a plug-in's own validator that raised something else than ValueError
        raise ScaleRLError(f"env.args: {name}'s Config raised {type(err).__name__}: {_first_line(err)}") from err


class CheckedScore:
    """One of an environment's scoring methods (`score`, `correct`), re-raising whatever it raises
    as a one-line ScaleRLError that names the environment and the task. Picklable with its
    environment, so worker processes (reward.num_workers) report the same way."""

    def __init__(self, env: Environment, method: str, env_name: str):
        self.env, self.method, self.env_name = env, method, env_name

    def __call__(self, task: Task, completion: Completion) -> float:
        own = inspect.getattr_static(type(self.env), self.method)  # the class's method, under this instance attribute
        try:
            return own.__get__(self.env, type(self.env))(task, completion)
        except ScaleRLError:
            raise
        except Exception as err:
            raise ScaleRLError(f"env.name={self.env_name}: {self.method}() raised {type(err).__name__}: {_first_line(err)} "
                               f"on the task with prompt {task.prompt[:60]!r}; fix the environment") from err


def build_env(name: str, args: dict[str, Any]) -> Environment:
    """The environment, checked: it builds, its training pool is not empty, and its `score` (and
    `correct`) fail with a message naming it and the task rather than a traceback from the loop."""
    cls = resolve_env_class(name)
    config_cls = getattr(cls, "Config", None)
    try:
        env = cls(config_cls.model_validate(args)) if config_cls is not None else cls(**args)
        pool = env.train_tasks()
    except ScaleRLError:
        raise
    except ValidationError as err:
        raise _env_args_error(err, name, config_cls) from None
    except Exception as err:
        raise ScaleRLError(f"env.name={name}: building the environment raised {type(err).__name__}: {_first_line(err)}; "
                           "fix the environment or env.args") from err
    if not pool:
        raise ScaleRLError(f"env.name={name}: the training pool is empty (train_tasks() returned no tasks); "
                           "check env.args and the environment's data")
    if not hasattr(env, "__dict__"):  # a __slots__ class cannot take the checked methods; it keeps its own
        return env
    for method in ("score", "correct"):
        if callable(getattr(env, method, None)) and method not in vars(env):
            setattr(env, method, CheckedScore(env, method, name))
    return env
