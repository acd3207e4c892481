"""`scalerl config [SECTION]`: the config reference, from the code (scalerl/config/reference.py)."""

from __future__ import annotations

import textwrap

import typer

from scalerl.cli.common import run_guarded
from scalerl.errors import ScaleRLError


def _print_keys(keys) -> None:
    for k in keys:
        print(f"{k.key}: {k.type} = {k.default}" if k.default else f"{k.key}: {k.type}")
        if k.description:
            print(textwrap.fill(k.description, width=100, initial_indent="    ", subsequent_indent="    "))


def config_command(
    section: str | None = typer.Argument(None, help="A section (optim), a key prefix (algorithm.kl), env.args, or env.args.NAME "
                                                       "for one environment's own options; default: every key."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Every config key with its type, default and description; env.args: each environment's own options."""

    def go() -> None:
        from scalerl.config.reference import config_reference, dotted_keys
        from scalerl.config.suggest import nearest
        from scalerl.jobs.config_reference import env_args_reference

        if section is not None and section.startswith("env.args"):
            name = section.removeprefix("env.args").lstrip(".") or None
            for env, keys in env_args_reference(name).items():
                print(f"# env.name: {env}")
                _print_keys(keys)
            return
        keys = config_reference(section)
        if not keys:
            hint = nearest(section, dotted_keys() + ["env.args"])
            raise ScaleRLError(f"scalerl config {section}: no such section or key{hint}; run scalerl config for every key")
        _print_keys(keys)
        if section is None or section == "env":
            print("# env.args: each environment's own options: scalerl config env.args")

    run_guarded(go, debug)
