"""Importing what a user names as `module:attribute` (environments, reward functions, shaping
hooks), with one-line errors that name the config key. No torch import: config checks use it."""

from __future__ import annotations

import importlib
from typing import Any

from scalerl.errors import ScaleRLError


def import_object(spec: str, where: str, example: str = "my_pkg.module:name") -> Any:
    """The object named by 'module:attribute' (dots allowed on both sides: a nested attribute)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ScaleRLError(f"{where}: '{spec}' is not 'module:attribute', e.g. {example}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ScaleRLError(f"{where}: cannot import module '{module_name}' ({err}); check PYTHONPATH or the spelling") from None
    target: Any = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ScaleRLError(f"{where}: module '{module_name}' has no attribute '{attr}'")
    return target


def import_function(spec: str, where: str) -> Any:
    """`import_object`, checked to be callable."""
    fn = import_object(spec, where, example="my_pkg.rewards:exact_match")
    if not callable(fn):
        raise ScaleRLError(f"{where}: '{spec}' is a {type(fn).__name__}, not a function")
    return fn
