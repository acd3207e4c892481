"""How the step's cost grows: seconds per step against batch size (4 sizes) and model size (3 sizes).

    python bench/cost_growth.py [--steps 4] [--save]

Random-init Llamas on the built-in character tokenizer (hidden 128/4 layers, 256/6, 512/8: about
1M, 5M and 26M parameters), GRPO with β 0, every completion exactly 16 new tokens
(`rollout.min_new_tokens` = `max_new_tokens`, so the work per completion is fixed), group 8,
`--precision` (fp32 by default, as the history; `auto` is what a run gets, the mode it chose is printed), 2 threads, in this process (one model at a time). Batch sweep: the 5M model at 4, 8, 16 and 32
prompts per step (32 to 256 completions); model sweep: 8 prompts (64 completions) on each model.
The median step time (after one warm-up step) is fitted with a line, t = a + b·x, x the completions
(batch sweep) or 6·parameters·positions (model sweep, the forward + backward FLOPs): the intercept a
is the cost that does not grow with x, and each point's residual is printed. `--save` writes
bench/results/cost_growth_<date><--tag>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
MODELS = {"1M": (128, 512, 4, 4), "5M": (256, 1024, 6, 4), "26M": (512, 1408, 8, 8)}  # hidden, MLP, layers, heads
LENGTH, GROUP = 16, 8


def build(folder: Path, hidden: int, mlp: int, layers: int, heads: int) -> int:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from scalerl.models.paths import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=128,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def step_time(model: Path, prompts: int, steps: int, runs: str, precision: str) -> tuple[float, float, float, float, str]:
    """(median seconds per step after a warm-up, mean trained positions per step, median seconds of the
    rollout part (sample, score) and of the learning part, the precision mode that ran)."""
    from scalerl.config import load_config
    from scalerl.distributed.context import DistContext
    from scalerl.trainer import loop

    over = {"model.path": str(model), "rollout.prompts_per_step": prompts, "rollout.group_size": GROUP,
            "rollout.max_new_tokens": LENGTH, "rollout.min_new_tokens": LENGTH, "algorithm.kl.beta": 0.0, "train.threads": 2,
            "precision.mode": precision, "log.run_dir": runs, "log.name": f"p{prompts}", "log.console": "none", "log.tensorboard": False}
    rollout, learner, _ = loop.build_roles(load_config(overrides=over), DistContext(), resume=False, overwrite=True)
    times, positions, parts = [], [], []
    for step in range(1, steps + 2):
        start = time.perf_counter()
        metrics = loop.train_step(rollout, learner, step, learner.ctx)[1]
        times.append(time.perf_counter() - start)
        positions.append(metrics["trained_positions"])
        parts.append((metrics["time/rollout_s"], metrics["time/learn_s"]))
    rollout.close()
    return (statistics.median(times[1:]), statistics.mean(positions[1:]), statistics.median(p[0] for p in parts[1:]),
            statistics.median(p[1] for p in parts[1:]), learner.precision.mode)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, list[float]]:
    """Least-squares line y = a + b·x; returns (a, b, residuals)."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    return a, b, [y - (a + b * x) for x, y in zip(xs, ys)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--precision", default="fp32", help="precision.mode of every run (auto: each run's own choice)")
    ap.add_argument("--tag", default="", help="suffix of the results files")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, shape in MODELS.items():
            folder = Path(tmp) / name
            params = build(folder, *shape)
            for prompts in ((4, 8, 16, 32) if name == "5M" else (8,)):
                t, pos, roll, learn, mode = step_time(folder, prompts, args.steps, str(Path(tmp) / "runs"), args.precision)
                rows.append({"model": name, "params": params, "completions": prompts * GROUP, "positions": pos, "step_s": t,
                             "rollout_s": roll, "learn_s": learn, "precision": mode})
                print(json.dumps(rows[-1]), flush=True)
    modes = sorted({r["precision"] for r in rows})
    batch = [r for r in rows if r["model"] == "5M"]
    size = [r for r in rows if r["completions"] == 8 * GROUP]
    a1, b1, res1 = fit([r["completions"] for r in batch], [r["step_s"] for r in batch])
    flops = [6 * r["params"] * r["positions"] for r in size]
    a2, b2, res2 = fit(flops, [r["step_s"] for r in size])
    lines = ["| sweep | model | completions | step s | line | residual | rollout s | learn s |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| batch | 5M | {r['completions']} | {r['step_s']:.3f} | {a1 + b1 * r['completions']:.3f} | {e:+.3f} | "
              f"{r['rollout_s']:.3f} | {r['learn_s']:.3f} |" for r, e in zip(batch, res1)]
    lines += [f"| model | {r['model']} ({r['params'] / 1e6:.1f}M) | {r['completions']} | {r['step_s']:.3f} | {a2 + b2 * f:.3f} | {e:+.3f} | "
              f"{r['rollout_s']:.3f} | {r['learn_s']:.3f} |" for r, f, e in zip(size, flops, res2)]
    lines.append(f"\nbatch: t = {a1:.3f} s + {1e3 * b1:.2f} ms × completions; model: t = {a2:.3f} s + "
                 f"{b2 * 1e12:.2f} ms per GFLOP of 6 · params · positions, i.e. {1 / b2 / 1e9:.0f} GFLOP/s of forward + backward work")
    print("\n".join(lines))
    if args.save:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        date = datetime.date.today().isoformat()
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        xs = [r["completions"] for r in batch]
        left.plot(xs, [r["step_s"] for r in batch], "o", label="measured")
        left.plot(xs, [a1 + b1 * x for x in xs], "-", label=f"{a1:.2f} s + {1e3 * b1:.1f} ms/completion")
        left.set(xlabel="completions per step (5M model, 16 tokens each)", ylabel="seconds per step")
        left.legend()
        right.plot([f / 1e9 for f in flops], [r["step_s"] for r in size], "o", label="measured (1M, 5M, 26M)")
        right.plot([f / 1e9 for f in flops], [a2 + b2 * f for f in flops], "-", label="line")
        right.set(xlabel="6 · params · trained positions (GFLOP), 64 completions", ylabel="seconds per step")
        right.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / f"cost_growth_{date}{args.tag}.png", dpi=100)
        cmd = "python bench/cost_growth.py " + " ".join(__import__("sys").argv[1:])
        (RESULTS / f"cost_growth_{date}{args.tag}.json").write_text(json.dumps({"date": date, "command": cmd, "precision": modes, "rows": rows,
                                                                     "batch_fit": [a1, b1], "model_fit": [a2, b2]}, indent=1))
        (RESULTS / f"cost_growth_{date}{args.tag}.md").write_text(f"# Step cost growth, {date}\n\n`{cmd}` (precision {', '.join(modes)}, 2 threads, "
                                                                  f"alone on the machine; ![plot](cost_growth_{date}{args.tag}.png))\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
