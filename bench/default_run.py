"""The embedded default, measured: `scalerl train` with no arguments, over several seeds.

Runs the real CLI (`scalerl train --set train.seed=S`, nothing else changed but the run folder)
for each seed and reports the held-out greedy pass rate before and after, its gain in points,
the wall time of the whole process, and tokens/s. `--save` writes
bench/results/default_run_<date>.json.

    python bench/default_run.py --seeds 0 1 2 --save
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tag", default="", help="appended to the results file's name (a second run on one date)")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "scalerl.cli.main", "train", "--set", f"train.seed={seed}",
                                   "--set", f"log.run_dir={tmp}", "--name", f"seed{seed}", "--set", "log.console=none"],
                                  cwd=ROOT, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(proc.stderr)
            summary = json.loads((Path(tmp) / f"seed{seed}" / "summary.json").read_text())
            row = {"seed": seed, "pass_rate_before": summary["pass_rate_before"], "pass_rate_after": summary["pass_rate_after"],
                   "gain_points": round(100 * (summary["pass_rate_after"] - summary["pass_rate_before"]), 1),
                   "process_seconds": round(time.perf_counter() - start, 1), "train_seconds": round(summary["wall_time_s"], 1),
                   "tokens_per_s": round(summary["tokens_per_s"], 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    report = {"date": datetime.date.today().isoformat(), "command": "scalerl train --set train.seed=S", "runs": rows,
              "median_gain_points": statistics.median(r["gain_points"] for r in rows),
              "min_gain_points": min(r["gain_points"] for r in rows),
              "max_process_seconds": max(r["process_seconds"] for r in rows)}
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}))
    if args.save:
        path = ROOT / "bench" / "results" / f"default_run_{report['date']}{args.tag}.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
