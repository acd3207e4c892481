"""The config reference for `scalerl config` and a generated docs page: the run config's keys
(scalerl/config/reference.py) and each environment's own `env.args`, with type, default and description."""

from __future__ import annotations

from scalerl.config.reference import ConfigKey, config_reference, model_keys

__all__ = ["ConfigKey", "config_reference", "env_args_reference"]


def env_args_reference(name: str | None = None) -> dict[str, list[ConfigKey]]:
    """Each built-in environment's own `env.args` (or the one named: a built-in or a plug-in `module:Class`)."""
    from scalerl.envs.registry import ENVIRONMENTS, resolve_env_class

    out = {}
    for env in [name] if name else list(ENVIRONMENTS):
        config_cls = getattr(resolve_env_class(env), "Config", None)
        out[env] = model_keys(config_cls, "env.args.") if config_cls is not None else []
    return out
