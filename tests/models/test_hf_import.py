"""With scalerl imported, loading a model does not import scikit-learn (1.4 s a process with the embed/test extras); transformers'
assisted-generation threshold still finds it when it is called (scalerl/models/hf_import.py)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import run_cli

CODE = """
import sys, torch
from scalerl.config.schema import ModelConfig
from scalerl.models.loading import load_model
load_model(ModelConfig(), torch.device("cpu"))
import transformers.generation.candidate_generator as cg
print("sklearn imported:", "sklearn" in sys.modules)
print("check:", cg.is_sklearn_available())
print("roc:", float(cg.roc_curve([0, 1], [0.1, 0.9])[2][-1]))
"""


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="scikit-learn is not installed: nothing to defer")
def test_a_model_loads_without_importing_sklearn_and_the_threshold_still_works():
    proc = run_cli("-c", CODE, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "sklearn imported: False" in lines and "check: True" in lines and "roc: 0.1" in lines, proc.stdout
