"""Is the forecast's band honest, and how close are its numbers? Synthetic curves with known parameters, then real runs.

Synthetic: four curve families (R0, A, B, C_mid) evaluated every 50 steps to step 3000, with
Gaussian noise σ on every evaluation and on the step-0 one; `--draws` noise draws per family and
σ, fixed seeds. Per draw: the fit of the first half (steps ≤ 1500) and its 95 % band at step
3000 against the true R(3000); the fit of the whole run and A's 95 % interval against the true A.
Beside them, each family's Cramér–Rao bound: the least error any unbiased forecast can have from the
same evaluations and noise, and the share of draws within ±0.02 (±0.03 for A) it would give.

Real: the recorded evaluations of the default job's runs in bench/results/forecast_*steps*.json
(3000 and 600 steps; written by bench/forecast.py), written back as run folders and forecast by
`scalerl.predict.forecast.forecast_run` from their first half, against the mean of their last 5
evaluations (the level the run ended at), with the warnings the forecast gave.

    python bench/forecast_calibration.py --draws 200 --save
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scalerl.predict.forecast import forecast_run  # noqa: E402
from scalerl.predict.reward_curve import CurveData, ProfileBand, fit_curve, sigmoid_curve  # noqa: E402

FAMILIES = {  # (R0, A, B, C_mid) over 3000 steps
    "fast (bend at 10 % of the run)": (0.3, 0.85, 2.0, 300.0),
    "Scout-like (B 1.2, C_mid at half the run)": (0.3, 0.8, 1.2, 1500.0),
    "slow-high (B 0.8, C_mid past half)": (0.2, 0.9, 0.8, 2500.0),
    "late bend (C_mid past the run's end)": (0.3, 0.85, 1.5, 4000.0),
}
KEYS = ("r0", "a", "b", "c_mid")
STEPS = np.arange(50.0, 3001.0, 50.0)
HALF = STEPS[STEPS <= 1500]


def jacobian(theta: tuple[float, float, float, float], c: np.ndarray) -> np.ndarray:
    """∂R(c)/∂(R0, A, B, C_mid), (4, len(c)), by central differences."""
    rows = []
    for k, v in enumerate(theta):
        h = 1e-6 * max(1.0, abs(v))
        lo, hi = list(theta), list(theta)
        lo[k], hi[k] = v - h, v + h
        rows.append((sigmoid_curve(c, **dict(zip(KEYS, hi))) - sigmoid_curve(c, **dict(zip(KEYS, lo)))) / (2 * h))
    return np.array(rows)


def cramer_rao_sd(theta: tuple[float, float, float, float], sigma: float, steps: np.ndarray, g: np.ndarray) -> float:
    """The Cramér–Rao bound on the standard deviation of any unbiased estimate of a quantity whose gradient in θ
    is g (∇θ R(3000), or e_A for A), from evaluations at `steps` and the one of R0, each with noise σ:
    sqrt(gᵀ J⁻¹ g), J = (Σ ∇R ∇Rᵀ + e_R0 e_R0ᵀ) / σ² the Fisher information."""
    jac = jacobian(theta, steps)
    fisher = (jac @ jac.T + np.diag([1.0, 0.0, 0.0, 0.0])) / sigma**2
    return float(np.sqrt(g @ np.linalg.solve(fisher, g)))


def bounds(theta: tuple[float, float, float, float], sigma: float) -> dict:
    """A family's Cramér–Rao figures: R(3000) from the first half, A from the whole run, and the share of draws
    within ±0.02 / ±0.03 that an unbiased estimate at the bound (Gaussian errors) would reach: erf(tol / (sd √2))."""
    sd_final = cramer_rao_sd(theta, sigma, HALF, jacobian(theta, np.array([3000.0]))[:, 0])
    sd_a = cramer_rao_sd(theta, sigma, STEPS, np.array([0.0, 1.0, 0.0, 0.0]))
    return {"crb_sd_final": sd_final, "crb_best_final_within_0.02": math.erf(0.02 / sd_final / math.sqrt(2)),
            "crb_sd_A": sd_a, "crb_best_A_within_0.03": math.erf(0.03 / sd_a / math.sqrt(2))}


def synthetic(sigma: float, draws: int, seed: int) -> list[dict]:
    rows = []
    for k, (name, (r0, a, b, cm)) in enumerate(FAMILIES.items()):
        rng = np.random.default_rng(seed + k)
        truth = float(sigmoid_curve(3000.0, r0=r0, a=a, b=b, c_mid=cm))
        cover = near = a_near = a_cover = 0
        widths, errors = [], []
        for _ in range(draws):
            r = sigmoid_curve(STEPS, r0=r0, a=a, b=b, c_mid=cm) + rng.normal(0, sigma, len(STEPS))
            r0_obs = r0 + rng.normal(0, sigma)
            half = CurveData.of(HALF, r[: len(HALF)], r0=r0_obs)
            fit = fit_curve(half)
            lo, hi = ProfileBand(half, fit).interval(3000.0)
            pred = float(fit(3000.0))
            cover += lo <= truth <= hi
            near += abs(pred - truth) <= 0.02
            widths.append(hi - lo)
            errors.append(pred - truth)
            whole = CurveData.of(STEPS, r, r0=r0_obs)
            fit_all = fit_curve(whole)
            a_lo, a_hi = ProfileBand(whole, fit_all).interval(float("inf"))
            a_near += abs(fit_all.A - a) <= 0.03
            a_cover += a_lo <= a <= a_hi
        rows.append({"family": name, "R0": r0, "A": a, "B": b, "C_mid": cm, "sigma": sigma, "draws": draws,
                     "final_band_coverage": cover / draws, "final_within_0.02": near / draws,
                     "final_median_error": statistics.median(errors), "final_error_sd": statistics.pstdev(errors), "final_median_band_width": statistics.median(widths),
                     "A_within_0.03_whole_run": a_near / draws, "A_interval_coverage": a_cover / draws,
                     **bounds((r0, a, b, cm), sigma)})
    return rows


def real(tmp: Path) -> list[dict]:
    rows = []
    for path in sorted(glob.glob(str(ROOT / "bench/results/forecast_*steps*.json"))):
        report = json.loads(Path(path).read_text())
        steps = (report.get("args") or {}).get("steps")
        for run in report["runs"]:
            if "evals" not in run or steps is None:
                continue
            folder = tmp / f"{Path(path).stem}_{run['run']}"
            folder.mkdir()
            evals = dict((int(s), v) for s, v in run["evals"])
            lines = [json.dumps({"step": s, "tokens": 1, **({"eval/pass_rate": evals[s]} if s in evals else {})}) for s in range(steps + 1)]
            (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
            (folder / "config.yaml").write_text(f"train:\n  steps: {steps}\n")
            fc = forecast_run(folder, max_step=steps // 2)
            level = statistics.fmean(run["last_5_evals"])
            warnings = [w["rule"] for w in fc["warnings"] if w["kind"] == "warning"]
            rows.append({"source": Path(path).name, "run": run["run"], "steps": steps, "predicted": fc["predicted_at_target"],
                         "band": fc["target_band"], "mean_last_5": level, "error": fc["predicted_at_target"] - level,
                         "band_covers_mean_last_5": fc["target_band"][0] <= level <= fc["target_band"][1], "warnings": warnings,
                         "ok": abs(fc["predicted_at_target"] - level) <= 0.05 or bool(warnings)})
    return rows


def markdown(report: dict) -> str:
    lines = [f"# Forecast calibration, {report['date']}", "", f"`{report['command']}` ({report['wall_s']:.0f} s)", "",
             "## Synthetic curves: 95 % band coverage and accuracy", "",
             "| family | σ | draws | band covers R(3000), half-run fit | within ±0.02 | error sd | Cramér–Rao: sd, best within ±0.02 | "
             "median error | median band width | A within ±0.03, whole run | Cramér–Rao: sd, best within ±0.03 | A interval covers A |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["synthetic"]:
        lines.append(f"| {r['family']} | {r['sigma']:g} | {r['draws']} | {100 * r['final_band_coverage']:.1f} % | "
                     f"{100 * r['final_within_0.02']:.0f} % | {r['final_error_sd']:.4f} | {r['crb_sd_final']:.4f}, {100 * r['crb_best_final_within_0.02']:.0f} % | "
                     f"{r['final_median_error']:+.3f} | {r['final_median_band_width']:.3f} | "
                     f"{100 * r['A_within_0.03_whole_run']:.0f} % | {r['crb_sd_A']:.4f}, {100 * r['crb_best_A_within_0.03']:.0f} % | "
                     f"{100 * r['A_interval_coverage']:.1f} % |")
    lines += ["", "Cramér–Rao: the smallest standard deviation any unbiased forecast can have from these evaluations and this "
              "noise (sqrt(gᵀJ⁻¹g), J the Fisher information of (R0, A, B, C_mid)), and the share of draws such a forecast "
              "would put within the tolerance with Gaussian errors. A forecast above it is biased toward these curves "
              "(the fit's bounds on B and C_mid do that), which no estimator can be on every curve."]
    lines += ["", "## Real runs (the default job), forecast from the first half", "",
              "| runs | run | steps | predicted at end | 95 % band | mean of last 5 | error | warnings |", "|---|---|---|---|---|---|---|---|"]
    for r in report["real"]:
        lines.append(f"| {r['source']} | {r['run']} | {r['steps']} | {r['predicted']:.3f} | {r['band'][0]:.3f}–{r['band'][1]:.3f} | "
                     f"{r['mean_last_5']:.3f} | {r['error']:+.3f} | {', '.join(r['warnings']) or '—'} |")
    lines += ["", "## Summary", ""] + [f"- {k}: {v}" for k, v in report["summary"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--sigmas", type=float, nargs="+", default=[0.015, 0.005])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    start = time.time()
    synth = [row for s in args.sigmas for row in synthetic(s, args.draws, args.seed)]
    with tempfile.TemporaryDirectory() as tmp:
        runs = real(Path(tmp))
    summary = {
        "lowest synthetic band coverage (stated 95 %)": f"{100 * min(r['final_band_coverage'] for r in synth):.1f} %",
        "real runs within ±0.05 of the mean of their last 5, or warned": f"{sum(r['ok'] for r in runs)} of {len(runs)}",
        "real 3000-step runs within ±0.05": f"{sum(abs(r['error']) <= 0.05 for r in runs if r['steps'] == 3000)} of "
                                            f"{sum(r['steps'] == 3000 for r in runs)}",
        "real runs whose band covers the mean of their last 5": f"{sum(r['band_covers_mean_last_5'] for r in runs)} of {len(runs)}",
    }
    date = datetime.date.today().isoformat()
    report = {"date": date, "command": "python bench/forecast_calibration.py " + " ".join(sys.argv[1:]), "wall_s": time.time() - start,
              "synthetic": synth, "real": runs, "summary": summary}
    text = markdown(report)
    print(text)
    if args.save:
        out = ROOT / "bench" / "results" / f"forecast_calibration_{date}"
        out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
