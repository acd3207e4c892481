"""The command reference, read off the typer app: every command with its options, defaults and help.
The documentation site's command page is generated from it."""

from __future__ import annotations

import click
import typer

from scalerl.cli.main import app


def _params(command: click.Command) -> list[str]:
    rows = ["| option | default | help |", "|---|---|---|"]
    for param in command.params:
        if param.name == "help":
            continue
        option = param.param_type_name == "option"
        opts = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts]) if option else f"`{param.name.upper()}`"
        default = "" if param.default is None or callable(param.default) or not option else f"`{param.default}`"
        text = (getattr(param, "help", None) or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {opts} | {default} | {text} |")
    return rows


def cli_reference_markdown() -> str:
    group = typer.main.get_command(app)
    lines = ["# Commands", "", "Every `scalerl` command and option, generated from the code (`scalerl/cli/`); "
             "`scalerl COMMAND --help` prints the same.", ""]
    ctx = click.Context(group, info_name="scalerl", terminal_width=100, max_content_width=100)  # the same text on any terminal
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        sub = click.Context(command, info_name=name, parent=ctx)
        lines += [f"## `scalerl {name}`", "", (command.help or "").strip(), "", "```", command.get_usage(sub), "```", ""]
        lines += _params(command) + [""]
    return "\n".join(lines)
