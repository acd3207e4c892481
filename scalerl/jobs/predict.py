"""`scalerl predict RUN [RUN ...]`: a forecast of a run's held-out pass rate, and what reaching a target costs.

The compute–pass-rate sigmoid R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) (ScaleRL paper) is fitted to
the evaluations of one run, or of several seeds of one recipe together (`scalerl.predict.forecast`),
with a 95 % profile band, the pass rate predicted at a target compute and the compute at which a
target pass rate is reached, and warnings where the fit should not be trusted. With a target pass
rate, that compute (point and band) is priced from the first run's own measured step time: steps,
wall hours, GPU-hours and, with a price per GPU-hour, money (price x GPU-hours / efficiency).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalerl.errors import ScaleRLError


def cost_to_target(fc: dict[str, Any], run_dir: Path, compute: str, gpus: int, price: float | None,
                   efficiency: float) -> dict[str, Any] | None:
    """Steps, hours, GPU-hours and money to the target pass rate (point and band), from the run's own step time."""
    from scalerl.predict.cost import throughput_from_run

    if fc.get("compute_at_target") is None and fc["compute_at_target_band"][0] is None:
        return None
    if gpus < 1 or not 0 < efficiency <= 1 or (price is not None and price < 0):
        raise ScaleRLError("--gpus must be >= 1, --efficiency in (0, 1] and --price-per-gpu-hour >= 0")
    tokens_per_s, tokens_per_step = throughput_from_run(run_dir)
    seconds_per_step = tokens_per_step / tokens_per_s

    def priced(c: float | None) -> dict[str, float] | None:
        if c is None:
            return None
        steps = c if compute == "steps" else c / tokens_per_step
        hours = steps * seconds_per_step / 3600
        out = {"steps": steps, "hours": hours, "gpu_hours": hours * gpus}
        if price is not None:
            out["cost"] = price * hours * gpus / efficiency
        return out

    lo, hi = fc["compute_at_target_band"]
    return {"point": priced(fc.get("compute_at_target")), "band": [priced(lo), priced(hi)], "gpus": gpus, "price_per_gpu_hour": price,
            "efficiency": efficiency, "seconds_per_step": seconds_per_step, "tokens_per_s": tokens_per_s}


def forecast(run_dirs: list[Path], *, compute: str, warmup_frac: float, max_step: int | None, target_compute: float | None,
             target_pass_rate: float | None, gpus: int, price: float | None, efficiency: float) -> dict[str, Any]:
    """`forecast_runs` of the runs, with `cost_to_target` (priced from the first run) when a target pass rate is given."""
    from scalerl.predict.forecast import forecast_runs

    fc = forecast_runs(list(run_dirs), compute=compute, warmup_frac=warmup_frac, max_step=max_step, target_compute=target_compute,
                       target_pass_rate=target_pass_rate)
    if target_pass_rate is not None:
        fc["cost_to_target"] = cost_to_target(fc, run_dirs[0], compute, gpus, price, efficiency)
    return fc
