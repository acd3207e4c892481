"""ScaleRL on the reference benchmark's work (shared/bench/README.md): prints one JSON line.

Same base folder, same prompts in the same order (the built-in arithmetic environment with its
default split *is* the reference split), 8 prompts x 8 completions, 8 new tokens, temperature 1,
AdamW lr 1e-4 constant, grad clip 1.0, beta 0, 30 steps, 2 threads. The JSON keys are those of
`trl_grpo.py`. `seconds_total` is the training loop's wall time (steps, logging to metrics.jsonl
and TensorBoard) without the final evaluation and checkpoint save, which TRL's figure leaves out
too (it saves nothing).

    python bench/scalerl_grpo.py --out .bench/out [--seed N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import psutil
import torch

STEPS = 30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("SCALERL_BENCH_OUT", ".bench/out")))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another config override, e.g. model.attn_implementation=eager")
    ap.add_argument("--tiny-task", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "bench",
                    help="folder of the reference tiny_task.py, to cross-check the final pass rate with its evaluate()")
    args = ap.parse_args()
    torch.set_num_threads(2)

    from scalerl.config import load_config
    from scalerl.jsonl import read_metrics
    from scalerl.trainer.loop import train

    run_name = f"scalerl_seed{args.seed}_{os.getpid()}"
    config = load_config(overrides={
        "model.path": str(args.out / "base"),
        "env.shuffle": False,  # prompts in file order: step i uses prompts 8i..8i+7
        "rollout.prompts_per_step": 8, "rollout.group_size": 8, "rollout.max_new_tokens": 8,
        "rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0,
        "optim.lr": 1e-4, "optim.schedule": "constant", "optim.warmup_steps": 0, "optim.weight_decay": 0.0,
        "optim.max_grad_norm": 1.0, "algorithm.kl.beta": 0.0, "algorithm.loss_agg": "token",
        "train.steps": args.steps, "train.seed": args.seed, "train.threads": 2,
        "eval.every": 0, "log.run_dir": str(args.out / "runs"), "log.name": run_name, "log.console": "none",
        **dict(item.split("=", 1) for item in args.set),
    })
    summary = train(config)
    rows = read_metrics(Path(summary["run_dir"]))
    tokens = sum(r["tokens"] for r in rows)
    # with eval.every set: (step, training seconds to that step without the evaluations, held-out pass rate)
    curve, eval_s = [], 0.0
    for r in rows:
        eval_s += r.get("eval_time_s") or 0.0
        if r.get("eval/pass_rate") is not None:
            curve.append([r["step"], round(r["time/elapsed_s"] - eval_s, 4), r["eval/pass_rate"]])
    completions = len(rows) * config.batch_size

    cross_check = None
    if (args.tiny_task / "tiny_task.py").is_file():  # the reference's own evaluate() on our final weights
        sys.path.insert(0, str(args.tiny_task))
        import tiny_task
        from transformers import AutoModelForCausalLM, AutoTokenizer

        final = Path(summary["run_dir"]) / "checkpoints" / f"step_{args.steps:07d}"
        tok = AutoTokenizer.from_pretrained(final)
        model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
        cross_check = tiny_task.evaluate(model, tok, tiny_task.task_splits(tiny_task.SEED)[0])

    print(json.dumps({
        "framework": "scalerl",
        "steps": len(rows),
        "completions": completions,
        "generated_tokens": tokens,
        "seconds_total": round(summary["loop_time_s"], 3),
        "seconds_per_step": round(statistics.median(r["step_time_s"] for r in rows), 4),
        "completions_per_second": round(completions / summary["loop_time_s"], 2),
        "generated_tokens_per_second": round(tokens / summary["loop_time_s"], 2),
        "seconds_process": round(time.time() - psutil.Process().create_time(), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "pass_rate_before": summary["pass_rate_before"],
        "pass_rate_after": summary["pass_rate_after"],
        "pass_rate_after_reference_eval": cross_check,
        "train_reward_first_step": round(rows[0]["reward_mean"], 4),
        "train_reward_last_step": round(rows[-1]["reward_mean"], 4),
        "pass_rate_curve": curve,
        "torch_threads": torch.get_num_threads(),
        "seed": args.seed,
    }), flush=True)


if __name__ == "__main__":
    main()
