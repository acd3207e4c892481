"""`scalerl predict RUN [RUN ...]`: fit the compute–pass-rate sigmoid to a run (or to several seeds
of one recipe together), extrapolate it with a calibrated band, say when not to trust it, and price
the compute to a target pass rate."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, List, Optional

import typer

from scalerl.cli.common import run_guarded, setup_logging


def _range(lo: float | None, hi: float | None, fmt: str) -> str:
    return f"{format(lo, fmt) if lo is not None else '?'}-{format(hi, fmt) if hi is not None else 'not reached'}"


def _print(fc: dict[str, Any], compute: str) -> None:
    runs = fc["run"] if isinstance(fc["run"], list) else [fc["run"]]
    pooled = f" of {len(runs)} runs together" if len(runs) > 1 else ""
    lo, hi = fc["A_band"]
    print(f"fit on {fc['n_points']} evaluations{pooled}, compute = {compute}: R0 {fc['R0']:.3f}  A {fc['A']:.3f} "
          f"(95 % {lo:.3f}-{hi:.3f})  B {fc['B']:.2f}  C_mid {fc['C_mid']:.4g}  (rmse {fc['rmse']:.3f})")
    if "A_spread" in fc:
        s = fc["A_spread"]
        alone = ", ".join(f"{r['A_alone']:.3f}" for r in fc["runs"])
        noise = ", ".join(f"{r['noise_sd']:.3f}" for r in fc["runs"])
        print(f"A of each run alone: {alone} (spread {s['min']:.3f}-{s['max']:.3f}, sd {s['sd']:.3f}); noise sd per run: {noise}")
    if "predicted_at_target" in fc:
        b = fc["target_band"]
        print(f"predicted pass rate at {compute} = {fc['target_compute']:.4g}: {fc['predicted_at_target']:.3f}  (95 % band {b[0]:.3f}-{b[1]:.3f})")
    if "target_pass_rate" in fc:
        at, (blo, bhi) = fc["compute_at_target"], fc["compute_at_target_band"]
        reach = f"reached at {compute} = {at:.4g}" if at is not None else f"not reached by the fit (A = {fc['A']:.3f})"
        print(f"pass rate {fc['target_pass_rate']:.3f}: {reach}  (95 % band {_range(blo, bhi, '.4g')})")
        cost = fc.get("cost_to_target")
        if cost is not None:
            p, (clo, chi) = cost["point"], cost["band"]
            steps = f"{p['steps']:.0f} steps" if p else "steps: not reached by the fit"
            line = (f"to reach it: {steps} (band {_range(clo and clo['steps'], chi and chi['steps'], '.0f')}), at "
                    f"{cost['seconds_per_step']:.3g} s per step measured in the run")
            if p:
                line += f": {p['hours']:.3g} h x {cost['gpus']} GPU = {p['gpu_hours']:.3g} GPU-hours"
                if "cost" in p:
                    line += (f", {p['cost']:.4g} at {cost['price_per_gpu_hour']:g} per GPU-hour / efficiency {cost['efficiency']:g} "
                             f"(band {_range(clo and clo['cost'], chi and chi['cost'], '.4g')})")
            print(line)
    for item in fc["warnings"]:
        print(f"{item['kind']}: {item['message']}")
    for note in fc["notes"]:
        print(f"note: {note}")


def predict(
    run_dirs: List[Path] = typer.Argument(..., help="Run directories written by `scalerl train`; several seeds of one recipe are fitted together."),
    compute: str = typer.Option("steps", "--compute", help="Compute axis: steps, or tokens (cumulative generated tokens)."),
    warmup_frac: float = typer.Option(0.1, "--warmup-frac", help="Leave out evaluations below this fraction of the last one's compute."),
    max_step: Optional[int] = typer.Option(None, "--fit-until-step", help="Fit only the evaluations up to this step (later ones check the forecast)."),
    target_compute: Optional[float] = typer.Option(None, "--target-compute", help="Predict the pass rate here (default: the planned train.steps for --compute steps)."),
    target_pass_rate: Optional[float] = typer.Option(None, "--target-pass-rate", help="The compute, time and cost to reach this pass rate."),
    gpus: int = typer.Option(1, "--gpus", help="GPUs of the run the cost is for (the run's measured step time is per step, whatever the GPUs)."),
    price: Optional[float] = typer.Option(None, "--price-per-gpu-hour", help="Price of one GPU-hour; gives the cost to the target."),
    efficiency: float = typer.Option(1.0, "--efficiency", help="cost = price x GPU-hours / efficiency (the source's 0.85 / 0.72 / 0.53 for 7B / 13B / 70B clusters; 1: the run's own hardware)."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole forecast as one JSON object instead."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Forecast held-out pass rate: R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) (ScaleRL paper), with a 95 % profile band."""

    def go() -> None:
        from scalerl.jobs.predict import forecast

        fc = forecast(list(run_dirs), compute=compute, warmup_frac=warmup_frac, max_step=max_step, target_compute=target_compute,
                      target_pass_rate=target_pass_rate, gpus=gpus, price=price, efficiency=efficiency)
        if as_json:
            print(json.dumps(fc, default=lambda x: None if isinstance(x, float) and not math.isfinite(x) else str(x)))
        else:
            _print(fc, compute)

    setup_logging()
    run_guarded(go, debug)
