"""Checks, when the config is built, that every reward source can be loaded (no torch import)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping

from scalerl.errors import ScaleRLError

if TYPE_CHECKING:
    from scalerl.config import Config


def env_has_verifier(env_name: str) -> bool:
    """False for an environment that declares `verifier = False` (its score is always 0); plug-ins
    that say nothing are taken to verify."""
    from scalerl.envs.registry import resolve_env_class

    return bool(getattr(resolve_env_class(env_name), "verifier", True))


PYTHON = "python:"  # `function: python:NAME`: a callable handed to the Python API (scalerl/api/), not an import path


def in_process(spec: str, functions: Mapping[str, Callable] | None, where: str = "reward component function") -> Callable:
    """The callable that `python:NAME` names, or a one-line error (a config of a Python API run, started elsewhere)."""
    name = spec[len(PYTHON):]
    if functions is None or name not in functions:
        raise ScaleRLError(f"{where}={spec} names a Python callable handed to scalerl.Trainer in its own script, which "
                           "alone holds it; run it from that script (its score: `trainer.evaluate()` there), or name the function as "
                           "module:function")
    return functions[name]


def check_reward_sources(config: "Config", functions: Mapping[str, Callable] | None = None) -> None:
    """Model folders exist, functions import (or, `python:NAME`, are among the Python API's `functions`), and a
    verifier-less environment has another reward."""
    from scalerl.models.paths import resolve_model_path
    from scalerl.rewards.safe_call import resolve_function

    for i, comp in enumerate(config.reward.components):
        if comp.model is not None:
            resolve_model_path(comp.model, f"reward.components.{i}.model")
        if comp.function is not None and comp.function.startswith(PYTHON):
            in_process(comp.function, functions, f"reward.components.{i}.function")
        elif comp.function is not None:
            resolve_function(comp.function, f"reward.components.{i}.function")
    if env_has_verifier(config.env.name):
        return
    if not config.reward.components and config.reward.model is None:
        raise ScaleRLError(f"env.name={config.env.name} has no verifier: add reward_components (a model or function) "
                           "or reward.model to score its completions")
    for comp in config.reward.components:
        if comp.env:
            raise ScaleRLError(f"reward component '{comp.name}': env.name={config.env.name} has no verifier, so an env "
                               "component would always score 0; use a model or function")
