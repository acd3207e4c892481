"""Loading a transformers model without importing scikit-learn (1.4 s a process) for a feature ScaleRL never uses.

transformers' `generation/candidate_generator.py` runs `from sklearn.metrics import roc_curve` at import
whenever scikit-learn is installed (it is with the `embed` and `test` extras, through sentence-transformers),
for assisted generation's confidence threshold; every process that loads a model pays for it. `defer_sklearn`
imports that module with the check answering False, then gives it back the real check and a `roc_curve`
that imports scikit-learn on its first call: the same behaviour, the import only where it is used.
"""

from __future__ import annotations

import importlib
import sys


def defer_sklearn() -> None:
    """Import transformers.generation.candidate_generator with scikit-learn deferred (a no-op once it is imported)."""
    name = "transformers.generation.candidate_generator"
    if name in sys.modules:
        return
    from transformers import utils

    real = utils.is_sklearn_available
    utils.is_sklearn_available = lambda: False
    try:
        module = importlib.import_module(name)
    except ImportError:  # another transformers layout: leave it to transformers' own import
        return
    finally:
        utils.is_sklearn_available = real
    module.is_sklearn_available = real

    def roc_curve(*args, **kwargs):
        from sklearn.metrics import roc_curve as sklearn_roc_curve

        return sklearn_roc_curve(*args, **kwargs)

    module.roc_curve = roc_curve
