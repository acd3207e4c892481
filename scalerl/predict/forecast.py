"""`scalerl predict`'s forecast of one run, or of several seeds of one recipe fitted together.

One run: its evaluations (`run_evals`) after the warm-up cut, up to `max_step`, and the step-0
pass rate as an observation of R0 (without one, the first evaluation whatever its step is kept
past the cut: it is the run's observation nearest R0), fitted by `reward_curve.fit_curve`; the curve, its 95 %
profile band, A's interval, the pass rate at the target compute and the compute at which a target
pass rate is reached (with the band's range of it), plus `forecast_checks.diagnose`'s warnings.

Several runs (`forecast_runs`, the ScaleRL paper's practice over its seeds): one curve (shared
R0, A, B, C_mid) fitted to every run's evaluations, each run weighted by 1/σ_k², its own noise
variance estimated from its residuals (three rounds of reweighting); each run is also fitted
alone, and A's spread across those fits is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalerl.errors import ScaleRLError
from scalerl.predict.forecast_checks import diagnose
from scalerl.predict.reward_curve import CurveData, ProfileBand, SigmoidFit, fit_curve
from scalerl.predict.run_evals import RunEvals, read_run_evals

MIN_POINTS = 4


class ForecastUnavailable(ScaleRLError):
    """No forecast can be made from these evaluations; the message says why and what to change."""


@dataclass(frozen=True)
class Window:
    """The evaluations a forecast fits (`fitted`) and the later ones it is checked against (`later`, with their
    weights in the fit's units when runs of different noise are pooled; None: the fit's mean weight)."""

    fitted: list[tuple[float, float]]
    later: list[tuple[float, float]]
    later_w: list[float] | None = None


def select_points(evals: RunEvals, compute: str, *, warmup_frac: float, max_step: int | None) -> Window:
    pts = list(zip(evals.compute(compute), evals.pass_rate, evals.steps))
    inside = [(c, r) for c, r, s in pts if max_step is None or s <= max_step]
    later = [(c, r) for c, r, s in pts if max_step is not None and s > max_step]
    if inside:
        # with no step-0 observation the first evaluation stands for R0: the warm-up cut must not drop it
        first = inside[0] if evals.r0 is None else None
        inside = [(c, r) for c, r in inside if (c >= warmup_frac * inside[-1][0] or (c, r) == first) and c > 0]
    if len(inside) < MIN_POINTS:
        where = f" up to step {max_step}" if max_step is not None else ""
        raise ForecastUnavailable(
            f"{evals.run_dir}: {len(inside)} evaluations{where} after the warm-up cut (--warmup-frac {warmup_frac:g}); the fit needs "
            f"{MIN_POINTS}: evaluate more often (a smaller eval.every), fit further (a later --fit-until-step) or keep the "
            f"early ones (--warmup-frac 0)")
    return Window(inside, later)


def _curve_grid(last: float, *, extend: float, target: float | None, planned: float, n: int) -> np.ndarray:
    end = max(extend * last, target or 0.0, planned)
    return np.linspace(end / n, end, n)


def _compute_to_reach(fit: SigmoidFit, band: ProfileBand, target: float, first: float, last: float) -> dict[str, Any]:
    """The compute at which the fit reaches `target`, and the range over which the band crosses it:
    from where the band's upper edge reaches it to where its lower edge does (None: not within 1000 × the data)."""
    c = np.geomspace(first, 1000 * last, 30)
    lo, hi = zip(*(band.interval(float(x)) for x in c))
    lo, hi = np.array(lo), np.array(hi)

    def first_reach(edge: np.ndarray) -> float | None:
        idx = np.flatnonzero(edge >= target)
        if len(idx) == 0:
            return None
        i = int(idx[0])
        if i == 0:
            return float(c[0])
        frac = (target - edge[i - 1]) / (edge[i] - edge[i - 1])  # interpolate in ln C
        return float(math.exp(math.log(c[i - 1]) + frac * (math.log(c[i]) - math.log(c[i - 1]))))

    point, early, late = fit.compute_for(target), first_reach(hi), first_reach(lo)
    if point is not None:  # the band's crossings are interpolated on a grid: keep the point inside them
        early = point if early is None else min(early, point)
        late = None if late is None else max(late, point)
    return {"compute_at_target": point, "compute_at_target_band": [early, late]}


def _summarise(data: CurveData, fit: SigmoidFit, window: Window, *, compute: str, target_compute: float | None,
               target_pass_rate: float | None, planned: float, extend: float, n_curve: int) -> dict[str, Any]:
    band = ProfileBand(data, fit)
    c_fit = np.array([c for c, _ in window.fitted])
    grid = _curve_grid(float(c_fit.max()), extend=extend, target=target_compute, planned=planned, n=n_curve)
    low, high = band.bands(grid)
    pos = data.c > 0
    out: dict[str, Any] = {
        "A": fit.A, "B": fit.B, "C_mid": fit.C_mid, "R0": fit.R0, "compute_key": compute,
        "A_band": list(band.interval(math.inf)), "n_points": int(pos.sum()),
        "points": [[float(c), float(r)] for c, r in window.fitted], "later_points": [[float(c), float(r)] for c, r in window.later],
        "curve": [[float(x), float(y)] for x, y in zip(grid, fit(grid))], "band_low": low.tolist(), "band_high": high.tolist(),
        "rmse": math.sqrt(float(((data.r[pos] - fit(data.c[pos])) ** 2).mean())), "level": band.level,
    }
    if target_compute is not None:
        out["target_compute"] = target_compute
        out["predicted_at_target"] = float(fit(target_compute))
        out["target_band"] = list(band.interval(target_compute))
    if target_pass_rate is not None:
        out["target_pass_rate"] = target_pass_rate
        out.update(_compute_to_reach(fit, band, target_pass_rate, float(c_fit.min()), float(c_fit.max())))
    out["_band"] = band  # for diagnose; dropped before returning
    return out


def forecast_run(run_dir: Path | str, *, compute: str = "steps", warmup_frac: float = 0.1, max_step: int | None = None,
                 target_compute: float | None = None, target_pass_rate: float | None = None, extend: float = 2.0,
                 n_curve: int = 100) -> dict[str, Any]:
    """Forecast one run (see the module docstring); raises ForecastUnavailable with the reason when it cannot."""
    _check_targets(target_compute, target_pass_rate, warmup_frac)
    evals = read_run_evals(run_dir)
    window = select_points(evals, compute, warmup_frac=warmup_frac, max_step=max_step)
    planned = float(evals.planned_steps) if compute == "steps" else 0.0
    if target_compute is None and planned:
        target_compute = planned
    data = CurveData.of([c for c, _ in window.fitted], [r for _, r in window.fitted], r0=evals.r0)
    fit = fit_curve(data)
    out = _summarise(data, fit, window, compute=compute, target_compute=target_compute, target_pass_rate=target_pass_rate,
                     planned=planned, extend=extend, n_curve=n_curve)
    out.update(run=str(evals.run_dir), R0_source=evals.r0_source, planned_steps=evals.planned_steps, notes=list(evals.notes))
    if not evals.planned_steps and target_compute is None:
        out["notes"].append(f"{evals.run_dir}/config.yaml gives no train.steps, so there is no planned end to forecast at: "
                            "pass --target-compute (the curve runs to twice the last evaluation)")
    out["warnings"] = diagnose(fit, window, out.pop("_band"), r0_source=evals.r0_source, compute=compute, target=target_compute)
    return out


def forecast_runs(run_dirs: list[Path | str], *, compute: str = "steps", warmup_frac: float = 0.1, max_step: int | None = None,
                  target_compute: float | None = None, target_pass_rate: float | None = None, extend: float = 2.0,
                  n_curve: int = 100) -> dict[str, Any]:
    """Several runs of one recipe under one curve with per-run noise (see the module docstring)."""
    if len(run_dirs) == 1:
        return forecast_run(run_dirs[0], compute=compute, warmup_frac=warmup_frac, max_step=max_step, target_compute=target_compute,
                            target_pass_rate=target_pass_rate, extend=extend, n_curve=n_curve)
    _check_targets(target_compute, target_pass_rate, warmup_frac)
    evals = [read_run_evals(d) for d in run_dirs]
    windows = [select_points(e, compute, warmup_frac=warmup_frac, max_step=max_step) for e in evals]
    parts = [CurveData.of([c for c, _ in w.fitted], [r for _, r in w.fitted], r0=e.r0) for e, w in zip(evals, windows)]
    alone = [fit_curve(p) for p in parts]
    weights = [1.0] * len(parts)
    for _ in range(3):  # per-run noise: σ_k² from the run's residuals under the shared curve
        fit = fit_curve(CurveData.join(parts, weights))
        var = [max(float(((p.r - fit(p.c)) ** 2).mean()), 1e-8) for p in parts]
        weights = [1.0 / v for v in var]
    data = CurveData.join(parts, weights)
    fit = fit_curve(data)
    planned_all = {e.planned_steps for e in evals}
    planned = float(max(planned_all)) if compute == "steps" else 0.0
    if target_compute is None and planned:
        target_compute = planned
    later = sorted((c, r, wt) for w, wt in zip(windows, weights) for c, r in w.later)
    window = Window(sorted(p for w in windows for p in w.fitted), [(c, r) for c, r, _ in later], [wt for _, _, wt in later])
    out = _summarise(data, fit, window, compute=compute, target_compute=target_compute, target_pass_rate=target_pass_rate,
                     planned=planned, extend=extend, n_curve=n_curve)
    a_alone = np.array([f.A for f in alone])
    out.update(run=[str(e.run_dir) for e in evals], R0_source="step-0 evaluations of each run",
               planned_steps=int(max(planned_all)), notes=[n for e in evals for n in e.notes],
               runs=[{"run": str(e.run_dir), "A_alone": f.A, "B_alone": f.B, "C_mid_alone": f.C_mid, "noise_sd": math.sqrt(v),
                      "n_points": len(w.fitted)} for e, f, v, w in zip(evals, alone, var, windows)],
               A_spread={"min": float(a_alone.min()), "max": float(a_alone.max()), "sd": float(a_alone.std(ddof=1))})
    if len(planned_all) > 1:
        out["notes"].append(f"the runs plan different train.steps ({sorted(planned_all)}); forecasting at the largest")
    out["warnings"] = diagnose(fit, window, out.pop("_band"), r0_source="pooled", compute=compute, target=target_compute)
    return out


def _check_targets(target_compute: float | None, target_pass_rate: float | None, warmup_frac: float) -> None:
    if target_compute is not None and not (math.isfinite(target_compute) and target_compute > 0):
        raise ScaleRLError(f"--target-compute: {target_compute:g} must be a positive compute (steps or tokens)")
    if target_pass_rate is not None and not 0 < target_pass_rate < 1:
        raise ScaleRLError(f"--target-pass-rate: {target_pass_rate:g} must be a pass rate strictly between 0 and 1")
    if not 0 <= warmup_frac < 1:
        raise ScaleRLError(f"--warmup-frac: {warmup_frac:g} must be in [0, 1)")
