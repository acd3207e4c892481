"""The reasoning-gym demonstration, measured: SFT warm start, then RL, on one reasoning-gym task, over several seeds.

For each seed S it runs the tutorial's commands (docs/tutorials/reasoning-gym.md) as real CLI processes:

    python examples/reasoning_gym_data.py --config CONFIG --out DIR/sft.jsonl
    scalerl sft   --config CONFIG --set sft.data=DIR/sft.jsonl --set train.seed=S --name sftS
    scalerl train --config CONFIG --set model.path=DIR/sftS/model --set train.seed=S --name rlS

and reports the held-out greedy pass rate (the environment's held-out tasks: seeds never trained on, questions
the training pool lacks, each judged by reasoning-gym's own score_answer) of the SFT model (the RL run's
step-0 evaluation) and after RL, the gain in points, the SFT updates taken (sft.stop_at_loss may end it early), and each phase's wall time. `--save` writes
bench/results/reasoning_gym_demo_<date>.json and .md.

    python bench/reasoning_gym_demo.py --seeds 0 1 2 --threads 1 --jobs 2 --save
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "reasoning_gym.yaml"


def run(args: list[str], threads: int) -> float:
    """Run a command of this checkout; returns its wall time in seconds."""
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def one_seed(seed: int, config: Path, tmp: Path, threads: int, extra: list[str]) -> dict:
    common = ["--config", str(config), "--set", f"train.seed={seed}", "--set", f"train.threads={threads}",
              "--set", f"log.run_dir={tmp}", "--set", "log.console=none", *extra]
    data = tmp / "sft.jsonl"
    sft_s = run(["-m", "scalerl.cli.main", "sft", *common, "--set", f"sft.data={data}", "--name", f"sft{seed}"], threads)
    sft = json.loads((tmp / f"sft{seed}" / "summary.json").read_text())
    rl_s = run(["-m", "scalerl.cli.main", "train", *common, "--set", f"model.path={sft['model']}", "--name", f"rl{seed}"], threads)
    rl = json.loads((tmp / f"rl{seed}" / "summary.json").read_text())
    before, after = rl["pass_rate_before"], rl["pass_rate_after"]
    return {"seed": seed, "sft_updates": sft["steps"], "sft_final_loss": round(sft["final_loss"], 4), "pass_rate_after_sft": before, "pass_rate_after_rl": after,
            "gain_points": round(100 * (after - before), 1), "sft_seconds": round(sft_s, 1), "rl_seconds": round(rl_s, 1)}


def markdown(report: dict) -> str:
    lines = [f"# reasoning-gym demonstration ({report['date']})", "", report["note"], "",
             f"Command: `{report['command']}`", "", f"Task: {report['task']}", "",
             "| seed | SFT updates | SFT final loss | pass rate after SFT | after RL | gain (points) | SFT s | RL s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append(f"| {r['seed']} | {r['sft_updates']} | {r['sft_final_loss']} | {r['pass_rate_after_sft']:.3f} | {r['pass_rate_after_rl']:.3f} | "
                     f"{r['gain_points']:+.1f} | {r['sft_seconds']} | {r['rl_seconds']} |")
    lines += ["", f"Median gain {report['median_gain_points']:+.1f} points, smallest {report['min_gain_points']:+.1f} "
              f"(target: >= 20 points on each of 3 seeds).", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each process (train.threads, OMP_NUM_THREADS)")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run at once (each its own processes)")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="a further --set for both commands (repeatable)")
    ap.add_argument("--note", default="", help="what the results file should say about the machine (contention)")
    ap.add_argument("--tag", default="", help="appended to the results file's name (a second configuration on the same day)")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    extra = [a for value in args.extra for a in ("--set", value)]
    with tempfile.TemporaryDirectory() as tmp:
        run(["examples/reasoning_gym_data.py", "--config", str(args.config), "--out", str(Path(tmp) / "sft.jsonl")], args.threads)
        with ThreadPoolExecutor(args.jobs) as pool:  # each seed's two processes run one after the other
            rows = list(pool.map(lambda seed: one_seed(seed, args.config, Path(tmp), args.threads, extra), args.seeds))
    for row in rows:
        print(json.dumps(row), flush=True)
    command = " ".join(["python bench/reasoning_gym_demo.py", "--seeds", *map(str, args.seeds), "--threads", str(args.threads), "--jobs", str(args.jobs),
                        *(f"--set {v}" for v in args.extra), *(["--config", str(args.config.relative_to(ROOT))] if args.config != CONFIG else []),
                        *([f"--tag {args.tag}"] if args.tag else []), "--save"])
    import yaml

    task = yaml.safe_load(args.config.read_text())["env"]["args"]
    report = {"date": datetime.date.today().isoformat(), "command": command, "note": args.note, "task": json.dumps(task),
              "runs": rows, "median_gain_points": statistics.median(r["gain_points"] for r in rows),
              "min_gain_points": min(r["gain_points"] for r in rows)}
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}))
    if args.save:
        stem = ROOT / "bench" / "results" / f"reasoning_gym_demo{args.tag}_{report['date']}"
        stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        stem.with_suffix(".md").write_text(markdown(report))
        print(f"wrote {stem}.json and .md", file=sys.stderr)


if __name__ == "__main__":
    main()
