"""MkDocs hook: writes the config and command references from the code before each build, so they cannot drift.

    docs/reference/config.md   every config key with its type, default and description (scalerl/config/)
    docs/reference/cli.md      every command with its options and help (scalerl/cli/)
A config key without a description fails the build.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def on_pre_build(config, **kwargs) -> None:
    sys.path.insert(0, str(ROOT))
    from scalerl.config.reference import config_reference_markdown
    from scalerl.cli.reference import cli_reference_markdown

    out = Path(config["docs_dir"]) / "reference"
    out.mkdir(exist_ok=True)
    _write(out / "config.md", config_reference_markdown())
    _write(out / "cli.md", cli_reference_markdown())


def _write(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:  # unchanged files keep their time: `mkdocs serve` does not loop
        path.write_text(text)
