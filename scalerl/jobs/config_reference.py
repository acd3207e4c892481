"""The config reference for `scalerl config` and a generated docs page: the run config's keys
(scalerl/config/reference.py) and each environment's own `env.args`, with type, default and description."""

from __future__ import annotations

from scalerl.config.reference import (
    ConfigKey,
    commented_yaml,
    config_reference,
    key_descriptions,
    model_keys,
)

__all__ = ["ConfigKey", "commented_dump", "config_reference", "env_args_reference"]


def env_args_reference(name: str | None = None) -> dict[str, list[ConfigKey]]:
    """Each built-in environment's own `env.args` (or the one named: a built-in or a plug-in `module:Class`)."""
    from scalerl.envs.registry import ENVIRONMENTS, resolve_env_class

    out = {}
    for env in [name] if name else list(ENVIRONMENTS):
        config_cls = getattr(resolve_env_class(env), "Config", None)
        out[env] = model_keys(config_cls, "env.args.") if config_cls is not None else []
    return out


def commented_dump(config) -> str:
    """`dump_config` for a reader (--dry-run): each key's description as a comment above it, and the environment's
    own options in full (its defaults filled in, older spellings renamed) instead of only those given."""
    import yaml

    from scalerl.config import dump_config
    from scalerl.envs.registry import resolve_env_class

    tree = yaml.safe_load(dump_config(config))
    config_cls = getattr(resolve_env_class(config.env.name), "Config", None)
    if config_cls is not None:
        tree["env"]["args"] = config_cls.model_validate(config.env.args).model_dump(mode="json")
    descriptions = key_descriptions()
    descriptions.update({k.key: k.description for keys in env_args_reference(config.env.name).values() for k in keys})
    return commented_yaml(yaml.safe_dump(tree, sort_keys=False), descriptions)
