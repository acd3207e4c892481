"""ScaleRL: reinforcement-learning post-training for language models.

`from scalerl import Trainer, Config, sft`: the Python API (scalerl/api/trainer.py, scalerl/api/sft.py), imported on first use so that
`scalerl --help` and the reward-function workers, which import this package, do not load torch.
"""

import importlib

from scalerl.models.hf_import import install as _defer_sklearn

__version__ = "0.1.0"

_defer_sklearn()  # transformers' generation modules without scikit-learn's import (scalerl/models/hf_import.py)

__all__ = ["Config", "Trainer", "sft"]


def __getattr__(name: str):
    if name == "sft":  # scalerl.sft(...): supervised fine-tuning (scalerl/api/sft.py)
        return importlib.import_module("scalerl.api.sft").sft
    if name in __all__:
        return getattr(importlib.import_module("scalerl.api.trainer"), name)
    raise AttributeError(f"module 'scalerl' has no attribute {name!r}")
