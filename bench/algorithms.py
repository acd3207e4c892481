"""Every objective on the built-in task, same rollout budget, several seeds: pass rate, time, curves.

Each configuration trains the built-in base model on the built-in arithmetic environment for the
same number of steps with the same batch (so the same number of sampled completions), evaluating
the held-out greedy pass rate every `--eval-every` steps. Prints one JSON line per run, then a
table of the final pass rate (mean and range over seeds) and wall time; `--save` writes
bench/results/algorithms_<date>.json, a Markdown table and a PNG of the mean curves.

    pip install -e '.[bench]'
    python bench/algorithms.py --seeds 0 1 2 --steps 150 --save
    python bench/algorithms.py --policy-losses --seeds 0 1 2 --steps 300 --save    # grpo vs each policy loss (issue 37)
    python bench/algorithms.py --policy-losses --set train.mini_batch_size=32 --tag _2updates --save   # 2 updates a step: off-policy

`--policy-losses` runs GRPO and each policy loss added in scalerl/algorithms/policy_losses.py
(sapo, vespo, luspo, gmpo, clip_cov, kl_cov, top-entropy) on the default job, and the table adds
each one's pass-rate gain and its difference from GRPO's gain (in points).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "grpo": {"algorithm.name": "grpo"},
    "cispo": {"algorithm.name": "cispo"},
    "rloo": {"algorithm.name": "rloo"},
    "reinforce_pp": {"algorithm.name": "reinforce_pp"},
    "ppo": {"algorithm.name": "ppo"},
    "preset:scalerl": {"preset": "scalerl"},
}
# GRPO with each newer policy loss, TRL's / verl's / the papers' recommended settings.
POLICY_LOSSES = {
    "grpo": {"algorithm.name": "grpo"},
    "sapo": {"algorithm.policy_loss": "sapo", "algorithm.loss_agg": "sequence"},
    "vespo": {"algorithm.policy_loss": "vespo"},
    "luspo": {"algorithm.loss_agg": "sequence_sum", "algorithm.importance_level": "sequence",
              "algorithm.clip_eps_low": 3e-4, "algorithm.clip_eps_high": 4e-4},
    "gmpo": {"algorithm.policy_loss": "gmpo", "algorithm.clip_eps_low": 0.4, "algorithm.clip_eps_high": 0.4,
             "algorithm.loss_agg": "sequence"},
    "clip_cov": {"algorithm.policy_loss": "clip_cov", "algorithm.cov_ratio": 2e-4},
    "kl_cov": {"algorithm.policy_loss": "kl_cov", "algorithm.cov_ratio": 2e-3},
    "top_entropy_0.2": {"algorithm.top_entropy_quantile": 0.2},
    "top_entropy_0.5": {"algorithm.top_entropy_quantile": 0.5},
    "cispo_sequence": {"algorithm.name": "cispo", "algorithm.importance_level": "sequence"},
}


def run(name: str, overrides: dict, seed: int, steps: int, eval_every: int, threads: int, tmp: Path, extra: dict | None = None) -> dict:
    from scalerl.config import load_config
    from scalerl.jsonl import read_metrics
    from scalerl.trainer.loop import train

    run_name = f"{name.replace(':', '-')}-s{seed}"
    config = load_config(overrides={
        **overrides, "train.seed": seed, "train.steps": steps, "train.threads": threads, "rollout.prompts_per_step": 8,
        "eval.every": eval_every, "log.run_dir": str(tmp), "log.name": run_name, "log.console": "none",
        "checkpoint.save_final": False, **(extra or {}),
    })
    summary = train(config)
    rows = read_metrics(Path(summary["run_dir"]))
    curve = [(0, summary["pass_rate_before"])] + [(r["step"], r["eval/pass_rate"]) for r in rows if "eval/pass_rate" in r]
    return {"config": name, "seed": seed, "steps": steps, "completions": steps * config.batch_size,
            "pass_rate_before": summary["pass_rate_before"], "pass_rate_after": summary["pass_rate_after"],
            "wall_time_s": round(summary["wall_time_s"], 1), "curve": curve}


def table(results: list[dict], configs: dict) -> str:
    """Final pass rate per configuration; with GRPO among them, each one's gain and its gap to GRPO's gain (points)."""
    gain = {name: statistics.mean(r["pass_rate_after"] - r["pass_rate_before"] for r in results if r["config"] == name)
            for name in configs if any(r["config"] == name for r in results)}
    lines = ["| objective | pass rate after (mean of seeds) | range | gain (points) | gain − GRPO's | wall time (median) |",
             "|---|---|---|---|---|---|"]
    for name in gain:
        rows = [r for r in results if r["config"] == name]
        after = [r["pass_rate_after"] for r in rows]
        vs = f"{100 * (gain[name] - gain['grpo']):+.1f}" if "grpo" in gain else "–"
        lines.append(f"| {name} | {statistics.mean(after):.3f} | {min(after):.3f}–{max(after):.3f} | {100 * gain[name]:+.1f} | {vs} | "
                     f"{statistics.median(r['wall_time_s'] for r in rows):.1f} s |")
    return "\n".join(lines)


def plot(results: list[dict], configs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in configs:
        curves = [r["curve"] for r in results if r["config"] == name]
        if not curves:
            continue
        steps = [s for s, _ in curves[0]]
        mean = [statistics.mean(c[i][1] for c in curves) for i in range(len(steps))]
        ax.plot(steps, mean, marker="o", label=name)
    ax.set_xlabel("training step (64 completions each)")
    ax.set_ylabel("held-out greedy pass rate (mean over seeds)")
    ax.set_title("Built-in model, arithmetic task: objectives at equal rollout budget")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=None, help="a subset of: " + ", ".join({**CONFIGS, **POLICY_LOSSES}))
    ap.add_argument("--policy-losses", action="store_true", help="GRPO and each newer policy loss instead of the algorithms")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run, e.g. train.mini_batch_size=32")
    ap.add_argument("--tag", default="", help="suffix of the saved files' names, e.g. _2updates")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    import yaml

    extra = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.set)}
    configs = POLICY_LOSSES if args.policy_losses else CONFIGS
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:  # seeds outermost, so a slow spell of the machine hits every objective alike
            for name, overrides in configs.items():
                if args.only and name not in args.only:
                    continue
                result = run(name, overrides, seed, args.steps, args.eval_every, args.threads, Path(tmp), extra)
                results.append(result)
                print(json.dumps({k: v for k, v in result.items() if k != "curve"}), flush=True)
    print(table(results, configs))
    if args.save:
        date = datetime.date.today().isoformat()
        out, stem = ROOT / "bench" / "results", ("policy_losses" if args.policy_losses else "algorithms") + f"_{date}{args.tag}"
        flag = (" --policy-losses" if args.policy_losses else "") + "".join(f" --set {item}" for item in args.set)
        flag += f" --only {' '.join(args.only)}" if args.only else ""
        flag += f" --tag {args.tag}" if args.tag else ""
        (out / f"{stem}.json").write_text(json.dumps({"date": date, "args": vars(args), "runs": results}, indent=1) + "\n")
        (out / f"{stem}.md").write_text(f"# Objectives at equal rollout budget ({date})\n\n"
                                        f"`python bench/algorithms.py{flag} --seeds {' '.join(map(str, args.seeds))} "
                                        f"--steps {args.steps} --threads {args.threads} --save`\n\n{table(results, configs)}\n")
        plot(results, configs, out / f"{stem}.png")
        print(f"wrote {out}/{stem}.{{json,md,png}}", file=sys.stderr)


if __name__ == "__main__":
    main()
