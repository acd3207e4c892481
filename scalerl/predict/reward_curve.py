"""The sigmoidal compute–performance curve of a run, fitted and extrapolated (ScaleRL paper).

    R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)

Khatri et al., "The Art of Scaling Reinforcement Learning Compute for LLMs", 2025: A is the
asymptotic pass rate, B the scaling exponent (steepness), C_mid the compute at which half of the
gain A − R0 is reached, R0 the pass rate before RL (held fixed, not fitted).

Fit (as in the paper): a grid over A and C_mid, with the best B found on a grid for each pair, then a
local refinement of the best grid cell by projected Levenberg–Marquardt on (A, ln C_mid, ln B) with
A kept in [0, 1]. Implemented in numpy (a 3-parameter problem; scipy is not needed). Uncertainty:
a residual bootstrap (resample the fit's residuals onto the fitted curve, refit from the point
estimate, N = 200) whose 2.5 / 97.5 percentiles give the 95 % band.

Compute axis of a run (`compute_key`): `steps` (default) or `tokens` (cumulative generated tokens,
the per-step `tokens` metric). Steps is the default because the point one wants a forecast at — the
planned `train.steps` — is known exactly beforehand, while the token count at the end depends on
completion lengths still to come; with a fixed batch shape and hardware, steps are proportional to
GPU-hours (the paper's axis) up to the drift of completion length. Tokens compare runs whose batch
shapes differ; FLOPs ≈ 6 · params · tokens is tokens up to a constant.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalerl.errors import ScaleRLError

MIN_POINTS = 4


def sigmoid_curve(c: np.ndarray, *, r0: float, a: float, b: float, c_mid: float) -> np.ndarray:
    """R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B); R(0) = R0."""
    c = np.asarray(c, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        x = np.exp(b * (math.log(c_mid) - np.log(np.maximum(c, 1e-300))))
    return r0 + (a - r0) / (1.0 + x)


@dataclass
class SigmoidFit:
    A: float
    B: float
    C_mid: float
    R0: float
    sse: float

    def __call__(self, c: Any) -> np.ndarray:
        return sigmoid_curve(c, r0=self.R0, a=self.A, b=self.B, c_mid=self.C_mid)

    def compute_for(self, target: float) -> float | None:
        """C with R(C) = target: C_mid / ((A − R0)/(target − R0) − 1)^(1/B); None when target is not between R0 and A."""
        lo, hi = sorted((self.R0, self.A))
        if not lo < target < hi:
            return None
        return self.C_mid / ((self.A - self.R0) / (target - self.R0) - 1.0) ** (1.0 / self.B)


def _grid_fit(c: np.ndarray, r: np.ndarray, r0: float) -> tuple[float, float, float]:
    """The best (A, B, C_mid) on a grid: A in [0, 1], C_mid log-spaced from c_min/10 to 100·c_max, B log-spaced 0.2–5."""
    a = np.linspace(0.0, 1.0, 101)[:, None, None, None]
    c_mid = np.geomspace(c.min() / 10, c.max() * 100, 60)[None, :, None, None]
    b = np.geomspace(0.2, 5.0, 30)[None, None, :, None]
    pred = r0 + (a - r0) / (1.0 + (c_mid / c[None, None, None, :]) ** b)  # (nA, nC, nB, n)
    sse = ((pred - r) ** 2).sum(-1)
    i, j, k = np.unravel_index(np.argmin(sse), sse.shape)
    return float(a[i, 0, 0, 0]), float(b[0, 0, k, 0]), float(c_mid[0, j, 0, 0])


def _refine(c: np.ndarray, r: np.ndarray, r0: float, a: float, b: float, c_mid: float, iters: int = 100) -> tuple[float, float, float]:
    """Projected Levenberg–Marquardt on θ = (A, ln C_mid, ln B), A clipped to [0, 1], B to [0.05, 20]. With x = (C_mid/C)^B:
    ∂R/∂A = 1/(1+x), ∂R/∂ln C_mid = −(A−R0)·B·x/(1+x)², ∂R/∂ln B = −(A−R0)·B·ln(C_mid/C)·x/(1+x)²."""
    theta = np.array([a, math.log(c_mid), math.log(b)])
    log_c = np.log(c)

    def residual(th: np.ndarray) -> np.ndarray:
        return sigmoid_curve(c, r0=r0, a=th[0], b=math.exp(th[2]), c_mid=math.exp(th[1])) - r

    res, lam = residual(theta), 1e-3
    for _ in range(iters):
        bb = math.exp(theta[2])
        u = np.clip(bb * (theta[1] - log_c), -700, 700)
        x = np.exp(u)
        d = (theta[0] - r0) * x / (1 + x) ** 2
        jac = np.stack([1 / (1 + x), -d * bb, -d * u], axis=1)  # (n, 3)
        g, h = jac.T @ res, jac.T @ jac
        improved = False
        for _ in range(20):
            step = np.linalg.solve(h + lam * np.diag(np.diag(h) + 1e-12), -g)
            trial = theta + step
            trial[0] = min(max(trial[0], 0.0), 1.0)
            trial[1] = min(max(trial[1], log_c.min() - 7.0), log_c.max() + 10.0)  # C_mid within [c_min/1e3, c_max·2e4]
            trial[2] = min(max(trial[2], math.log(0.05)), math.log(20.0))
            new = residual(trial)
            if new @ new < res @ res:
                theta, res, lam, improved = trial, new, lam / 3, True
                break
            lam *= 4
        if not improved or np.abs(step).max() < 1e-10:
            break
    return float(theta[0]), float(math.exp(theta[2])), float(math.exp(theta[1]))


def fit_sigmoid(compute: Any, pass_rate: Any, *, r0: float, method: str = "grid") -> SigmoidFit:
    """Least-squares fit of A, B, C_mid with R0 fixed. method: `grid` (grid, then refinement) or `naive`
    (the refinement alone from one fixed start, A = B = C_mid = 1 like curve_fit's default p0: the comparison)."""
    c, r = np.asarray(compute, dtype=float), np.asarray(pass_rate, dtype=float)
    if len(c) < 3 or (c <= 0).any():
        raise ScaleRLError("fit: need at least 3 points at positive compute")
    start = _grid_fit(c, r, r0) if method == "grid" else (1.0, 1.0, 1.0)
    a, b, c_mid = _refine(c, r, r0, *start)
    return SigmoidFit(a, b, c_mid, r0, float(((sigmoid_curve(c, r0=r0, a=a, b=b, c_mid=c_mid) - r) ** 2).sum()))


def bootstrap(fit: SigmoidFit, compute: Any, pass_rate: Any, *, n: int = 200, seed: int = 0) -> list[SigmoidFit]:
    """Residual bootstrap: refit ŷ + resampled residuals n times, starting from the point estimate."""
    c, r = np.asarray(compute, dtype=float), np.asarray(pass_rate, dtype=float)
    fitted = fit(c)
    resid = r - fitted
    rng = np.random.default_rng(seed)
    fits = []
    for _ in range(n):
        r_star = fitted + rng.choice(resid, size=len(resid), replace=True)
        a, b, c_mid = _refine(c, r_star, fit.R0, fit.A, fit.B, fit.C_mid)
        fits.append(SigmoidFit(a, b, c_mid, fit.R0, float("nan")))
    return fits


def eval_points(run_dir: Path) -> tuple[list[tuple[int, int, float]], float | None, int]:
    """((step, cumulative generated tokens, pass rate) of every in-loop evaluation, the step-0 pass rate
    or None, the planned train.steps or 0)."""
    from scalerl.jsonl import read_metrics

    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise ScaleRLError(f"{run_dir}: no metrics.jsonl here; give a run directory written by `scalerl train`")
    points, tokens = [], 0
    for row in read_metrics(run_dir):
        tokens += row.get("tokens") or 0
        if row.get("eval/pass_rate") is not None:
            points.append((int(row["step"]), tokens, float(row["eval/pass_rate"])))
    summary = run_dir / "summary.json"
    before = json.loads(summary.read_text()).get("pass_rate_before") if summary.is_file() else None
    steps = 0
    if (run_dir / "config.yaml").is_file():
        import yaml

        steps = int((yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("train", {}).get("steps", 0))
    return points, before, steps


def forecast_run(run_dir: Path, *, compute: str = "steps", warmup_frac: float = 0.1, max_step: int | None = None,
                 target_compute: float | None = None, target_pass_rate: float | None = None, n_boot: int = 200,
                 extend: float = 2.0, n_curve: int = 100, method: str = "grid", seed: int = 0) -> dict[str, Any] | None:
    """Fit the run's held-out pass rate against compute; None when fewer than 4 points remain to fit.

    Points: the in-loop evaluations (at steps ≤ `max_step` when given), dropping those below
    `warmup_frac` × the last fitted point's compute (the early transient the paper also leaves out).
    R0: `pass_rate_before` from summary.json, else the first evaluation. The curve runs from
    1 % to max(extend × last point, target_compute, the planned run's end) in `n_curve` steps.
    """
    if compute not in ("steps", "tokens"):
        raise ScaleRLError(f"--compute: {compute!r} is not one of steps, tokens")
    rows, before, planned = eval_points(run_dir)
    pts = [(float(step if compute == "steps" else tokens), r) for step, tokens, r in rows if max_step is None or step <= max_step]
    if before is None and pts:
        before, pts = pts[0][1], pts[1:]
    if pts:
        pts = [(c, r) for c, r in pts if c >= warmup_frac * pts[-1][0]]
    if len(pts) < MIN_POINTS or before is None:
        return None
    c, r = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    fit = fit_sigmoid(c, r, r0=before, method=method)
    end = max(extend * c[-1], target_compute or 0.0, float(planned) if compute == "steps" else 0.0)
    grid = np.linspace(end / n_curve, end, n_curve)
    boots = bootstrap(fit, c, r, n=n_boot, seed=seed) if n_boot else []
    out: dict[str, Any] = {"A": fit.A, "B": fit.B, "C_mid": fit.C_mid, "R0": fit.R0, "compute_key": compute,
                           "points": [[float(x), float(y)] for x, y in pts], "curve": [[float(x), float(y)] for x, y in zip(grid, fit(grid))],
                           "rmse": math.sqrt(fit.sse / len(pts)), "n_boot": len(boots)}
    if boots:
        curves = np.stack([b(grid) for b in boots])
        out["band_low"], out["band_high"] = np.percentile(curves, 2.5, axis=0).tolist(), np.percentile(curves, 97.5, axis=0).tolist()
    else:
        out["band_low"] = out["band_high"] = [y for _, y in out["curve"]]
    if target_compute is not None:
        out["target_compute"] = target_compute
        out["predicted_at_target"] = float(fit(target_compute))
        if boots:
            at = [float(b(target_compute)) for b in boots]
            out["target_band"] = [float(np.percentile(at, 2.5)), float(np.percentile(at, 97.5))]
    if target_pass_rate is not None:
        out["target_pass_rate"] = target_pass_rate
        out["compute_at_target"] = fit.compute_for(target_pass_rate)
    return out
