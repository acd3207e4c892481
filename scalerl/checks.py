"""Checks of what a config names outside itself, before anything heavy loads: the environment's
own options, local model folders, reward functions and models. `config.py` validates the schema
alone and imports nothing of the project; these checks need the environments, models and rewards,
so they live here (the CLI and `train()` call them)."""

from __future__ import annotations

from scalerl.config import Config
from scalerl.envs.registry import validate_env_args
from scalerl.models.paths import resolve_model_path
from scalerl.rewards.sources import check_reward_sources


def check_config(config: Config) -> Config:
    """Raise ScaleRLError (one line, naming the field) for a bad reference; returns the config."""
    validate_env_args(config.env.name, config.env.args)
    resolve_model_path(config.model.path)  # a missing local folder fails here, before anything loads
    if config.model.tokenizer:
        resolve_model_path(config.model.tokenizer, "model.tokenizer")
    if config.reward.model:
        resolve_model_path(config.reward.model, "reward.model")
    check_reward_sources(config)
    return config
