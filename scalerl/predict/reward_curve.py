"""The sigmoidal compute–performance curve of a run, fitted with a calibrated band (ScaleRL paper).

    R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B),   R(0) = R0

Khatri et al., "The Art of Scaling Reinforcement Learning Compute for LLMs", 2025: A is the
asymptotic pass rate, B the scaling exponent (steepness), C_mid the compute at which half of the
gain A − R0 is reached, R0 the pass rate before RL.

Fit. For fixed (B, C_mid) the curve is linear in (R0, A): R = R0·(1 − s) + A·s with
s = 1 / (1 + (C_mid / C)^B), so the least-squares (R0, A) in the box [0, 1]² has a closed form
(variable projection). (B, C_mid) are searched on a log grid (B 0.1–10, C_mid from c_min/30 to
300·c_max), then on two finer grids around the best cell. R0 is a parameter like the others: the
step-0 evaluation is an observation of it at C = 0 (s = 0), so its sampling noise is in the fit
and in the band instead of being taken as exact. Observations may carry weights (1/σ² per run
when several runs are fitted together, `scalerl.predict.forecast.forecast_runs`).

Band (profile likelihood). For a value v of the curve at C*, S(v) is the least weighted sum of
squares over every curve with R(C*) = v (on the grid; for fixed (B, C_mid) and v the best R0 is
again closed-form: R = R0 + (v − R0)·s/s*, R0 clipped to the range that keeps A in [0, 1]). The
95 % interval is {v : S(v) ≤ S_min · (1 + F/df)}, F = t²(0.975, df) and df = observations − 4:
the F-test inversion that profile intervals use when the noise level is estimated from the
residuals. Unlike a residual bootstrap from the point estimate it lets (B, C_mid) range over all
curves the data allow, which is what widens the band of a curve whose bend has not been seen.
Implemented in numpy; no scipy.

Compute axis of a run: `steps` (default) or `tokens` (cumulative generated tokens); see
`scalerl.predict.run_evals`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from scalerl.errors import ScaleRLError

N_PARAMS = 4  # R0, A, B, C_mid
B_RANGE = (0.1, 10.0)
C_MID_RANGE = (1 / 30, 300.0)  # × the smallest / largest positive compute observed
GRID = 90  # cells per axis of the global (B, C_mid) grid
V_GRID = np.linspace(0.0, 1.0, 201)


def sigmoid_curve(c: Any, *, r0: float, a: float, b: float, c_mid: float) -> np.ndarray:
    """R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B); R(0) = R0."""
    return r0 + (a - r0) * _s(np.asarray(c, dtype=float), b, c_mid)


def _s(c: np.ndarray, b: Any, c_mid: Any) -> np.ndarray:
    """1 / (1 + (C_mid / C)^B), 0 at C = 0; broadcasts b and c_mid against c."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        u = np.clip(b * (np.log(c_mid) - np.log(np.maximum(c, 1e-300))), -700, 700)
        return np.where(c > 0, 1.0 / (1.0 + np.exp(u)), 0.0)


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (Cornish–Fisher expansion, Abramowitz & Stegun 26.7.5; within 0.1 % for df ≥ 3)."""
    z = NormalDist().inv_cdf(p)
    g = [(z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
         (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
         (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160]
    return z + sum(gi / df ** (i + 1) for i, gi in enumerate(g))


def f_sf(x: float, d1: float, d2: float) -> float:
    """P(F > x) for F ~ F(d1, d2): the regularized incomplete beta I_{d2/(d2 + d1·x)}(d2/2, d1/2)
    (Abramowitz & Stegun 26.6.2), by its continued fraction (Numerical Recipes 6.4)."""
    if x <= 0:
        return 1.0
    return _beta_inc(d2 / 2, d1 / 2, d2 / (d2 + d1 * x))


def _beta_inc(a: float, b: float, x: float) -> float:
    if x <= 0 or x >= 1:
        return float(x >= 1)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below the mean: use the symmetry
        return 1.0 - _beta_inc(b, a, 1 - x)
    tiny, f, c, d = 1e-300, 1.0, 1.0, 0.0  # Lentz's method
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / (c if abs(c) > tiny else tiny)
        f *= c * d
        if abs(1.0 - c * d) < 1e-12:
            break
    return front * (f - 1.0) / a


@dataclass(frozen=True)
class CurveData:
    """Weighted observations (C, pass rate, weight); C = 0 marks an observation of R0."""

    c: np.ndarray
    r: np.ndarray
    w: np.ndarray

    @staticmethod
    def of(compute: Any, pass_rate: Any, *, r0: float | None = None, weights: Any = None) -> "CurveData":
        c, r = np.asarray(compute, dtype=float), np.asarray(pass_rate, dtype=float)
        w = np.ones_like(c) if weights is None else np.asarray(weights, dtype=float)
        if r0 is not None:
            c, r, w = np.append(0.0, c), np.append(r0, r), np.append(w[0] if len(w) else 1.0, w)
        return CurveData(c, r, w)

    @staticmethod
    def join(parts: list["CurveData"], weights: list[float]) -> "CurveData":
        return CurveData(np.concatenate([p.c for p in parts]), np.concatenate([p.r for p in parts]),
                         np.concatenate([p.w * w for p, w in zip(parts, weights)]))

    @property
    def df(self) -> int:
        return len(self.c) - N_PARAMS

    def grid(self, n: int = GRID) -> tuple[np.ndarray, np.ndarray]:
        """The global search: (B, C_mid) of every cell of an n × n log grid, flattened."""
        pos = self.c[self.c > 0]
        return _cells(np.geomspace(*B_RANGE, n), np.geomspace(pos.min() * C_MID_RANGE[0], pos.max() * C_MID_RANGE[1], n))

    def sums(self, b: np.ndarray, c_mid: np.ndarray) -> dict[str, np.ndarray]:
        """The weighted sums the closed forms need, one per cell (b[k], c_mid[k])."""
        s = _s(self.c[None, :], b[:, None], c_mid[:, None])
        w, r = self.w, self.r
        ones = np.ones(len(b))
        return {"w": ones * w.sum(), "s": s @ w, "ss": (s * s) @ w, "r": ones * (w @ r), "sr": s @ (w * r),
                "rr": ones * (w @ (r * r))}


def _cells(b: np.ndarray, c_mid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bb, cc = np.meshgrid(b, c_mid, indexing="ij")
    return bb.ravel(), cc.ravel()


def _around(b: float, c_mid: float, db: float, dc: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """An n × n grid of ± db (in ln B) and ± dc (in ln C_mid) around (b, c_mid), B kept in B_RANGE."""
    return _cells(np.clip(np.exp(np.linspace(math.log(b) - db, math.log(b) + db, n)), *B_RANGE),
                  np.exp(np.linspace(math.log(c_mid) - dc, math.log(c_mid) + dc, n)))


@dataclass(frozen=True)
class SigmoidFit:
    A: float
    B: float
    C_mid: float
    R0: float
    sse: float  # weighted
    n: int  # observations, the R0 one included

    def __call__(self, c: Any) -> np.ndarray:
        return sigmoid_curve(c, r0=self.R0, a=self.A, b=self.B, c_mid=self.C_mid)

    def compute_for(self, target: float) -> float | None:
        """C with R(C) = target: C_mid / ((A − R0)/(target − R0) − 1)^(1/B); None when target is not between R0 and A."""
        lo, hi = sorted((self.R0, self.A))
        if not lo < target < hi:
            return None
        return self.C_mid / ((self.A - self.R0) / (target - self.R0) - 1.0) ** (1.0 / self.B)

    def at_bound(self) -> list[str]:
        """The parameters sitting at an edge of the search (the data do not bound them)."""
        out = []
        if self.A <= 1e-3 or self.A >= 1 - 1e-3:
            out.append(f"A = {self.A:.3f} (its bound {round(self.A)})")
        if self.B <= B_RANGE[0] * 1.05 or self.B >= B_RANGE[1] / 1.05:
            out.append(f"B = {self.B:.3g} (the search covers {B_RANGE[0]:g}–{B_RANGE[1]:g})")
        return out


def _box_fit(m: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares of r ≈ R0·(1 − s) + A·s over (R0, A) ∈ [0, 1]², elementwise over the grid: (R0, A, sse)."""
    uu, us, ss = m["w"] - 2 * m["s"] + m["ss"], m["s"] - m["ss"], m["ss"]
    ur, sr = m["r"] - m["sr"], m["sr"]

    def sse(r0, a):
        return m["rr"] - 2 * r0 * ur - 2 * a * sr + r0 * r0 * uu + 2 * r0 * a * us + a * a * ss

    with np.errstate(divide="ignore", invalid="ignore"):
        det = uu * ss - us * us
        r0_free, a_free = (ur * ss - us * sr) / det, (uu * sr - us * ur) / det
        free_ok = (det > 1e-12 * np.maximum(uu * ss, 1e-300)) & (r0_free >= 0) & (r0_free <= 1) & (a_free >= 0) & (a_free <= 1)
        candidates = [(np.where(free_ok, r0_free, 0.0), np.where(free_ok, a_free, 0.0), free_ok)]
        for r0 in (0.0, 1.0):  # the edges R0 = 0 and R0 = 1, A clipped
            a = np.clip(np.nan_to_num((sr - r0 * us) / ss), 0, 1)
            candidates.append((np.full_like(a, r0), a, np.ones_like(a, bool)))
        for a in (0.0, 1.0):
            r0 = np.clip(np.nan_to_num((ur - a * us) / uu), 0, 1)
            candidates.append((r0, np.full_like(r0, a), np.ones_like(r0, bool)))
    best_r0, best_a, best_sse = np.zeros(uu.shape), np.zeros(uu.shape), np.full(uu.shape, np.inf)
    for r0, a, ok in candidates:
        e = np.where(ok, sse(r0, a), np.inf)
        take = e < best_sse
        best_r0, best_a, best_sse = np.where(take, r0, best_r0), np.where(take, a, best_a), np.where(take, e, best_sse)
    return best_r0, best_a, np.maximum(best_sse, 0.0)


def fit_curve(data: CurveData) -> SigmoidFit:
    """Least squares over (R0, A, B, C_mid): the global grid, then two finer grids around its best cell."""
    if (data.c > 0).sum() < 3:
        raise ScaleRLError("fit: need at least 3 evaluations at positive compute")
    b, cm = data.grid()
    db, dc = math.log(b[GRID] / b[0]) * 1.5, math.log(cm[1] / cm[0]) * 1.5  # 1.5 cells of the global grid
    for zoom in range(3):
        r0, a, sse = _box_fit(data.sums(b, cm))
        k = int(np.argmin(sse))
        best = SigmoidFit(float(a[k]), float(b[k]), float(cm[k]), float(r0[k]), float(sse[k]), len(data.c))
        b, cm = _around(best.B, best.C_mid, db, dc, 25)
        db, dc = db / 12, dc / 12
    return best


def fit_sigmoid(compute: Any, pass_rate: Any, *, r0: float | None = None) -> SigmoidFit:
    """`fit_curve` of one run's evaluations, with the step-0 pass rate `r0` as an observation when given."""
    return fit_curve(CurveData.of(compute, pass_rate, r0=r0))


class ProfileBand:
    """95 % (or `level`) profile-likelihood intervals of the curve's value at any C, A included (C = ∞)."""

    def __init__(self, data: CurveData, fit: SigmoidFit, level: float = 0.95):
        self.data, self.fit, self.level = data, fit, level
        b, cm = data.grid()
        step_b, step_c = math.log(b[GRID] / b[0]), math.log(cm[1] / cm[0])
        # the optimum's neighbourhood 5× and 20× finer: where the data pin the curve down, a grid cell's
        # error in S would otherwise be as large as the threshold's margin and narrow the band
        near = [_around(fit.B, fit.C_mid, k * step_b, k * step_c, 41) for k in (4, 1)]
        b, cm = np.concatenate([b, *(n[0] for n in near)]), np.concatenate([cm, *(n[1] for n in near)])
        m = data.sums(b, cm)
        if data.df >= 1:
            f = t_quantile(0.5 + level / 2, data.df) ** 2
            self.threshold = fit.sse * (1 + f / data.df) + 1e-15
        else:
            self.threshold = math.inf
        keep = _box_fit(m)[2] <= self.threshold  # a cell whose best curve misses the threshold never counts
        self.b, self.cm, self.m = b[keep], cm[keep], {k: x[keep] for k, x in m.items()}

    def _profile(self, s_star: np.ndarray, v: np.ndarray) -> np.ndarray:
        """min over the cells of S(v): shape (len(v),). Along the line (1 − s*)·R0 + s*·A = v,
        (R0, A) = (v, v) + t·(s*, −(1 − s*)); the sum of squares is quadratic in t, its minimum
        clipped to the t that keep R0 and A in [0, 1]. (No division by s*: stable where s* → 0.)"""
        m = {k: x[:, None] for k, x in self.m.items()}
        p, v = s_star[:, None], v[None, :]
        q = 1 - p
        uu, us, ss = m["w"] - 2 * m["s"] + m["ss"], m["s"] - m["ss"], m["ss"]
        ur, sr = m["r"] - m["sr"], m["sr"]
        base = m["rr"] - 2 * v * m["r"] + v * v * m["w"]  # S at R0 = A = v
        lin = p * (v * (uu + us) - ur) - q * (v * (us + ss) - sr)
        quad = p * p * uu - 2 * p * q * us + q * q * ss
        with np.errstate(divide="ignore", invalid="ignore"):
            t_lo = np.maximum(np.where(p > 0, -v / p, -np.inf), np.where(q > 0, (v - 1) / q, -np.inf))
            t_hi = np.minimum(np.where(p > 0, (1 - v) / p, np.inf), np.where(q > 0, v / q, np.inf))
            t = np.clip(np.where(quad > 0, -lin / quad, 0.0), t_lo, t_hi)
        return np.maximum(base + 2 * t * lin + t * t * quad, 0.0).min(axis=0)

    def interval(self, c_star: float) -> tuple[float, float]:
        """The interval of R(c_star) (c_star = math.inf: of A), clipped to [0, 1]."""
        if not math.isfinite(self.threshold):
            return 0.0, 1.0
        s_star = np.ones_like(self.b) if math.isinf(c_star) else _s(np.full_like(self.b, c_star), self.b, self.cm)
        inside = V_GRID[self._profile(s_star, V_GRID) <= self.threshold]
        centre = float(self.fit(c_star)) if math.isfinite(c_star) else self.fit.A
        if len(inside) == 0:
            return centre, centre
        step = V_GRID[1] - V_GRID[0]
        edges = []
        for edge, outward in ((inside.min(), -1), (inside.max(), 1)):  # refine each edge to step/40
            fine = np.clip(edge + outward * np.linspace(0, step, 41), 0, 1)
            ok = fine[self._profile(s_star, fine) <= self.threshold]
            edges.append(float(ok.min() if outward < 0 else ok.max()) if len(ok) else float(edge))
        return min(edges[0], centre), max(edges[1], centre)

    def bands(self, c: np.ndarray, points: int = 20) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper band along `c` (intervals at `points` places, interpolated in log C)."""
        c = np.asarray(c, dtype=float)
        at = np.unique(np.geomspace(c.min(), c.max(), min(points, len(c))))
        lo, hi = zip(*(self.interval(float(x)) for x in at))
        return np.interp(np.log(c), np.log(at), lo), np.interp(np.log(c), np.log(at), hi)
