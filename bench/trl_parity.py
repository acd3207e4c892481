"""ScaleRL vs TRL's GRPOTrainer on the same work, alternating, several runs each.

The work is the CPU reference benchmark in `shared/bench/` (its README has every parameter). This
script builds the base model there if needed, then runs `trl_grpo.py` (in its own virtual
environment) and `bench/scalerl_grpo.py` alternately, `--runs` times each with sampling seeds
0, 1, ..., and prints every JSON line, the medians and the ScaleRL/TRL ratios; `--save` writes them
to bench/results/trl_parity_<date>.json.

    bash bench/setup_trl.sh                  # once: .bench/trl-venv with TRL's exact versions
    python bench/trl_parity.py --runs 5 --save
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

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["seconds_total", "seconds_per_step", "completions_per_second", "generated_tokens_per_second",
        "peak_rss_mb", "pass_rate_before", "pass_rate_after", "train_reward_first_step", "train_reward_last_step"]


def last_json(cmd: list[str], cwd: Path, env: dict[str, str]) -> dict:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--reference", type=Path, default=ROOT.parent / "shared" / "bench")
    ap.add_argument("--out", type=Path, default=ROOT / ".bench" / "out")
    ap.add_argument("--trl-python", type=Path, default=ROOT / ".bench" / "trl-venv" / "bin" / "python")
    ap.add_argument("--save", action="store_true", help="write bench/results/trl_parity_<date>.json")
    args = ap.parse_args()
    if not args.trl_python.exists():
        sys.exit(f"{args.trl_python} not found: run `bash bench/setup_trl.sh` first")
    out = args.out.resolve()
    env = {**os.environ, "SCALERL_BENCH_OUT": str(out)}
    if not (out / "base" / "model.safetensors").exists():
        print("building the reference base model (about a minute)...", file=sys.stderr)
        subprocess.run([str(args.trl_python), "tiny_task.py"], cwd=args.reference, env=env, check=True)

    results: dict[str, list[dict]] = {"trl": [], "scalerl": []}
    for seed in range(args.runs):  # alternate so that both see the same load on a shared machine
        trl = last_json([str(args.trl_python), "trl_grpo.py", "--seed", str(seed)], args.reference, env)
        ours = last_json([sys.executable, str(ROOT / "bench" / "scalerl_grpo.py"), "--out", str(out), "--seed", str(seed)], ROOT, env)
        for name, row in (("trl", trl), ("scalerl", ours)):
            results[name].append(row)
            print(json.dumps({"seed": seed, **{k: row[k] for k in ["framework", *KEYS]}}), flush=True)

    medians = {name: {k: statistics.median(r[k] for r in rows) for k in KEYS} for name, rows in results.items()}
    ratios = {k: round(medians["scalerl"][k] / medians["trl"][k], 3) for k in KEYS if medians["trl"][k]}
    pass_after = {name: sorted(r["pass_rate_after"] for r in rows) for name, rows in results.items()}
    report = {"date": datetime.date.today().isoformat(), "runs_each": args.runs, "medians": medians,
              "ratio_scalerl_over_trl": ratios, "pass_rate_after_by_seed": pass_after, "runs": results}
    print(json.dumps({"medians": medians, "ratio_scalerl_over_trl": ratios, "pass_rate_after_sorted": pass_after}, indent=1))
    if args.save:
        path = ROOT / "bench" / "results" / f"trl_parity_{report['date']}.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
