"""What rewrites the input before the schema reads it: the presets, the cluster presets and the older
spellings of settings. Plain functions of the raw mapping, which the validators of `Config`
(scalerl/config/root.py) call in turn; each returns the mapping unchanged when it does not apply, and
leaves what is not a mapping to the schema to report.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from scalerl.config.schema import RolloutConfig


# The ScaleRL recipe (Khatri et al., "The Art of Scaling Reinforcement Learning Compute for LLMs",
# 2025, §3-4): CISPO, prompt-level loss aggregation, batch-level advantage normalisation, zero-
# variance filtering, no-positive-resampling (pass rate >= 0.9), FP32 logits at the LM head, and a
# cap on the off-policy importance weight. Keys the user sets win over these.
PRESETS: dict[str, dict[str, Any]] = {
    "scalerl": {
        "algorithm": {"name": "cispo", "loss_agg": "prompt", "scale_rewards": "batch", "zero_variance_filter": True,
                      "retire_pass_rate": 0.9, "tis_cap": 2.0},
        "model": {"fp32_lm_head": True},
    },
}


# The source's table of cluster sizes (000 §4.1): tokens per global batch, gradient accumulation
# (micro-batches per optimizer update) and how the ranks synchronise.
CLUSTER_PRESETS: dict[str, dict[str, Any]] = {
    "1-4": {"tokens": 2_000_000, "accumulation": 8, "strategy": "ddp"},  # full synchronisation
    "4-8": {"tokens": 1_000_000, "accumulation": 16, "strategy": "dynamic"},  # layered: the default param_groups
    "8+": {"tokens": 500_000, "accumulation": 32, "strategy": "dynamic"},  # grouped (the all-reduces are not overlapped yet)
}


def cluster_nodes(environ: Mapping[str, str]) -> int:
    """Nodes of a torchrun job: WORLD_SIZE / LOCAL_WORLD_SIZE (1 outside torchrun)."""
    world, local = int(environ.get("WORLD_SIZE", "1")), int(environ.get("LOCAL_WORLD_SIZE", environ.get("WORLD_SIZE", "1")))
    return max(1, world // max(local, 1))


def cluster_values(preset: str, data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """The keys `cluster_preset` sets: rollout.prompts_per_step (per rank) so that the global batch holds about
    the preset's tokens, counted as completions x rollout.max_new_tokens (generated tokens, an upper bound);
    train.micro_batch_size so that an update accumulates the preset's micro-batches; parallel.strategy."""
    if preset == "auto":
        nodes = cluster_nodes(environ)
        preset = "1-4" if nodes <= 4 else "4-8" if nodes <= 8 else "8+"
    chosen = CLUSTER_PRESETS[preset]
    rollout = data.get("rollout") if isinstance(data.get("rollout"), dict) else {}
    fields = RolloutConfig.model_fields
    group = int(rollout.get("group_size", fields["group_size"].default))
    new_tokens = int(rollout.get("max_new_tokens", fields["max_new_tokens"].default))
    world, accumulation = int(environ.get("WORLD_SIZE", "1")), chosen["accumulation"]
    prompts = max(1, math.ceil(chosen["tokens"] / (world * group * new_tokens)))
    step = accumulation // math.gcd(accumulation, group)  # prompts x group divisible by the accumulation
    prompts = int(rollout.get("prompts_per_step", math.ceil(prompts / step) * step))  # yours wins, and sets the micro-batch
    return {"rollout": {"prompts_per_step": prompts}, "train": {"micro_batch_size": prompts * group // accumulation},
            "parallel": {"strategy": chosen["strategy"]}}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` on top, section by section: the keys of `over` win."""
    merged = dict(base)
    for key, value in over.items():
        merged[key] = merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


# The older spelling `train.precision` of precision.mode.
LEGACY_PRECISION = {"fp32": "fp32", "bf16": "standard", "fp8": "aggressive"}


# The source documents' spelling of two reward keys, at the top level.
TOP_LEVEL_REWARD_KEYS = {"reward_components": "reward.components", "fusion_method": "reward.fusion"}


def top_level_reward_keys(data: Any) -> Any:
    """The source documents' spelling: top-level `reward_components` and `fusion_method`."""
    moved = {top: key.removeprefix("reward.") for top, key in TOP_LEVEL_REWARD_KEYS.items()}
    if not isinstance(data, dict) or not any(k in data for k in moved) or not isinstance(data.get("reward", {}), dict):
        return data
    data, reward = dict(data), dict(data.get("reward") or {})
    for top, key in moved.items():
        if top in data:
            if key in reward:
                raise ValueError(f"{top} and reward.{key} are the same setting; give only one")
            reward[key] = data.pop(top)
    return {**data, "reward": reward}


def legacy_precision(data: Any) -> Any:
    """`train.precision: fp32 | bf16 | fp8` (older configs and runs) is precision.mode fp32 | standard | aggressive."""
    if not isinstance(data, dict) or not isinstance(data.get("train"), dict) or "precision" not in data["train"]:
        return data
    train = dict(data["train"])
    old = train.pop("precision")
    if old not in LEGACY_PRECISION:
        raise ValueError(f"train.precision={old!r}: use precision.mode (fp32, standard, aggressive or compressed)")
    precision = dict(data.get("precision") or {})
    if precision.setdefault("mode", LEGACY_PRECISION[old]) != LEGACY_PRECISION[old]:
        raise ValueError(f"train.precision={old} and precision.mode={precision['mode']} disagree; give only precision.mode")
    return {**data, "train": train, "precision": precision}


def compressed_checkpoints(data: Any) -> Any:
    """precision.mode=compressed recomputes activations in backward unless model.gradient_checkpointing says
    otherwise: its 8-bit states are a minor part of the memory once completions are long (bench/precision_modes.py)."""
    if not isinstance(data, dict):
        return data
    precision, train = data.get("precision"), data.get("train")
    mode = precision.get("mode") if isinstance(precision, dict) else None
    if mode is None and isinstance(train, dict):
        mode = LEGACY_PRECISION.get(train.get("precision"))
    model = data.get("model")
    if mode != "compressed" or (isinstance(model, dict) and "gradient_checkpointing" in model) or (model is not None and not isinstance(model, dict)):
        return data
    return {**data, "model": {**(model or {}), "gradient_checkpointing": True}}


def apply_cluster_preset(data: Any, environ: Mapping[str, str]) -> Any:
    """`cluster_preset`'s keys (`cluster_values`) under the ones given."""
    if not isinstance(data, dict) or data.get("cluster_preset") in (None, "none") or data["cluster_preset"] not in (*CLUSTER_PRESETS, "auto"):
        return data  # an unknown name is the schema's to report
    return merge(cluster_values(data["cluster_preset"], data, environ), data)


def apply_preset(data: Any) -> Any:
    """`preset`'s keys (PRESETS) under the ones given; without a preset, `algorithm` without a name is grpo's."""
    if not isinstance(data, dict):
        return data
    name = data.get("preset")
    known = isinstance(name, str) and name in PRESETS  # anything else is the schema's to report, naming `preset`
    if isinstance(data.get("algorithm"), dict) and "name" not in data["algorithm"] and not known:
        data = {**data, "algorithm": {"name": "grpo", **data["algorithm"]}}  # the union's default member
    if not known or not isinstance(data.get("algorithm") or {}, dict):  # not a section: the schema reports `algorithm`
        return data
    preset = PRESETS[name]
    wanted = (data.get("algorithm") or {}).get("name", preset["algorithm"]["name"])
    if wanted != preset["algorithm"]["name"]:
        raise ValueError(f"preset {name} uses algorithm.name={preset['algorithm']['name']}; drop algorithm.name={wanted} or the preset")
    return merge(preset, data)
