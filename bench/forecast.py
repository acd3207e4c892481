"""Forecasts checked against what the runs then did: final pass rate from the first half, and total time from 10 %.

Runs the real CLI (`scalerl train`: the built-in default job, GRPO on arithmetic) for each seed with
`--steps` steps, an evaluation every `--eval-every` steps on `--num-eval` held-out prompts (greedy, or
mean@`--eval-samples` at `--eval-temperature`, the metric the ScaleRL paper fits), and
`--threads` torch threads per run (`--jobs` runs side by side; the machine has 2 cores). Then, per run:

- reward forecast: `forecast_run(run_dir, max_step=steps/2)` fits the sigmoid on the evaluations of
  the first half (plus the step-0 pass rate as R0) and predicts the pass rate at the last step; the
  error is prediction − the measured final `eval/pass_rate`. Also for warm-up fractions 0 / 0.1 /
  0.2, and compute = tokens (the final token count is then taken from the
  run: a hindsight figure).
- time forecast: `time_estimate_at_10pct_s` against `time_actual_s` from the run's summary.json.

    python bench/forecast.py --seeds 0 1 2 --save                       # trains, then analyses
    python bench/forecast.py --runs-dir /tmp/fc --skip-train --save     # analyse existing runs
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def train_args(args: argparse.Namespace, seed: int) -> list[str]:
    return ["--set", f"train.seed={seed}", "--set", f"train.steps={args.steps}", "--set", f"eval.every={args.eval_every}",
            "--set", f"env.args.num_eval={args.num_eval}", "--set", f"train.threads={args.threads}",
            "--set", f"log.run_dir={args.runs_dir}", "--name", f"seed{seed}", "--set", "log.console=none",
            "--set", "log.tensorboard=false", "--set", "checkpoint.save_final=false",
            "--set", f"eval.temperature={args.eval_temperature}", "--set", f"eval.samples={args.eval_samples}",
            *[a for item in args.set for a in ("--set", item)]]


def train(args: argparse.Namespace, seed: int) -> subprocess.Popen:
    """Start one training run of the real CLI (the caller waits)."""
    cmd = [sys.executable, "-m", "scalerl.cli.main", "train", *train_args(args, seed)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def final_eval(run_dir: Path, key: str) -> tuple[float, float]:
    """(compute at the last evaluation, its pass rate), compute being the step or the cumulative tokens."""
    from scalerl.jsonl import read_metrics

    tokens, last = 0, None
    for row in read_metrics(run_dir):
        tokens += row["tokens"]
        if row.get("eval/pass_rate") is not None:
            last = (row["step"] if key == "steps" else tokens, row["eval/pass_rate"])
    return last


def analyse(run_dir: Path, half: int) -> dict:
    from scalerl.predict.forecast import forecast_run

    summary = json.loads((run_dir / "summary.json").read_text())
    row: dict = {"run": run_dir.name, "pass_rate_before": summary["pass_rate_before"], "pass_rate_after": summary["pass_rate_after"],
                 "time_estimate_at_10pct_s": summary["time_estimate_at_10pct_s"], "time_actual_s": summary["time_actual_s"],
                 "time_rel_error": summary["time_estimate_rel_error"], "forecasts": []}
    from scalerl.jsonl import read_metrics

    from scalerl.config import HealthConfig
    from scalerl.monitor.health import HealthMonitor

    evals = [(0, summary["pass_rate_before"])] + [(r["step"], r["eval/pass_rate"]) for r in read_metrics(run_dir)
                                                   if r.get("eval/pass_rate") is not None]
    row["evals"] = evals
    row["last_5_evals"] = [p for _, p in evals[-5:]]  # how much the pass rate moves between neighbouring evaluations at the end
    monitor = HealthMonitor(HealthConfig(), completions_per_step=1)  # the pass_rate_drop rule with its defaults, replayed
    row["pass_rate_drop_alarms"] = [step for step, p in evals if monitor.evaluate_pass_rate(step, p)]
    for key in ("steps", "tokens"):
        c_final, measured = final_eval(run_dir, key)
        for warmup in (0.0, 0.1, 0.2):
            fit = forecast_run(run_dir, compute=key, warmup_frac=warmup, max_step=half, target_compute=c_final)
            row["forecasts"].append({"compute": key, "warmup_frac": warmup, "method": "profile", "A": fit["A"], "B": fit["B"],
                                     "C_mid": fit["C_mid"], "n_points": len(fit["points"]), "target_compute": c_final,
                                     "predicted": fit["predicted_at_target"], "measured": measured,
                                     "error": fit["predicted_at_target"] - measured, "band_95": fit["target_band"],
                                     "warnings": [w["rule"] for w in fit["warnings"] if w["kind"] == "warning"]})
    return row


def default_forecast(run: dict) -> dict:
    """The forecast `scalerl predict` makes by default: compute = steps, warm-up 0.1."""
    return next(f for f in run["forecasts"] if (f["compute"], f["warmup_frac"]) == ("steps", 0.1))


def markdown(report: dict) -> str:
    lines = [f"# Forecasts against outcomes, {report['date']}", "", f"`{report['command']}`", "",
             "## Total wall time: estimate made at 10 % of the run vs measured", "",
             "| run | estimate at 10 % (s) | actual (s) | error |", "|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['run']} | {r['time_estimate_at_10pct_s']:.1f} | {r['time_actual_s']:.1f} | {100 * r['time_rel_error']:+.1f} % |")
    lines += ["", f"## Final pass rate predicted from the first half (steps ≤ {report['args']['steps'] // 2})", "",
              "| run | compute | warm-up excluded | fit | A | B | C_mid | points | predicted at end | measured | error | 95 % band |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        for f in r["forecasts"]:
            band = f"{f['band_95'][0]:.3f}–{f['band_95'][1]:.3f}" if "band_95" in f else ""
            lines.append(f"| {r['run']} | {f['compute']} | {f['warmup_frac']:.1f} | {f['method']} | {f['A']:.3f} | {f['B']:.2f} | "
                         f"{f['C_mid']:.4g} | {f['n_points']} | {f['predicted']:.3f} | {f['measured']:.3f} | {f['error']:+.3f} | {band} |")
    lines += ["", "## The last 5 evaluations of each run (the measured value above is the last)", "",
              "The default forecast (steps, warm-up 0.1) against the last evaluation and against the",
              "level the run ended at, the mean of its last 5 evaluations:", "",
              "| run | last 5 pass rates | spread (max − min) | mean | predicted | error vs last | error vs mean of last 5 |",
              "|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        last, f = r["last_5_evals"], default_forecast(r)
        lines.append(f"| {r['run']} | {' '.join(f'{v:.3f}' for v in last)} | {max(last) - min(last):.3f} | {statistics.fmean(last):.3f} | "
                     f"{f['predicted']:.3f} | {f['error']:+.3f} | {f['predicted'] - statistics.fmean(last):+.3f} |")
    lines += ["", "## Summary", ""] + [f"- {k}: {v}" for k, v in report["summary"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--runs-dir", type=Path, default=Path("/tmp/scalerl_forecast_runs"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--num-eval", type=int, default=200, help="held-out arithmetic prompts per evaluation")
    ap.add_argument("--eval-temperature", type=float, default=0.0, help="0: greedy pass rate; > 0: mean@--eval-samples")
    ap.add_argument("--eval-samples", type=int, default=1, help="completions per held-out prompt (the paper fits mean@16)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1, help="runs trained side by side")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more config overrides for every run, e.g. preset=scalerl")
    ap.add_argument("--tag", default="", help="appended to the results' file name")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    if not args.skip_train:
        pending = list(args.seeds)
        while pending:
            batch, pending = pending[: args.jobs], pending[args.jobs:]
            start = time.perf_counter()
            for seed, proc in [(seed, train(args, seed)) for seed in batch]:
                if proc.wait():
                    sys.exit(proc.stderr.read())
                print(f"seed {seed}: trained ({time.perf_counter() - start:.1f} s since its batch started)", file=sys.stderr, flush=True)
    rows = [analyse(args.runs_dir / f"seed{seed}", half=args.steps // 2) for seed in args.seeds]
    default = [default_forecast(r) for r in rows]
    summary = {
        "time: max |error| of the estimate at 10 %": f"{100 * max(abs(r['time_rel_error']) for r in rows):.1f} %",
        "reward (steps, warm-up 0.1, profile band): max |error| vs the last evaluation": f"{max(abs(f['error']) for f in default):.3f}",
        "reward: the same vs the mean of the last 5 evaluations":
            f"{max(abs(f['predicted'] - statistics.fmean(r['last_5_evals'])) for f, r in zip(default, rows)):.3f}",
        "health rule pass_rate_drop (defaults) replayed on the evaluations: alarms": {r["run"]: r["pass_rate_drop_alarms"] for r in rows},
        "reward: median |error| by setting": {
            f"{c}/{w}/{m}": round(statistics.median(abs(f["error"]) for r in rows for f in r["forecasts"]
                                                    if (f["compute"], f["warmup_frac"], f["method"]) == (c, w, m)), 3)
            for c, w, m in sorted({(f["compute"], f["warmup_frac"], f["method"]) for r in rows for f in r["forecasts"]})},
    }
    report = {"date": datetime.date.today().isoformat(),
              "command": "scalerl train " + " ".join(train_args(args, 0)).replace("train.seed=0", "train.seed=S"),
              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "runs": rows, "summary": summary}
    print(json.dumps(summary, indent=1))
    if args.save:
        metric = f"_mean{args.eval_samples}" if args.eval_temperature > 0 else ""  # greedy runs keep the plain name
        out = ROOT / "bench" / "results" / f"forecast_{args.steps}steps{metric}{args.tag and '_' + args.tag}_{report['date']}"
        out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        out.with_suffix(".md").write_text(markdown(report))
        print(f"wrote {out}.json and .md", file=sys.stderr)


if __name__ == "__main__":
    main()
