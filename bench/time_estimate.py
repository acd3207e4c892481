"""The live time estimate made at 10 % of a run, against the run's measured total, on jobs whose completions
stay put and on jobs whose completions grow.

Jobs (each the real CLI, `scalerl train`, one after another, `--threads` torch threads):

    steady     the embedded default (arithmetic, completions of a few tokens all run long)
    grows      the default plus a reward for longer answers (bench/length_reward.py:longer, weight 1, the
               environment's at 0.2), rollout.max_new_tokens 48, lr 3e-4: completions grew from ~3.5 tokens
               to the 48-token cap between steps 17 and 33 of 400 (seed 0, the one run tried) and stayed there
    late_jump  the same reward at lr 1e-4: completions stayed short to step 41 of 300 (seed 0)
               and reached the cap by step 61,
               which no estimate made at 10 % can see coming; the row shows the cap-priced upper bound and
               the step from which the live estimate stays within ±5 %

Per run: the estimate at 10 % (`time_estimate_at_10pct_s` of summary.json, from the per-token model of
scalerl/predict/time_estimate.py), its upper bound, the actual total, and the same run replayed through
the estimator with every step's positions set to the run's first measured step (so its cost is the mean
step time: the per-step model this one replaced), and the speed drift: step seconds per position after the
first 10 % over before it, how much the machine itself slowed down (> 1) or sped up under the same work,
an error no forecast from the run's own measurements can avoid. `--save` writes
bench/results/time_estimate_<date>.{json,md,png}.

    python bench/time_estimate.py --seeds 0 1 2 --save
    python bench/time_estimate.py --runs-dir /tmp/te --skip-train --save    # analyse existing runs
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LENGTH_REWARD = ("reward_components:\n  - {name: env, weight: 0.2}\n"
                 "  - {name: length, function: length_reward:longer, weight: 1.0}\n")
JOBS = {
    "steady": {"steps": 300, "sets": []},
    "grows": {"steps": 400, "sets": ["rollout.max_new_tokens=48", "optim.lr=3e-4"], "config": LENGTH_REWARD},
    "late_jump": {"steps": 300, "sets": ["rollout.max_new_tokens=48", "optim.lr=1e-4"], "config": LENGTH_REWARD},
}


def train(job: str, seed: int, runs_dir: Path, threads: int) -> Path:
    spec, name = JOBS[job], f"{job}_seed{seed}"
    cmd = [sys.executable, "-m", "scalerl.cli.main", "train", "--name", name, "--set", f"train.seed={seed}",
           "--set", f"train.steps={spec['steps']}", "--set", f"train.threads={threads}", "--set", f"log.run_dir={runs_dir}",
           "--set", "log.console=none", "--set", "log.tensorboard=false"]
    if "config" in spec:
        path = runs_dir / f"{job}.yaml"
        path.write_text(spec["config"])
        cmd += ["--config", str(path)]
    for s in spec["sets"]:
        cmd += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench"), "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{name}: {proc.stderr[-2000:]}")
    return runs_dir / name


def per_step_replay(run_dir: Path) -> float | None:
    """The estimate at 10 % of the per-step model this one replaced: the run's logged metrics through a fresh
    TimeEstimator with every step's positions set to the first step's (so a step costs the mean step time)."""
    from scalerl.jsonl import read_metrics
    from scalerl.predict.time_estimate import TimeEstimator

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    rows = read_metrics(run_dir)
    ck = config["checkpoint"]
    est = TimeEstimator(config["train"]["steps"], 0, config["eval"]["every"], ck["every"], ck["save_final"],
                        max_new_tokens=config["rollout"]["max_new_tokens"])
    first = {k: rows[0][k] for k in ("sampled_positions", "trained_positions")}
    for r in rows:
        est.update(r["step"], {**r, **first}, elapsed_s=r["time/elapsed_s"])
    return est.estimate_at_fraction


def seconds_per_position(rows: list[dict]) -> float:
    """Step seconds per position sampled and trained: how fast the machine did the same kind of work."""
    return sum(r["step_time_s"] for r in rows) / sum(r["sampled_positions"] + r["trained_positions"] for r in rows)


def analyse(job: str, run_dir: Path) -> dict:
    from scalerl.jsonl import read_metrics

    summary = json.loads((run_dir / "summary.json").read_text())
    actual = summary["time_actual_s"]
    rows = read_metrics(run_dir)
    live = [(r["step"], r["time/estimated_total_s"]) for r in rows if "time/estimated_total_s" in r]
    per_step = per_step_replay(run_dir)
    within = next((s for i, (s, _) in enumerate(live) if all(abs(e - actual) / actual <= 0.05 for _, e in live[i:])), None)
    n = len(rows)
    at = max(n // 10, 1)
    return {"job": job, "run": run_dir.name, "steps": n, "actual_s": actual,
            "estimate_at_10pct_s": summary["time_estimate_at_10pct_s"], "upper_at_10pct_s": summary["time_upper_at_10pct_s"],
            "rel_error": summary["time_estimate_rel_error"], "per_step_model_rel_error": (per_step - actual) / actual,
            "within_5pct_from_step": within,
            "tokens_first_10pct": statistics.mean(r["tokens"] / r["completions"] for r in rows[:at]),
            "tokens_last_10pct": statistics.mean(r["tokens"] / r["completions"] for r in rows[-at:]),
            "speed_drift": seconds_per_position(rows[at:]) / seconds_per_position(rows[2:at]),
            "live": live}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = list(dict.fromkeys(r["job"] for r in results))
    fig, axes = plt.subplots(1, len(jobs), figsize=(4.4 * len(jobs), 3.6), squeeze=False)
    for ax, job in zip(axes[0], jobs):
        for r in (r for r in results if r["job"] == job):
            steps, est = zip(*r["live"])
            ax.plot(steps, [e / r["actual_s"] for e in est], lw=1, label=r["run"])
            ax.axvline(r["steps"] / 10, color="grey", lw=0.6, ls=":")
        ax.axhspan(0.95, 1.05, color="green", alpha=0.12)
        ax.set(title=job, xlabel="step", ylabel="live estimate / actual total", ylim=(0, 2))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def table(results: list[dict], date: str, threads: int) -> str:
    lines = [f"# Time estimate at 10 % against the measured total ({date})", "",
             "`python bench/time_estimate.py --seeds 0 1 2 --save`: the real CLI, one run at a time, "
             f"{threads} torch threads. Per-step model: the same run replayed with every step's positions set to "
             "its first step's (the mean step time), the model this one replaced. Speed drift: step seconds per "
             "position (sampled + trained) after the first 10 % over before it (steps 3 on): above 1, the same work "
             "took longer later (the machine, not the work, changed), which no estimate made at 10 % can know.", "",
             "| run | tokens/completion, first → last 10 % | actual s | estimate at 10 % | error | upper bound | "
             "per-step model error | speed drift | live estimate within ±5 % from step |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['run']} | {r['tokens_first_10pct']:.1f} → {r['tokens_last_10pct']:.1f} | {r['actual_s']:.1f} | "
                     f"{r['estimate_at_10pct_s']:.1f} | {100 * r['rel_error']:+.1f} % | {r['upper_at_10pct_s']:.1f} | "
                     f"{100 * r['per_step_model_rel_error']:+.1f} % | {r['speed_drift']:.2f} | {r['within_5pct_from_step']} of {r['steps']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    ap.add_argument("--late-seeds", type=int, nargs="+", default=[0], help="seeds of the late_jump job")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs-dir", type=Path, default=Path("/tmp/scalerl_time_estimate"))
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for job in args.jobs:
        for seed in args.late_seeds if job == "late_jump" else args.seeds:
            run_dir = args.runs_dir / f"{job}_seed{seed}"
            if not args.skip_train:
                train(job, seed, args.runs_dir, args.threads)
            results.append(analyse(job, run_dir))
            print(json.dumps({k: v for k, v in results[-1].items() if k != "live"}), flush=True)
    date = datetime.date.today().isoformat()
    md = table(results, date, args.threads)
    print(md)
    if args.save:
        out = ROOT / "bench" / "results" / f"time_estimate_{date}"
        out.with_suffix(".json").write_text(json.dumps({"date": date, "runs": results}, indent=1) + "\n")
        out.with_suffix(".md").write_text(md)
        plot(results, out.with_suffix(".png"))
        print(f"wrote {out}.{{json,md,png}}", file=sys.stderr)


if __name__ == "__main__":
    main()
