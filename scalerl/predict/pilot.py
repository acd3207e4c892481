"""A finished (or stopped) run read as a pilot for `scalerl plan`: each step's shape and phase timings.

From the run folder: `metrics.jsonl` (per step `time/rollout_s`, `time/learn_s`, `step_time_s`,
`sampled_positions`, `trained_positions`, `completions`, summed over processes, `time/elapsed_s`,
`eval_time_s` where it evaluated, and `time/decode_s_per_position` where the HF engine timed its decode steps),
`config.yaml` (the model, precision, strategy, updates per
step, evaluation schedule) and `resolved.yaml` (the device and the number of processes). The first
WARMUP steps (allocator growth, lazy kernel selection) are left out, as the time estimate does.
Every problem is a one-line error naming the folder and what to give instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scalerl.errors import ScaleRLError
from scalerl.predict.step_cost import Shape

WARMUP = 2
PHASE_KEYS = ("time/rollout_s", "time/learn_s", "step_time_s", "sampled_positions", "trained_positions", "completions")


@dataclass
class Pilot:
    run_dir: Path
    device: str
    model_path: str
    config: object  # the run's Config
    mode: str = "fp32"  # the precision mode that ran (precision.mode=auto's choice from resolved.yaml)
    shapes: list[Shape] = field(default_factory=list)
    rollout_s: list[float] = field(default_factory=list)
    learn_s: list[float] = field(default_factory=list)
    other_s: list[float] = field(default_factory=list)
    eval_s: list[float] = field(default_factory=list)
    kv_s_per_byte: list[float] = field(default_factory=list)  # per step: the decode's growth per KV byte read (DecodeClock)
    wall_s: float | None = None  # summary.json's wall_time_s, when the run finished

    @property
    def step_s(self) -> np.ndarray:
        return np.array(self.rollout_s) + np.array(self.learn_s) + np.array(self.other_s)

    def typical(self) -> Shape:
        """The pilot's shape with its work averaged over the steps read."""
        s = self.shapes
        return Shape(**{**s[-1].__dict__, "completions": float(np.mean([x.completions for x in s])),
                        "decode_steps": float(np.mean([x.decode_steps for x in s])), "trained": float(np.mean([x.trained for x in s]))})


def weight_bytes(mode: str) -> tuple[float, float]:
    """(bytes per weight read while sampling, bytes per gradient element) of a precision mode: fp32 reads and sums
    4-byte values; the others sample from 2-byte weights (standard's bf16 autocast copies) and, standard
    excepted (fp32 master gradients), sum 2-byte gradients."""
    return (4.0, 4.0) if mode == "fp32" else (2.0, 4.0) if mode == "standard" else (2.0, 2.0)


def _yaml(path: Path) -> dict:
    import yaml

    try:
        tree = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ScaleRLError(f"{path}: not readable YAML ({str(err).splitlines()[0]})") from None
    return tree if isinstance(tree, dict) else {}


def read_pilot(run_dir: Path | str) -> Pilot:
    """The pilot's steps after WARMUP (see the module docstring)."""
    from scalerl.config import load_config
    from scalerl.jsonl import read_metrics
    from scalerl.predict.memory import shape_of_model_path

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ScaleRLError(f"{run_dir}: no such run folder; give a pilot run folder written by `scalerl train`")
    for name in ("metrics.jsonl", "config.yaml"):
        if not (run_dir / name).is_file():
            raise ScaleRLError(f"{run_dir}: no {name}; give a pilot run folder written by `scalerl train`")
    cfg = load_config(run_dir / "config.yaml")
    resolved = _yaml(run_dir / "resolved.yaml") if (run_dir / "resolved.yaml").is_file() else {}
    train = resolved.get("train") or {}
    device, world = str(train.get("device", cfg.train.device)).split(":")[0], int(train.get("world_size", 1))
    model = shape_of_model_path(cfg.model.path)
    params = float(model.params)
    # what ran: resolved.yaml has precision.mode=auto's choice (config.yaml keeps `auto`); a folder without it: fp32
    mode = (resolved.get("precision") or {}).get("mode", cfg.precision.mode)
    w_bytes, g_bytes = weight_bytes("fp32" if mode == "auto" else mode)
    # KV cache bytes per row and cached position, all layers (the cache holds K and V at the compute precision's width)
    kv_bytes = 2.0 * model.layers * model.kv_heads * model.head_dim * w_bytes
    groups = cfg.parallel.param_groups
    sync = float(np.mean([g.sync_interval for g in groups])) if groups else 1.0
    pilot = Pilot(run_dir, device, cfg.model.path, cfg, mode="fp32" if mode == "auto" else mode)
    rows = [r for r in read_metrics(run_dir) if "step_time_s" in r or "time/rollout_s" in r]
    if rows and not all(k in rows[0] for k in PHASE_KEYS):
        missing = ", ".join(k for k in PHASE_KEYS if k not in rows[0])
        raise ScaleRLError(f"{run_dir}/metrics.jsonl: no phase records ({missing}); the pilot must be a run of this version of "
                           "`scalerl train`")
    last_elapsed = None
    for row in rows:
        eval_s = float(row.get("eval_time_s") or 0.0)
        if row.get("eval_time_s") is not None and row["step"] > WARMUP:
            pilot.eval_s.append(eval_s)
        elapsed = row.get("time/elapsed_s")
        gap = None if last_elapsed is None or elapsed is None else elapsed - last_elapsed - eval_s
        last_elapsed = elapsed
        if row["step"] <= WARMUP or gap is None:
            continue
        c = row["completions"] / world
        pilot.shapes.append(Shape(params=params, weight_bytes=w_bytes, grad_bytes=g_bytes, completions=c,
                                  decode_steps=row["sampled_positions"] / max(row["completions"], 1), trained=row["trained_positions"] / world,
                                  world=world, strategy=cfg.parallel.strategy, updates=cfg.plan.updates_per_step, sync_interval=sync,
                                  hidden=model.hidden, layers=model.layers, kv_bytes=kv_bytes))
        if row.get("time/decode_s_per_position") is not None:  # seconds per cached position of the process's whole batch
            pilot.kv_s_per_byte.append(row["time/decode_s_per_position"] / (c * kv_bytes))
        pilot.rollout_s.append(row["time/rollout_s"])
        pilot.learn_s.append(row["time/learn_s"])
        pilot.other_s.append(max(gap - row["step_time_s"], 0.0))
    if len(pilot.shapes) < 3:
        raise ScaleRLError(f"{run_dir}: {len(pilot.shapes)} steps after the first {WARMUP} (warm-up); a pilot needs at least 3: "
                           "run it for more steps")
    if (run_dir / "summary.json").is_file():
        import json

        try:
            pilot.wall_s = json.loads((run_dir / "summary.json").read_text()).get("wall_time_s")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            pilot.wall_s = None
    return pilot
