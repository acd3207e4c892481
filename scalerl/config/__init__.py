"""The run's configuration: one typed tree, validated and derived once, then frozen.

    schema.py   the sections of the config (every field with its description)
    presets.py  what rewrites the input first: the presets, the cluster presets, the older spellings
    root.py     the `Config` root: the sections, what is derived when it is built, the checks across sections
    load.py     YAML files and `--set` overrides into a `Config`, one-line errors, and `dump_config`
    plan.py     what is derived from it: the batch plan and the precision policy
    checks.py   what the config names outside itself (model folders, data, reward modules), checked before a run
    resume.py   the saved config of a run being resumed, and what may change mid-run
"""

from scalerl.config.load import dump_config, load_config, override_items, parse_override, read_yaml_mapping, with_overrides
from scalerl.config.presets import CLUSTER_PRESETS, LEGACY_PRECISION, PRESETS, cluster_nodes, cluster_values
from scalerl.config.root import Config
from scalerl.config.sft import SFTConfig
from scalerl.config.schema import (
    ALGORITHMS,
    DEFAULT_PARAM_GROUPS,
    AlgorithmConfig,
    CheckpointConfig,
    CISPOConfig,
    ContinualConfig,
    DiversityConfig,
    DynamicWeightConfig,
    EnvConfig,
    EvalConfig,
    ForgettingConfig,
    GRPOConfig,
    HealthCollapseConfig,
    HealthConfig,
    HealthGradNormConfig,
    HealthKLConfig,
    HealthHangConfig,
    HealthNoSignalConfig,
    HealthNonFiniteConfig,
    HealthPassRateDropConfig,
    HealthPhaseConfig,
    HealthPlateauConfig,
    KLConfig,
    LogConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    ParamGroupConfig,
    PPOConfig,
    PrecisionConfig,
    ReinforcePPConfig,
    ReplayConfig,
    RewardCapConfig,
    RewardComponentConfig,
    RewardConfig,
    RLOOConfig,
    RolloutConfig,
    TrainConfig,
    VLLMConfig,
)

__all__ = [
    # the root and its loading (root.py, load.py)
    "Config", "dump_config", "load_config", "override_items", "parse_override", "read_yaml_mapping", "with_overrides",
    # what rewrites the input (presets.py)
    "CLUSTER_PRESETS", "LEGACY_PRECISION", "PRESETS", "cluster_nodes", "cluster_values",
    # the sections (schema.py)
    "ALGORITHMS", "DEFAULT_PARAM_GROUPS", "AlgorithmConfig",
    "CISPOConfig", "CheckpointConfig", "ContinualConfig", "DiversityConfig", "DynamicWeightConfig", "EnvConfig", "EvalConfig",
    "ForgettingConfig", "GRPOConfig", "HealthCollapseConfig", "HealthConfig", "HealthGradNormConfig", "HealthKLConfig",
    "HealthHangConfig", "HealthNoSignalConfig", "HealthNonFiniteConfig", "HealthPassRateDropConfig", "HealthPhaseConfig", "HealthPlateauConfig",
    "KLConfig", "LogConfig", "LoraConfig", "ModelConfig", "OptimConfig", "PPOConfig", "ParallelConfig", "ParamGroupConfig",
    "PrecisionConfig", "RLOOConfig", "ReinforcePPConfig", "ReplayConfig", "RewardCapConfig", "RewardComponentConfig",
    "RewardConfig", "RolloutConfig", "SFTConfig", "TrainConfig", "VLLMConfig",
]
