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
- `outside_band`: evaluations after the fit window (when the fit stops at --fit-until-step) leave
  the 95 % band widened by 2 × the fit's rmse, at least 0.005 (the band is the curve's; one evaluation adds its
  own noise): what happened later was not in the forecast;
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

MISFIT_RATIO = 2.0
SLOPE_T = 2.0
WIDE = 0.05
MIN_MARGIN = 0.005  # outside_band's smallest margin (exact data have a band of width 0)


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
        lc = np.array([p[0] for p in window.later])
        lr = np.array([p[1] for p in window.later])
        rmse = math.sqrt(float(np.mean((r - fit(c)) ** 2)))
        lo, hi = (np.array(e) for e in zip(*(band.interval(float(x)) for x in lc)))
        margin = max(2 * rmse, MIN_MARGIN)
        lo, hi = lo - margin, hi + margin
        outside = (lr < lo) | (lr > hi)
        if outside.sum() >= 2 or (outside.any() and outside[-1]):
            worst = int(np.argmax(np.maximum(np.array(lo) - lr, lr - np.array(hi))))
            out.append(_item("outside_band", f"{int(outside.sum())} of the {len(lr)} evaluations after the fit window fall outside "
                                             f"the 95 % band ± {margin:.3f} (2 rmse) (at {compute} {lc[worst]:.4g}: {lr[worst]:.3f}, band "
                                             f"{lo[worst]:.3f}-{hi[worst]:.3f}): the run changed course after the window"))
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
