"""The documentation site builds with --strict (no broken link, reference or nav entry), its config and
command references are generated from the code, and a config key cannot be added without a description."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT
from scalerl.config import reference


def test_the_site_builds_strict_with_generated_references(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[test]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config_page = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    cli_page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for key in ("optim.lr", "rollout.group_size", "algorithm.vf_coef", "health.hang.deadline_s"):
        assert key in config_page, key
    assert "scalerl train" in cli_page and "--dry-run" in cli_page and "scalerl estimate" in cli_page


def test_the_config_page_refuses_a_key_without_a_description(monkeypatch):
    """The generated page lists every key; one without a description stops the build, naming it."""
    page = reference.config_reference_markdown()
    assert "`optim.lr`" in page and "`reward.components[].function`" in page and "`health.hang.deadline_s`" in page
    bare = reference.ConfigKey("optim.bare", "int", "2", "")
    monkeypatch.setattr(reference, "config_reference", lambda section=None: [*reference.model_keys(reference.Config), bare])
    with pytest.raises(ValueError, match="optim.bare"):
        reference.config_reference_markdown()


def test_the_readme_is_a_front_door():
    """Under 15 KB: what it is, the two commands (the ones .ci/run runs), a short example, one table, links that resolve."""
    import re

    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 15 * 1024
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^python3 -m venv .*python -m pytest -q -m serial$", text, re.M).group(0) in ci
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        assert (ROOT / target).exists(), target


def test_the_committed_references_are_what_the_code_generates():
    """docs/reference/config.md and cli.md are in the repository (readable in a clone, linked from the README) and the
    docs build rewrites them from the code: this fails when a key or flag changed and they were not regenerated
    (`mkdocs build`, or the two functions below)."""
    from scalerl.cli.reference import cli_reference_markdown

    assert (ROOT / "docs" / "reference" / "config.md").read_text() == reference.config_reference_markdown()
    assert (ROOT / "docs" / "reference" / "cli.md").read_text() == cli_reference_markdown()
