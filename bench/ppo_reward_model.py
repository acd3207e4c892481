"""PPO against a trained reward model: does the reward-model score rise while KL stays in its band?

1. `scalerl train-rm` trains the built-in model as a Bradley–Terry reward model on the shipped
   synthetic preference pairs (correct sums preferred over wrong ones).
2. `scalerl train` runs PPO (separate critic, KL in the reward) on the arithmetic prompts, rewarded
   by that model's score instead of the environment's check, for each seed. β is adaptive on the
   per-completion k1 KL (`kl.level: sequence`, target 1.5, from β = 0.05) and the `max_kl` guard
   damps any step whose per-completion KL is above 2.5.
Reports, per seed: the reward-model score over the first and last 10 steps, the environment's own
pass rate on the same samples (`task_reward_mean`), the held-out greedy pass rate before/after,
and the per-completion KL to the reference (`kl_seq`) against the band [--kl-low, --kl-high], per
step and as a moving mean over --window steps (one batch's KL is a noisy estimate). KL starts at 0
(the policy is the reference), so the band is judged from the first step that reaches it.

    python bench/ppo_reward_model.py --seeds 0 1 2 --jobs 2 --save
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def moving_mean(values: list[float], window: int) -> list[float]:
    """m_t = mean(v_{t−window+1..t}) (fewer values at the start)."""
    return [statistics.mean(values[max(0, i - window + 1): i + 1]) for i in range(len(values))]


def band_stats(kl: list[float], low: float, high: float, prefix: str) -> dict:
    """KL starts at 0 (the policy is the reference), so the band is judged from the first step
    whose KL reaches `low`; before that only the top matters."""
    entry = next((i for i, k in enumerate(kl) if k >= low), len(kl))
    after = kl[entry:]
    return {
        f"{prefix}_entry_step": entry + 1,
        f"{prefix}_in_band_frac_after_entry": sum(low <= k <= high for k in after) / len(after) if after else 0.0,
        f"{prefix}_min_after_entry": min(after) if after else None,
        f"{prefix}_max": max(kl),
        f"{prefix}_above_band_steps": sum(k > high for k in kl),
    }


def run_seed(args: argparse.Namespace, rm_dir: Path, runs_dir: Path, seed: int) -> dict:
    """One PPO run against the reward model; the row of figures for that seed."""
    from scalerl.config import load_config
    from scalerl.jsonl import read_metrics
    from scalerl.trainer.loop import train

    summary = train(load_config(overrides={
        "algorithm.name": "ppo", "algorithm.kl.in_reward": True, "algorithm.kl.beta": args.beta, "algorithm.kl.estimator": args.estimator,
        "algorithm.kl.schedule": "adaptive", "algorithm.kl.level": "sequence", "algorithm.kl.target_kl": args.target_kl,
        "algorithm.kl.max_kl": args.max_kl, "algorithm.kl.horizon": args.horizon,
        "reward.model": str(rm_dir), "rollout.prompts_per_step": args.prompts, "train.steps": args.steps, "train.seed": seed,
        "train.threads": args.threads, "eval.every": 0, "log.run_dir": str(runs_dir), "log.name": f"ppo-rm-s{seed}",
        "log.console": "none", "checkpoint.save_final": False,
    }))
    metrics = read_metrics(Path(summary["run_dir"]))
    kl_seq = [m["kl_seq"] for m in metrics]
    return {
        "seed": seed,
        "rm_score_first10": statistics.mean(m["reward_mean"] for m in metrics[:10]),
        "rm_score_last10": statistics.mean(m["reward_mean"] for m in metrics[-10:]),
        "task_reward_first10": statistics.mean(m["task_reward_mean"] for m in metrics[:10]),
        "task_reward_last10": statistics.mean(m["task_reward_mean"] for m in metrics[-10:]),
        "pass_rate_before": summary["pass_rate_before"], "pass_rate_after": summary["pass_rate_after"],
        "kl_seq_median": statistics.median(kl_seq),
        **band_stats(kl_seq, args.kl_low, args.kl_high, "kl_seq"),
        **band_stats(moving_mean(kl_seq, args.window), args.kl_low, args.kl_high, f"kl_seq_ma{args.window}"),
        "beta_last": metrics[-1]["beta"], "wall_time_s": round(summary["wall_time_s"], 1),
        "kl_seq": kl_seq, "rm_score": [m["reward_mean"] for m in metrics],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--kl-low", type=float, default=0.5)
    ap.add_argument("--kl-high", type=float, default=3.0)
    ap.add_argument("--target-kl", type=float, default=1.5, help="adaptive controller's per-completion KL target")
    ap.add_argument("--max-kl", type=float, default=2.5, help="guard: per-completion KL above this damps the step")
    ap.add_argument("--beta", type=float, default=0.05, help="initial β of the adaptive controller")
    ap.add_argument("--estimator", default="k1", help="KL estimator in the reward (k1: log π − log π_ref, as Ziegler et al. and TRL's PPO)")
    ap.add_argument("--horizon", type=int, default=2000)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step (8 completions each)")
    ap.add_argument("--window", type=int, default=5, help="steps of the moving mean the band is also judged on")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1, help="seeds run side by side in this many processes")
    ap.add_argument("--runs-dir", type=Path, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--rm", type=Path, help="use this trained reward model instead of training one")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        rm_dir = args.rm or Path(tmp) / "rm"
        if args.rm is None:
            proc = subprocess.run([sys.executable, "-m", "scalerl.cli.main", "train-rm", "--out", str(rm_dir)],
                                  cwd=ROOT, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(proc.stderr)
        rm_summary = json.loads((rm_dir / "summary.json").read_text())
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            rows = list(pool.map(partial(run_seed, args, rm_dir, args.runs_dir or Path(tmp)), args.seeds))
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if not isinstance(v, list)}))
    verdict = {
        "reward_model_accuracy": rm_summary.get("eval_accuracy_after"),
        "rm_score_rose_in_every_seed": all(r["rm_score_last10"] > r["rm_score_first10"] for r in rows),
        "kl_seq_max_over_runs": max(r["kl_seq_max"] for r in rows),
        "kl_seq_in_band_after_entry_every_step": all(r["kl_seq_in_band_frac_after_entry"] == 1.0 for r in rows),
        f"kl_seq_ma{args.window}_in_band_after_entry_every_step": all(
            r[f"kl_seq_ma{args.window}_in_band_frac_after_entry"] == 1.0 for r in rows),
    }
    print(json.dumps(verdict))
    if args.save:
        date = datetime.date.today().isoformat()
        report = {"date": date, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                  "reward_model": rm_summary, "verdict": verdict, "runs": rows}
        path = ROOT / "bench" / "results" / f"ppo_reward_model_{date}.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
