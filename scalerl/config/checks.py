"""Checks of what a config names outside itself, before anything heavy loads: the environment's
own options, local model folders (config, weights, tokenizer files, context length), reward
functions and models, the run folder and the metrics address. The rest of scalerl/config/ validates
the schema alone and imports nothing of the project; these checks need the environments, models and rewards,
so they live here (the CLI and `train()` call them, once per config object: `check_once`).

It is the one module of scalerl/config/ that imports components; none of them imports it.
"""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Callable, Mapping

from scalerl.config import Config
from scalerl.envs.registry import validate_env_args
from scalerl.errors import ScaleRLError
from scalerl.models.paths import (
    TOKENIZER_FILES,
    check_weights,
    has_tokenizer_files,
    max_positions,
    read_model_config,
    resolve_model_path,
)
from scalerl.rewards.sources import check_reward_sources


def check_config(config: Config, reward_funcs: Mapping[str, Callable] | None = None) -> Config:
    """Raise ScaleRLError (one line, naming the field) for a bad reference; returns the config.
    `reward_funcs`: the Python API's reward callables, which `function: python:NAME` components name."""
    check_run_dir(config)
    check_metrics_host(config)
    validate_env_args(config.env.name, config.env.args)
    model = resolve_model_path(config.model.path)  # a missing local folder fails here, before anything loads
    tokenizer = resolve_model_path(config.model.tokenizer, "model.tokenizer") if config.model.tokenizer else model
    if os.path.isdir(model):
        check_weights(model, "model.path")
        check_context_length(config, model)
    if os.path.isdir(tokenizer):
        check_tokenizer_files(tokenizer, "model.tokenizer" if config.model.tokenizer else "model.path")
    reward_models = [("reward.model", config.reward.model)] if config.reward.model else []
    reward_models += [(f"reward.components.{i}.model", c.model) for i, c in enumerate(config.reward.components) if c.model]
    for field, path in reward_models:
        folder = resolve_model_path(path, field)
        if os.path.isdir(folder):
            check_weights(folder, field)
            check_tokenizer_files(folder, field)
    check_reward_sources(config, reward_funcs)
    config._checked = id(config)
    return config


def check_once(config: Config, reward_funcs: Mapping[str, Callable] | None = None) -> Config:
    """`check_config`, unless this config object passed it already (the CLI checks before it trains; a
    config built in Python is checked when training starts)."""
    return config if config._checked == id(config) else check_config(config, reward_funcs)


def check_tokenizer_files(folder: str, field: str) -> None:
    if not has_tokenizer_files(folder):
        fix = "point model.tokenizer at a folder or hub id that has them" if field == "model.path" else "copy them there"
        raise ScaleRLError(f"{field}: {folder} has no tokenizer files (one of {', '.join(TOKENIZER_FILES)}); {fix}")


def check_context_length(config: Config, folder: str) -> None:
    """Completions (plus at least one prompt token) must fit in the model's positions."""
    limit = max_positions(read_model_config(folder, "model.path"))
    if limit is None:
        return
    for field, tokens in (("rollout.max_new_tokens", config.rollout.max_new_tokens), ("eval.max_new_tokens", config.eval.max_new_tokens)):
        if tokens is not None and tokens + 1 > limit:
            raise ScaleRLError(f"{field}={tokens}: the model ({folder}) has {limit} positions for the prompt and the completion "
                               f"together; set it to at most {limit - 1} (less the longest prompt's tokens)")


def check_run_dir(config: Config) -> None:
    """The run folder (log.run_dir/log.name) can be made: the nearest existing folder on its path
    is a folder this process can write in. Tried for real (a temporary folder, removed at once):
    permissions alone do not tell for root or a read-only mount."""
    run_dir = config.log.run_dir / config.log.name if config.log.name else config.log.run_dir
    try:
        existing = run_dir
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise ScaleRLError(f"log.run_dir: cannot create {run_dir}: {existing} is a file, not a folder; choose another log.run_dir")
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".scalerl-check-"))
    except OSError as err:
        raise ScaleRLError(f"log.run_dir: cannot create {run_dir} ({err.strerror}); choose a writable folder") from None


def check_metrics_host(config: Config) -> None:
    """log.metrics_host is an address of this machine (when the endpoint is on)."""
    log = config.log
    if log.metrics_port is None:
        return
    try:
        infos = socket.getaddrinfo(log.metrics_host, None, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.bind((log.metrics_host, 0))  # port 0: any free port; only the address is tested
    except (OSError, UnicodeError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err) or type(err).__name__
        raise ScaleRLError(f"log.metrics_host: cannot serve on {log.metrics_host!r} ({reason}); give an address of this "
                           "machine, e.g. 127.0.0.1 or 0.0.0.0") from None
