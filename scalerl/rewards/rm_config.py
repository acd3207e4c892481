"""The config of `scalerl train-rm`: one flat, typed section, YAML and `--set` overrides.

Kept apart from the policy's `Config` because a reward model is trained by its own job. No torch
import here, so `scalerl train-rm --help` stays instant and bad input fails before any loading.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scalerl.config import override_items, read_yaml_mapping
from scalerl.errors import ScaleRLError


def shipped_preferences() -> Path:
    """The synthetic arithmetic preference set inside the package (scripts/make_preference_data.py)."""
    return Path(str(resources.files("scalerl.rewards") / "data" / "arithmetic_preferences.jsonl"))


class RewardModelTrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str = Field("builtin", description="Base: 'builtin', a Hugging Face causal-LM or reward-model folder, or a hub id.")
    data: Path = Field(default_factory=shipped_preferences, description="JSONL of {prompt, chosen, rejected}; default: the shipped arithmetic set.")
    out: Path = Field(Path("runs/reward_model"), description="Folder the trained model, tokenizer and summary.json are saved to.")
    epochs: int = Field(10, ge=1, description="Passes over the training pairs.")
    batch_size: int = Field(64, ge=1, description="Preference pairs per optimizer step (one forward of 2x as many rows).")
    lr: float = Field(5e-4, gt=0, description="AdamW peak learning rate: linear warm-up over the first 10% of steps, then cosine decay to 0.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    max_grad_norm: float | None = Field(1.0, gt=0, description="Clip the global gradient norm; null disables.")
    max_length: int = Field(512, ge=2, description="Longest prompt+completion+EOS in tokens; longer texts keep their last max_length tokens.")
    eval_fraction: float = Field(0.1, ge=0, lt=1, description="Share of pairs held out for pairwise accuracy (before and after training).")
    seed: int = Field(0, description="Seeds the score head's initialisation, the split and the shuffles.")
    threads: int | None = Field(None, ge=1, description="torch CPU threads; default: torch's choice.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when visible, else cpu.")


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "config"
    if first["type"] == "extra_forbidden":
        return f"{key}: unknown key; allowed: {', '.join(RewardModelTrainConfig.model_fields)}"
    return f"{key}: {first['msg']}" + (f" (got {first['input']!r})" if "input" in first and not isinstance(first["input"], dict) else "")


def load_rm_config(path: Path | None = None, overrides: list[str] | dict[str, Any] | None = None) -> RewardModelTrainConfig:
    """Defaults <- YAML file <- overrides, validated; raises ScaleRLError with a one-line message."""
    tree = read_yaml_mapping(path, "model:, data:, epochs:, ...")
    tree.update(override_items(overrides))
    try:
        config = RewardModelTrainConfig.model_validate(tree)
    except ValidationError as err:
        raise ScaleRLError(_format_error(err)) from None
    from scalerl.models.paths import resolve_model_path

    resolve_model_path(config.model, "model")  # a missing local folder fails here, before torch loads
    if not config.data.is_file():
        raise ScaleRLError(f"data: {config.data} does not exist; give a JSONL file of {{prompt, chosen, rejected}}")
    return config


def dump_rm_config(config: RewardModelTrainConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
