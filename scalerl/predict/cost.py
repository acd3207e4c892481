"""Hours and money of a run from a measured throughput.

    hours     = steps × tokens per step / tokens per second / 3600        (wall clock)
    GPU-hours = hours × GPUs
    cost      = price per GPU-hour × GPU-hours / efficiency

The cost formula and the efficiency factors (7B 0.85, 13B 0.72, 70B 0.53: the share of the ideal
throughput a real cluster run keeps) are the source's (seed 000 §4.3); a model takes the factor of
the nearest class by parameter count (below 10B: 0.85, below 40B: 0.72, above: 0.53).
"""

from __future__ import annotations

from pathlib import Path

from scalerl.errors import ScaleRLError

EFFICIENCY = {"7b": 0.85, "13b": 0.72, "70b": 0.53}


def efficiency_for(params: float) -> float:
    """The source's factor of the nearest size class."""
    return EFFICIENCY["7b"] if params < 10e9 else EFFICIENCY["13b"] if params < 40e9 else EFFICIENCY["70b"]


def run_cost(*, steps: int, tokens_per_step: float, tokens_per_s: float, gpus: int, price_per_gpu_hour: float,
             efficiency: float) -> dict[str, float]:
    if tokens_per_s <= 0 or not 0 < efficiency <= 1:
        raise ScaleRLError("--tokens-per-s must be > 0 and --efficiency in (0, 1]")
    hours = steps * tokens_per_step / tokens_per_s / 3600
    return {"hours": hours, "gpu_hours": hours * gpus, "cost": price_per_gpu_hour * hours * gpus / efficiency,
            "efficiency": efficiency}


def throughput_from_run(run_dir: Path, warmup_steps: int = 2) -> tuple[float, float]:
    """(generated tokens per second, mean tokens per step) over a run's steps after the first `warmup_steps`."""
    from scalerl.jsonl import read_metrics

    if not (Path(run_dir) / "metrics.jsonl").is_file():
        raise ScaleRLError(f"{run_dir}: no metrics.jsonl here; give a run directory written by `scalerl train`")
    rows = read_metrics(Path(run_dir))[warmup_steps:]
    if not rows:
        raise ScaleRLError(f"{run_dir}: fewer than {warmup_steps + 1} logged steps; calibrate with more steps")
    tokens, seconds = sum(r["tokens"] for r in rows), sum(r["step_time_s"] for r in rows)
    return tokens / seconds, tokens / len(rows)
