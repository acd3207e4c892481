"""`scalerl predict RUN_DIR`: fit the compute–pass-rate sigmoid to a run and extrapolate it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from scalerl.cli.common import run_guarded, setup_logging
from scalerl.errors import ScaleRLError


def predict(
    run_dir: Path = typer.Argument(..., help="A run directory written by `scalerl train` (metrics.jsonl, summary.json)."),
    compute: str = typer.Option("steps", "--compute", help="Compute axis: steps, or tokens (cumulative generated tokens)."),
    warmup_frac: float = typer.Option(0.1, "--warmup-frac", help="Leave out evaluations below this fraction of the last one's compute."),
    max_step: Optional[int] = typer.Option(None, "--fit-until-step", help="Fit only the evaluations up to this step."),
    target_compute: Optional[float] = typer.Option(None, "--target-compute", help="Predict the pass rate here (default: the planned train.steps for --compute steps)."),
    target_pass_rate: Optional[float] = typer.Option(None, "--target-pass-rate", help="Report the compute at which the fit reaches this pass rate."),
    n_boot: int = typer.Option(200, "--bootstrap", help="Bootstrap refits for the 95 % band (0: none)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
) -> None:
    """Forecast a run's held-out pass rate: R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) (ScaleRL paper)."""

    def go() -> None:
        from scalerl.predict.reward_curve import MIN_POINTS, eval_points, forecast_run

        if not run_dir.is_dir():
            raise ScaleRLError(f"{run_dir}: no such run directory; pass a folder under runs/ written by `scalerl train`")
        target = target_compute
        if target is None and compute == "steps":
            target = float(eval_points(run_dir)[2]) or None
        fc = forecast_run(run_dir, compute=compute, warmup_frac=warmup_frac, max_step=max_step, target_compute=target,
                          target_pass_rate=target_pass_rate, n_boot=n_boot)
        if fc is None:
            raise ScaleRLError(f"{run_dir}: fewer than {MIN_POINTS} evaluations to fit after the warm-up cut; "
                               "train with a smaller eval.every or lower --warmup-frac")
        print(f"fit on {len(fc['points'])} evaluations, compute = {compute}: R0 {fc['R0']:.3f}  A {fc['A']:.3f}  "
              f"B {fc['B']:.2f}  C_mid {fc['C_mid']:.4g}  (rmse {fc['rmse']:.3f})")
        if "predicted_at_target" in fc:
            band = fc.get("target_band")
            extra = f"  (95 % band {band[0]:.3f}–{band[1]:.3f})" if band else ""
            print(f"predicted pass rate at {compute} = {fc['target_compute']:.4g}: {fc['predicted_at_target']:.3f}{extra}")
        if target_pass_rate is not None:
            at = fc["compute_at_target"]
            print(f"pass rate {target_pass_rate:.3f} reached at {compute} = {at:.4g}" if at is not None
                  else f"pass rate {target_pass_rate:.3f}: not reached within A = {fc['A']:.3f}")

    setup_logging()
    run_guarded(go, debug)
