"""When not to trust a forecast: warnings that travel with its numbers (CLI, report, JSON).

Each check returns {"rule", "kind" (warning | note), "message"}; the message states the numbers
that decided. The rules:
- `at_bound`: a parameter sits at an edge of the search (A at 0 or 1, B at 0.1 or 10): the data
  do not bound it, and the numbers that depend on it are the search's, not the run's;
- `no_bend`: the fitted C_mid lies beyond the last fitted evaluation: the bend has not been
  seen, the final level is not identifiable from this window; the message gives the lower bound
  of A that the data do support (the lower end of A's profile interval);
- `misfit`: the rmse is more than 2 × the evaluations' own noise, estimated from successive
  differences (σ ≈ rms(Δr) / √2, which a smooth trend barely moves): the curve is not a sigmoid
  here (a collapse, a regime change, a schedule change);
- `outside_band`: the evaluations after the fit window (when the fit stops at --fit-until-step) do
  not follow the forecast: the predictive F-test (Chow 1960) of the k later evaluations,
  F = ((S_all − S_fit) / k) / σ², S the least (weighted) squares of the fit without and with them;
  it fires when P(F(k, df) > F) < ALPHA (0.05). σ² pools the fit's residuals (S_fit over its df)
  with the later evaluations' successive differences (mean Δr² / 2 over 2(k − 1)/3 degrees of
  freedom; a shift after the window barely moves them): the residuals of a 4-parameter fit to a
  few evaluations alone understate the noise, which made the rule it replaced (two evaluations
  outside the band ± 2 rmse) fire on 7-10 % of true sigmoids. σ is floored at MIN_SD (0.0025) so
  that exact data do not fire on the grid's rounding. Measured false alarms: tests/predict/;
- `flat` / `falling`: the fitted evaluations' least-squares slope is within 2 standard errors
  of 0, or more than 2 below it;
- `wide_band`: the 95 % band at the target compute is wider than ± WIDE (0.05): the window does
  not pin the final value down enough to plan on;
- `r0` (note): R0 rests on a single evaluation (its noise is in the band): the step-0 one, or without it the
  first evaluation whatever its step (kept past the warm-up cut), or on none.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from scalerl.predict.reward_curve import CurveData, f_sf, fit_curve

MISFIT_RATIO = 2.0
SLOPE_T = 2.0
WIDE = 0.05
ALPHA = 0.05  # outside_band's false-alarm rate on a run that follows a sigmoid
MIN_SD = 0.0025  # outside_band's smallest noise sd (exact data have none)


def _item(rule: str, message: str, kind: str = "warning") -> dict[str, str]:
    return {"rule": rule, "kind": kind, "message": message}


def diagnose(fit, window, band, *, r0_source: str, compute: str, target: float | None = None) -> list[dict[str, str]]:
    c = np.array([p[0] for p in window.fitted])
    r = np.array([p[1] for p in window.fitted])
    out: list[dict[str, str]] = []
    for what in fit.at_bound():
        out.append(_item("at_bound", f"{what}: the data do not bound it, so the numbers that depend on it are the search's edge"))
    if fit.C_mid > c.max():
        a_lo = band.interval(math.inf)[0]
        out.append(_item("no_bend", f"no bend yet: C_mid {fit.C_mid:.4g} lies beyond the last fitted evaluation ({compute} "
                                    f"{c.max():.4g}), so the final level is not identifiable from this window; the data support "
                                    f"A >= {a_lo:.3f}"))
    if len(r) >= 6:
        noise = math.sqrt(float(np.mean(np.diff(r) ** 2)) / 2)
        rmse = math.sqrt(float(np.mean((r - fit(c)) ** 2)))
        if noise > 0 and rmse > MISFIT_RATIO * noise:
            out.append(_item("misfit", f"rmse {rmse:.3f} is {rmse / noise:.1f}x the evaluations' noise ({noise:.3f}, from successive "
                                       f"differences; over {MISFIT_RATIO:g}x): the curve does not follow a sigmoid here (a collapse "
                                       "or a regime change?)"))
    if window.later:
        out.extend(later_check(fit, band.data, window, compute=compute))
    if len(r) >= 3:
        x = c - c.mean()
        slope = float(x @ (r - r.mean()) / (x @ x))
        resid = r - r.mean() - slope * x
        se = math.sqrt(float(resid @ resid) / (len(r) - 2) / float(x @ x)) if len(r) > 2 else math.inf
        t = slope / se if se > 0 else math.inf * np.sign(slope)
        if t < -SLOPE_T:
            out.append(_item("falling", f"the pass rate falls over the fitted window (slope t = {t:.1f}): a sigmoid rise does not describe it"))
        elif t < SLOPE_T:
            out.append(_item("flat", f"the pass rate is flat over the fitted window (slope t = {t:.1f}, under {SLOPE_T:g}): "
                                     "the fit extrapolates noise"))
    if target is not None:
        lo, hi = band.interval(target)
        if hi - lo > 2 * WIDE:
            out.append(_item("wide_band", f"the 95 % band at {compute} {target:.4g} spans {lo:.3f}-{hi:.3f}, wider than "
                                          f"+-{WIDE:g}: this window does not pin the final value down; fit more of the run"))
    if r0_source in ("step-0 evaluation", "summary.json"):
        out.append(_item("r0", f"R0 (fitted {fit.R0:.3f}) rests on one evaluation ({r0_source}); its noise is in the band", "note"))
    elif r0_source.startswith("first evaluation"):
        out.append(_item("r0", f"no step-0 evaluation: R0 (fitted {fit.R0:.3f}) rests on the {r0_source}, kept past the warm-up cut",
                         "note"))
    elif r0_source == "none":
        out.append(_item("r0", "no step-0 evaluation: R0 is fitted from the curve alone", "note"))
    return out


def later_check(fit, data: CurveData, window, *, compute: str) -> list[dict[str, str]]:
    """`outside_band` (see the module docstring): [] or the one warning."""
    lc = np.array([p[0] for p in window.later])
    lr = np.array([p[1] for p in window.later])
    lw = np.full(len(lc), float(data.w.mean())) if window.later_w is None else np.asarray(window.later_w, dtype=float)
    if data.df < 1:
        return []
    k = len(lc)
    # the noise from the fit's residuals and from the later evaluations' successive differences (a shift
    # after the window barely moves those): a fit with few degrees of freedom overfits, and its residuals alone
    # would understate the noise
    k_d = 2 * (k - 1) / 3  # k − 1 differences, each pair sharing a point: about 2/3 of a degree of freedom each
    diff_var = float(np.mean(np.diff(lr) ** 2 * lw[1:])) / 2 if k > 1 else 0.0  # E[(r_j+1 − r_j)²] = 2σ² on a flat stretch
    df = data.df + k_d
    var = max((fit.sse + k_d * diff_var) / df, MIN_SD ** 2 * float(data.w.mean()))  # in the fit's weight units
    refit = fit_curve(CurveData(np.concatenate([data.c, lc]), np.concatenate([data.r, lr]), np.concatenate([data.w, lw])))
    f = max(refit.sse - fit.sse, 0.0) / k / var
    p = f_sf(f, k, df)
    if p >= ALPHA:
        return []
    z = (lr - fit(lc)) * np.sqrt(lw / var)
    worst = int(np.argmax(np.abs(z)))
    return [_item("outside_band", f"the {k} evaluations after the fit window do not follow the forecast (F = {f:.1f} on {k} and "
                                  f"{df:.0f} degrees of freedom, p = {p:.2g} < {ALPHA:g}; the furthest, at {compute} {lc[worst]:.4g}: "
                                  f"{lr[worst]:.3f} against {float(fit(lc[worst])):.3f}, {z[worst]:+.1f} sd): the run changed course "
                                  "after the window")]
