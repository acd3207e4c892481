"""`scalerl.sft`: supervised fine-tuning from Python, the job `scalerl sft` runs (scalerl/jobs/sft.py).

    summary = scalerl.sft(model="builtin", train_dataset=[{"prompt": "2+2=", "response": "4"}, ...],
                          config={"sft.steps": 100, "optim.lr": 1e-3, "log.name": "warm"})
    scalerl.Trainer(model=summary["model"], ...)      # the fine-tuned folder, a model.path for RL

A dataset given as rows (a list of dicts, a `datasets.Dataset`) is written as JSONL beside the run folder
(`<log.run_dir>/<name>.inputs/sft.jsonl`) and named by sft.data, so the run's config.yaml says what ran.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from scalerl.api.data import model_folder
from scalerl.api.trainer import base_config
from scalerl.config import Config, with_overrides
from scalerl.errors import ScaleRLError
from scalerl.files import write_atomically


def sft(model: Any = None, train_dataset: Any = None, *, tokenizer: Any = None, config: Config | str | Path | dict[str, Any] | None = None,
        overrides: dict[str, Any] | None = None, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Fine-tune `model` (a folder, 'builtin', a transformers model object; None: the config's) on `train_dataset`
    (rows with prompt/response or messages: a list of dicts, a datasets.Dataset, a JSONL path or a save_to_disk
    folder; None: the config's sft.data). Returns the summary; its "model" is the fine-tuned Hugging Face folder."""
    from scalerl.jobs.sft import run_sft

    base = base_config(config)
    name = base.log.name or datetime.now().strftime("%Y%m%d-%H%M%S")
    inputs = base.log.run_dir / f"{name}.inputs"
    changes: dict[str, Any] = {"log.name": name}
    if model is not None or tokenizer is not None:
        changes.update({f"model.{k}": v for k, v in model_folder(model or base.model.path, tokenizer, inputs).items()})
    if train_dataset is not None:
        changes["sft.data"] = str(data_path(train_dataset, inputs))
    return run_sft(with_overrides(with_overrides(base, changes), overrides or {}), resume=resume, overwrite=overwrite)


def data_path(dataset: Any, folder: Path) -> Path:
    """A path as it is; rows (dicts, a datasets.Dataset) written to folder/sft.jsonl."""
    import json

    if isinstance(dataset, (str, Path)):
        return Path(dataset)
    if isinstance(dataset, dict) or not hasattr(dataset, "__iter__"):
        raise ScaleRLError(f"train_dataset: got {type(dataset).__name__}; give a list of dicts, a datasets.Dataset or a JSONL path")
    lines = []
    for i, row in enumerate(dataset):
        if not isinstance(row, dict):
            raise ScaleRLError(f"train_dataset: row {i} is a {type(row).__name__}; give rows as dicts (prompt/response or messages)")
        lines.append(json.dumps(row, ensure_ascii=False))
    if not lines:
        raise ScaleRLError("train_dataset: the dataset is empty")
    folder.mkdir(parents=True, exist_ok=True)
    write_atomically(folder / "sft.jsonl", "\n".join(lines) + "\n")
    return folder / "sft.jsonl"
