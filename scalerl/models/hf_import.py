"""transformers without importing scikit-learn (1.4 s a process) for a feature ScaleRL never uses.

transformers' `generation/candidate_generator.py` runs `from sklearn.metrics import roc_curve` at import
whenever scikit-learn is installed (it is with the `embed` and `test` extras, through sentence-transformers),
for assisted generation's confidence threshold; every process that touches a model, a config or a tokenizer
(`transformers.models.auto` imports the generation modules) pays for it. `install` (called when `scalerl` is
imported; it imports nothing itself) puts a finder first on `sys.meta_path` that, when that one module is
imported, runs it with transformers' check answering False, then gives it back the real check and a
`roc_curve` that imports scikit-learn on its first call: the same behaviour, the import only where it is used.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

MODULE = "transformers.generation.candidate_generator"


def roc_curve(*args, **kwargs):
    """sklearn.metrics.roc_curve, imported on the first call."""
    from sklearn.metrics import roc_curve as sklearn_roc_curve

    return sklearn_roc_curve(*args, **kwargs)


class DeferSklearn(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)  # once: the real spec comes from the finders after it
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            from transformers import utils

            real = utils.is_sklearn_available
            utils.is_sklearn_available = lambda: False
            try:
                run(module)
            finally:
                utils.is_sklearn_available = real
            module.is_sklearn_available = real
            module.roc_curve = roc_curve

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Defer the import (a no-op when the module is already imported or the finder already installed)."""
    if MODULE not in sys.modules and not any(isinstance(f, DeferSklearn) for f in sys.meta_path):
        sys.meta_path.insert(0, DeferSklearn())
