"""Forgetting: train on task A (addition), then RL on task B (subtraction); held-out A accuracy after B
with none / SFT anchor / EWC / both / self-distillation, over seeds (issues 16, 37).

    python bench/forgetting.py --seeds 0 1 2 --save        # ~15 min on 2 cores; run it alone
    python bench/forgetting.py --seeds 0 --variants none self_distill --save   # self-distillation beside nothing

Stage A: the default job (GRPO on `a+b=`, 300 steps, seed 0), once. Stage B: from A's final checkpoint,
GRPO on one-digit `a-b=` (`B_ARGS`) for --steps steps per seed and variant; the anchor data is A's
own training prompts with their sums. After each B run its policy is exported and scored greedily on
A's held-out set (200 tasks) and on B's (30). Figures and a PNG go to bench/results/forgetting_<date>.*.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

B_ARGS = {"operators": ["-"], "max_operand": 9, "num_eval": 30}  # task B: one-digit subtraction (the A model scores > 0 on it)
VARIANTS = {
    "none": {"forgetting.sft_fraction": 0.0},
    "anchor": {"forgetting.sft_fraction": 0.05},
    "ewc": {"forgetting.sft_fraction": 0.0, "forgetting.ewc": True},
    "both": {"forgetting.sft_fraction": 0.05, "forgetting.ewc": True},
    # the source's lambda = 0.1 barely moves this model (its Fisher is small): stronger penalties, for scale
    "ewc-1e2": {"forgetting.sft_fraction": 0.0, "forgetting.ewc": True, "forgetting.ewc_lambda": 100.0},
    "ewc-1e4": {"forgetting.sft_fraction": 0.0, "forgetting.ewc": True, "forgetting.ewc_lambda": 10000.0},
    # the A model as the teacher of its own samples of A's prompts (reverse KL), no anchor responses used
    "self_distill": {"forgetting.sft_fraction": 0.0, "forgetting.self_distill": True},
}


def anchor_file(folder: Path) -> Path:
    """Task A's training prompts with their answers, as prompt/response rows."""
    from scalerl.envs.registry import build_env

    path = folder / "addition_anchor.jsonl"
    with path.open("w") as f:
        for task in build_env("arithmetic", {}).train_tasks():
            f.write(json.dumps({"prompt": task.prompt, "response": task.answer}) + "\n")
    return path


def accuracy(run: Path, env_args: dict) -> float:
    """Greedy held-out pass rate of a run's final policy (its newest checkpoint) on arithmetic with `env_args`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalerl.envs.registry import build_env
    from scalerl.rollout.hf import HFSampler
    from scalerl.rollout.evaluation import task_scores
    from scalerl.jobs.export import resolve_checkpoint
    from scalerl.types import SamplingParams

    folder = resolve_checkpoint(run)
    env = build_env("arithmetic", env_args)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    policy = AutoModelForCausalLM.from_pretrained(folder).eval()
    sampler = HFSampler(policy, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    sums = task_scores(env, env.eval_tasks(), sampler, tokenizer, SamplingParams(max_new_tokens=8, temperature=0.0), None,
                       batch_size=64, max_turns=1, encode=None)
    return float(sums.mean())


def train(runs: Path, name: str, overrides: dict) -> dict:
    from scalerl.config import load_config
    from scalerl.trainer.loop import train as run

    base = {"log.run_dir": str(runs), "log.name": name, "log.console": "none", "train.threads": 2, "eval.every": 100}
    return run(load_config(overrides={**base, **overrides}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=200, help="task B steps")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="forgetting-"))
    runs = work / "runs"
    t0 = time.perf_counter()
    train(runs, "task-a", {})
    a_ckpt = max((runs / "task-a" / "checkpoints").glob("step_*"))
    a_after_a = accuracy(runs / "task-a", {})
    b_after_a = accuracy(runs / "task-a", B_ARGS)
    print(f"task A model: A {a_after_a:.3f}, B {b_after_a:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    data = anchor_file(work)
    rows = []
    for seed in args.seeds:
        for variant in args.variants:
            name = f"b-{variant}-{seed}"
            t = time.perf_counter()
            train(runs, name, {"model.path": str(a_ckpt), "env.args": B_ARGS, "train.steps": args.steps, "train.seed": seed,
                               "forgetting.data": str(data), **VARIANTS[variant]})
            row = {"variant": variant, "seed": seed, "a_accuracy": accuracy(runs / name, {}),
                   "b_accuracy": accuracy(runs / name, B_ARGS), "seconds": time.perf_counter() - t}
            rows.append(row)
            print(json.dumps(row), flush=True)
    table = summarize(rows, args.variants, a_after_a, b_after_a)
    print("\n".join(table))
    if args.save:
        save(rows, table, a_after_a, b_after_a, args)


def summarize(rows: list[dict], variants: list[str], a0: float, b0: float) -> list[str]:
    lines = [f"task A model (300 steps of addition): held-out A {a0:.3f}, B {b0:.3f}",
             "| variant | A after B (median, per seed) | B after B (median, per seed) |", "|---|---|---|"]
    for v in variants:
        a = [r["a_accuracy"] for r in rows if r["variant"] == v]
        b = [r["b_accuracy"] for r in rows if r["variant"] == v]
        lines.append(f"| {v} | {statistics.median(a):.3f} ({', '.join(f'{x:.3f}' for x in a)}) | "
                     f"{statistics.median(b):.3f} ({', '.join(f'{x:.3f}' for x in b)}) |")
    return lines


def save(rows: list[dict], table: list[str], a0: float, b0: float, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = ROOT / "bench" / "results"
    stem = f"forgetting_{date.today().isoformat()}"
    command = (f"python bench/forgetting.py --seeds {' '.join(map(str, args.seeds))} --steps {args.steps} "
               f"--variants {' '.join(args.variants)} --save")
    (out / f"{stem}.json").write_text(json.dumps({"rows": rows, "a_before_b": a0, "b_before_b": b0, "steps_b": args.steps,
                                                  "seeds": args.seeds, "command": command}, indent=1))
    (out / f"{stem}.md").write_text("\n".join([f"# Forgetting ({date.today().isoformat()}, `{command}`)", "",
                                               *table, ""]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, v in enumerate(args.variants):
        pts = [r for r in rows if r["variant"] == v]
        ax.scatter([i] * len(pts), [r["a_accuracy"] for r in pts], label=f"{v}: A", color="C0")
        ax.scatter([i + 0.15] * len(pts), [r["b_accuracy"] for r in pts], label=f"{v}: B", color="C1", marker="x")
    ax.axhline(a0, color="C0", ls="--", lw=0.8)
    ax.set_xticks(range(len(args.variants)), args.variants)
    ax.set_ylabel("held-out pass rate after task B")
    ax.set_title(f"addition (A) kept while learning subtraction (B), {args.steps} steps")
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=120)


if __name__ == "__main__":
    main()
