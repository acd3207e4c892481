"""Held-out pass rate after the same steps in each precision mode: the default job, 3 seeds.

    python bench/precision_quality.py [--seeds 0 1 2] [--modes fp32 standard compressed] [--save]

Runs `scalerl train` (the embedded default job: GRPO on the built-in model and arithmetic task, 300
steps) with `--set precision.mode=M --set train.seed=S`, one at a time, and reads the greedy held-out
pass rate after training from each run's summary.json. Prints per-seed rates, each mode's mean and
its difference from fp32's on the same seeds; `--save` writes bench/results/precision_quality_<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def run(run_dir: str, mode: str, seed: int, threads: int) -> dict:
    name = f"{mode}_seed{seed}"
    subprocess.run([sys.executable, "-m", "scalerl.cli.main", "train", "--name", name, "--overwrite",
                    "--set", f"log.run_dir={run_dir}", "--set", "log.console=none", "--set", f"precision.mode={mode}",
                    "--set", f"train.seed={seed}", "--set", f"train.threads={threads}"],
                   check=True, stdout=subprocess.DEVNULL)
    return json.loads((Path(run_dir) / name / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--modes", nargs="+", default=["fp32", "standard", "compressed"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    rates: dict[str, dict[int, float]] = {m: {} for m in args.modes}
    times: dict[str, dict[int, float]] = {m: {} for m in args.modes}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for mode in args.modes:  # modes alternate within each seed
                summary = run(tmp, mode, seed, args.threads)
                rates[mode][seed], times[mode][seed] = summary["pass_rate_after"], summary["train_time_s"]
                print(f"seed {seed} {mode:10s} pass rate {rates[mode][seed]:.3f} (before {summary['pass_rate_before']:.3f}), "
                      f"train {times[mode][seed]:.1f} s", flush=True)
    ref = args.modes[0]
    lines = ["| mode | " + " | ".join(f"seed {s}" for s in args.seeds) + f" | mean | mean − {ref}, points | train s (median) |",
             "|---|" + "---|" * (len(args.seeds) + 3)]
    for mode in args.modes:
        mean = statistics.mean(rates[mode].values())
        diff = 100 * (mean - statistics.mean(rates[ref].values()))
        lines.append(f"| {mode} | " + " | ".join(f"{rates[mode][s]:.3f}" for s in args.seeds) +
                     f" | {mean:.3f} | {diff:+.1f} | {statistics.median(times[mode].values()):.1f} |")
    print("\n".join(lines))
    if args.save:
        date = datetime.date.today().isoformat()
        cmd = "python bench/precision_quality.py " + " ".join(sys.argv[1:])
        (RESULTS / f"precision_quality_{date}.json").write_text(json.dumps({"date": date, "command": cmd, "pass_rate_after": rates,
                                                                           "train_time_s": times}, indent=1))
        (RESULTS / f"precision_quality_{date}.md").write_text(
            f"# Held-out pass rate per precision mode, {date}\n\n`{cmd}` (the default job, 300 steps, greedy pass rate on "
            f"the held-out tasks; {args.threads} threads, alone on the machine)\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
