"""PPO against a trained reward model: does the reward-model score rise while KL stays in its band?

1. `scalerl train-rm` trains the built-in model as a Bradley–Terry reward model on the shipped
   synthetic preference pairs (correct sums preferred over wrong ones).
2. `scalerl train` runs PPO (separate critic, KL in the reward with an adaptive β) on the arithmetic
   prompts, rewarded by that model's score instead of the environment's check, for each seed.
Reports, per seed: the reward-model score over the first and last 10 steps, the environment's own
pass rate on the same samples (`task_reward_mean`), the held-out greedy pass rate before/after,
and the per-completion KL to the reference (`kl_seq`) against the band [--kl-low, --kl-high].

    python bench/ppo_reward_model.py --seeds 0 1 2 --threads 1 --save
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

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--kl-low", type=float, default=0.0)
    ap.add_argument("--kl-high", type=float, default=3.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()

    from scalerl.config import load_config
    from scalerl.monitor.metrics import read_metrics
    from scalerl.trainer.loop import train

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rm_dir = Path(tmp) / "rm"
        proc = subprocess.run([sys.executable, "-m", "scalerl.cli.main", "train-rm", "--out", str(rm_dir)],
                              cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(proc.stderr)
        rm_summary = json.loads((rm_dir / "summary.json").read_text())
        for seed in args.seeds:
            summary = train(load_config(overrides={
                "algorithm.name": "ppo", "algorithm.kl.in_reward": True, "algorithm.kl.beta": 0.05,
                "algorithm.kl.schedule": "adaptive", "algorithm.kl.target_kl": 0.05, "algorithm.kl.horizon": 2000,
                "reward.model": str(rm_dir), "rollout.prompts_per_step": 8, "train.steps": args.steps, "train.seed": seed,
                "train.threads": args.threads, "eval.every": 0, "log.run_dir": tmp, "log.name": f"ppo-rm-s{seed}", "log.console": "none",
                "checkpoint.save_final": False,
            }))
            metrics = read_metrics(Path(summary["run_dir"]))
            kl_seq = [m["kl_seq"] for m in metrics]
            row = {
                "seed": seed,
                "rm_score_first10": statistics.mean(m["reward_mean"] for m in metrics[:10]),
                "rm_score_last10": statistics.mean(m["reward_mean"] for m in metrics[-10:]),
                "task_reward_first10": statistics.mean(m["task_reward_mean"] for m in metrics[:10]),
                "task_reward_last10": statistics.mean(m["task_reward_mean"] for m in metrics[-10:]),
                "pass_rate_before": summary["pass_rate_before"], "pass_rate_after": summary["pass_rate_after"],
                "kl_seq_median": statistics.median(kl_seq), "kl_seq_max": max(kl_seq),
                "kl_seq_in_band_frac": sum(args.kl_low <= k <= args.kl_high for k in kl_seq) / len(kl_seq),
                "beta_last": metrics[-1]["beta"], "wall_time_s": round(summary["wall_time_s"], 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    report = {"date": datetime.date.today().isoformat(), "args": vars(args), "reward_model": rm_summary, "runs": rows}
    print(json.dumps({"reward_model_accuracy": rm_summary.get("eval_accuracy_after"),
                      "rm_score_rose_in_every_seed": all(r["rm_score_last10"] > r["rm_score_first10"] for r in rows),
                      "kl_seq_max_over_runs": max(r["kl_seq_max"] for r in rows)}))
    if args.save:
        path = ROOT / "bench" / "results" / f"ppo_reward_model_{report['date']}.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
