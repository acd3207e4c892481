"""The documentation site builds with --strict (no broken link, reference or nav entry), its config and
command references are generated from the code, and a config key cannot be added without a description."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import BaseModel, Field

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
    for key in ("optim.lr", "rollout.group_size", "algorithm (name=ppo).vf_coef",
                "health.kl.threshold"):
        assert key in config_page, key
    assert "scalerl train" in cli_page and "--dry-run" in cli_page and "scalerl estimate" in cli_page


def test_every_config_key_has_a_description_and_one_without_is_refused():
    keys = [k for section in reference.sections() for k in section.keys]
    assert len(keys) > 150 and all(k.description for k in keys)
    assert {"optim.lr", "rollout.max_new_tokens", "reward.components[].function"} <= {k.key for k in keys}

    class Section(BaseModel):
        documented: int = Field(1, description="A key with its description.")
        bare: int = 2

    class Root(BaseModel):
        part: Section = Field(default_factory=Section)

    with pytest.raises(ValueError, match="config key part.bare has no description"):
        reference.sections(Root)
