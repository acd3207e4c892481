"""The minimal recipe keeps working and keeps learning."""

from __future__ import annotations

import re

import pytest

from conftest import ROOT, run_cli


def test_recipe_stays_short():
    assert len((ROOT / "recipes" / "grpo_minimal.py").read_text().splitlines()) <= 350


@pytest.mark.slow
def test_recipe_raises_the_pass_rate():
    proc = run_cli("recipes/grpo_minimal.py", "--steps", "50", env={"OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr
    before, after = map(float, re.search(r"pass rate: ([\d.]+) -> ([\d.]+)", proc.stdout).groups())
    assert after > before + 0.05, proc.stdout  # measured here: 0.325 -> 0.475
