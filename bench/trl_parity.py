"""ScaleRL vs TRL's GRPOTrainer on the same work, alternating, several runs each.

The work is the CPU reference benchmark in `shared/bench/` (its README has every parameter). This
script builds the base model there if needed, then runs `trl_grpo.py` (in its own virtual
environment) and `bench/scalerl_grpo.py` alternately, `--runs` times each with sampling seeds
0, 1, ..., and prints every JSON line, the medians and the ScaleRL/TRL ratios; `--save` writes them
to bench/results/trl_parity_<date>.json.

    bash bench/setup_trl.sh                  # once: .bench/trl-venv with TRL's exact versions
    bash bench/setup_scalerl.sh              # once: .bench/scalerl-venv, ScaleRL as `pip install -e .` installs it
    python bench/trl_parity.py --runs 5 --save

Both libraries run in environments of their own core dependencies (TRL's pinned freeze; ScaleRL
without the test extras), so that peak RSS compares libraries, not what else is installed.

Time to TRL's final pass rate (`--curve-every K`, default 5): per seed, TRL runs again with
`--steps K, 2K, ...` (its runs are deterministic per seed, so the first k steps of a 30-step run are
a k-step run) and ScaleRL once with `eval.every=K` (evaluation time left out). The pass rate at
each k, averaged over the seeds, gives each library's curve against its median training seconds to
step k; the time to the target (TRL's mean final pass rate) is where the curve first reaches it,
linearly interpolated between evaluations.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 30
KEYS = ["seconds_total", "seconds_per_step", "completions_per_second", "generated_tokens_per_second",
        "peak_rss_mb", "pass_rate_before", "pass_rate_after", "train_reward_first_step", "train_reward_last_step"]


def last_json(cmd: list[str], cwd: Path, env: dict[str, str]) -> dict:
    proc = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reference", type=Path, default=ROOT.parent / "shared" / "bench")
    ap.add_argument("--out", type=Path, default=ROOT / ".bench" / "out")
    ap.add_argument("--trl-python", type=Path, default=ROOT / ".bench" / "trl-venv" / "bin" / "python")
    ap.add_argument("--scalerl-python", type=Path, default=ROOT / ".bench" / "scalerl-venv" / "bin" / "python")
    ap.add_argument("--curve-every", type=int, default=5, help="evaluate every K steps for the time to TRL's final pass rate; 0: skip")
    ap.add_argument("--tag", default="", help="appended to the results file's name (a second run on one date)")
    ap.add_argument("--save", action="store_true", help="write bench/results/trl_parity_<date>.json")
    args = ap.parse_args()
    for python, setup in ((args.trl_python, "setup_trl.sh"), (args.scalerl_python, "setup_scalerl.sh")):
        if not python.exists():
            sys.exit(f"{python} not found: run `bash bench/{setup}` first")
    out = args.out.resolve()
    env = {**os.environ, "SCALERL_BENCH_OUT": str(out)}
    if not (out / "base" / "model.safetensors").exists():
        print("building the reference base model (about a minute)...", file=sys.stderr)
        subprocess.run([str(args.trl_python), "tiny_task.py"], cwd=args.reference, env=env, check=True)

    results: dict[str, list[dict]] = {"trl": [], "scalerl": []}
    for seed in range(args.runs):  # alternate so that both see the same load on a shared machine
        trl = last_json([str(args.trl_python), "trl_grpo.py", "--seed", str(seed)], args.reference, env)
        ours = last_json([str(args.scalerl_python), str(ROOT / "bench" / "scalerl_grpo.py"), "--out", str(out), "--seed", str(seed)], ROOT, env)
        for name, row in (("trl", trl), ("scalerl", ours)):
            results[name].append(row)
            print(json.dumps({"seed": seed, **{k: row[k] for k in ["framework", *KEYS]}}), flush=True)

    curves = pass_rate_curves(args, out, env, results) if args.curve_every else None
    medians = {name: {k: statistics.median(r[k] for r in rows) for k in KEYS} for name, rows in results.items()}
    ratios = {k: round(medians["scalerl"][k] / medians["trl"][k], 3) for k in KEYS if medians["trl"][k]}
    pass_after = {name: sorted(r["pass_rate_after"] for r in rows) for name, rows in results.items()}
    report = {"date": datetime.date.today().isoformat(), "runs_each": args.runs, "medians": medians,
              "ratio_scalerl_over_trl": ratios, "pass_rate_after_by_seed": pass_after, "time_to_trl_final": curves, "runs": results}
    print(json.dumps({"medians": medians, "ratio_scalerl_over_trl": ratios, "pass_rate_after_sorted": pass_after,
                      "time_to_trl_final": curves and {k: v for k, v in curves.items() if k != "points"}}, indent=1))
    if args.save:
        path = ROOT / "bench" / "results" / f"trl_parity_{report['date']}{args.tag}.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)


def pass_rate_curves(args, out: Path, env: dict[str, str], results: dict[str, list[dict]]) -> dict:
    """Each library's mean held-out pass rate over the seeds at steps K, 2K, ..., 30 against its median
    training seconds to that step, and the seconds until the curve reaches TRL's mean final pass rate."""
    k_steps = list(range(args.curve_every, STEPS, args.curve_every))
    points: dict[str, dict[int, list[tuple[float, float]]]] = {"trl": {}, "scalerl": {}}
    for seed in range(args.runs):  # alternate, as above
        for k in k_steps:
            row = last_json([str(args.trl_python), "trl_grpo.py", "--seed", str(seed), "--steps", str(k)], args.reference, env)
            points["trl"].setdefault(k, []).append((row["seconds_total"], row["pass_rate_after"]))
        row = last_json([str(args.scalerl_python), str(ROOT / "bench" / "scalerl_grpo.py"), "--out", str(out), "--seed", str(seed),
                         "--set", f"eval.every={args.curve_every}"], ROOT, env)
        for step, seconds, rate in row["pass_rate_curve"]:
            if step < STEPS:
                points["scalerl"].setdefault(step, []).append((seconds, rate))
    for name, rows in results.items():  # step 0 and step 30: the main runs
        points[name][0] = [(0.0, r["pass_rate_before"]) for r in rows]
        points[name][STEPS] = [(r["seconds_total"], r["pass_rate_after"]) for r in rows]
    curves = {name: [(k, statistics.median(s for s, _ in v), statistics.mean(p for _, p in v)) for k, v in sorted(by_k.items())]
              for name, by_k in points.items()}
    target = curves["trl"][-1][2]
    reach = {name: seconds_to(curve, target) for name, curve in curves.items()}
    speedup = reach["trl"] / reach["scalerl"] if reach["scalerl"] else None
    return {"target_pass_rate": round(target, 4), "seconds": reach, "speedup": speedup and round(speedup, 3),
            "points": {name: [[k, round(s, 3), round(p, 4)] for k, s, p in curve] for name, curve in curves.items()}}


def seconds_to(curve: list[tuple[int, float, float]], target: float) -> float | None:
    """Seconds at which (step, seconds, pass rate) points, the first at step 0, first reach `target`,
    linearly interpolated between the two evaluations around it; None if they never do."""
    if curve[0][2] >= target:
        return 0.0
    for (_, s0, p0), (_, s1, p1) in itertools.pairwise(curve):
        if p1 >= target:
            return round(s0 + (s1 - s0) * (target - p0) / (p1 - p0), 3)
    return None


if __name__ == "__main__":
    main()
