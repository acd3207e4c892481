"""ScaleRL on W2, the compute-bound variant of the reference benchmark (shared/bench/trl_grpo_w2.py): one JSON line.

The same work as TRL's script: the same random-init 27.3M-parameter Llama (tiny_task's tokenizer,
`torch.manual_seed(0)`, hidden 512, 8 layers, MLP 1536, untied), the GRPO prompts in file order
(16 per step × 8 completions), exactly 32 new tokens (EOS masked out by `rollout.min_new_tokens=32`,
as TRL's `min_new_tokens`), temperature 1, β 0, one update per batch, AdamW lr 1e-5 constant, grad
clip 1.0, token-mean loss, 6 steps of which the first is a warm-up, 2 threads. The 2048² matmul peaks
(fp32, bf16) are measured before and after, as TRL's script does, and the step is split into
generation, training forward, backward and optimizer, each with its achieved GFLOP/s.

    python bench/scalerl_w2.py [--mode fp32|standard] [--tiny-task ../shared/bench]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

STEPS, PROMPTS, GROUP, LENGTH = 6, 16, 8, 32
MODEL = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
             intermediate_size=1536, max_position_embeddings=128)


def matmul_gflops(dtype: torch.dtype, n: int = 2048, reps: int = 10) -> float:
    """Median GFLOP/s of an n × n matmul after 3 untimed calls (TRL's W2 script measures the same)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)
    for _ in range(3):
        torch.mm(a, b)
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        rates.append(2 * n**3 / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def build_model(folder: Path, tiny_task) -> int:
    """TRL's W2 model, saved with the tokenizer; returns its parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_task.build_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), **MODEL, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(tiny_task.SEED)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


class PhaseTimer:
    """Wall time per phase, by wrapping the functions that do it (per step: `split()`)."""

    def __init__(self):
        self.total: dict[str, float] = collections.defaultdict(float)
        self.steps: list[dict[str, float]] = []

    def wrap(self, owner, name: str, phase: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.total[phase] += time.perf_counter() - start

        setattr(owner, name, timed)

    def split(self) -> None:
        self.steps.append(dict(self.total))
        self.total.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="fp32", help="precision.mode (fp32, standard, ...)")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another config override, e.g. model.attn_implementation=eager")
    ap.add_argument("--tiny-task", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "bench")
    args = ap.parse_args()
    torch.set_num_threads(2)
    sys.path.insert(0, str(args.tiny_task))
    import tiny_task

    from scalerl.config import load_config
    from scalerl.jsonl import read_metrics
    from scalerl.rollout import hf
    from scalerl.learner import learner
    from scalerl.models import logprobs
    from scalerl.trainer import loop, step as step_module

    timer = PhaseTimer()
    timer.wrap(hf.HFSampler, "sample", "generation")
    timer.wrap(logprobs, "completion_forward", "train_forward")  # the learner's forward (CompletionModel.forward)
    timer.wrap(torch.Tensor, "backward", "backward")
    timer.wrap(learner.Learner, "apply_update", "optimizer")  # clipping and the AdamW step
    prompt_tokens: list[int] = []  # real (unpadded) prompt tokens of each sample call, as TRL's script counts them
    sample = hf.HFSampler.sample

    def counted_sample(*a, **kw):
        rollout = sample(*a, **kw)
        prompt_tokens.append(int(rollout.prompt_mask.sum()))
        return rollout

    hf.HFSampler.sample = counted_sample
    real_step = step_module.train_step

    def step_then_split(*a, **kw):
        if not timer.steps:  # what ran before the first step (the evaluation before training) is not a step
            timer.total.clear()
            prompt_tokens.clear()
        out = real_step(*a, **kw)
        timer.split()
        return out

    loop.train_step = step_then_split
    peaks_before = {"fp32": matmul_gflops(torch.float32), "bf16": matmul_gflops(torch.bfloat16)}
    with tempfile.TemporaryDirectory() as tmp:
        params = build_model(Path(tmp) / "model", tiny_task)
        config = load_config(overrides={
            "model.path": str(Path(tmp) / "model"), "env.shuffle": False, "precision.mode": args.mode,
            "rollout.prompts_per_step": PROMPTS, "rollout.group_size": GROUP, "rollout.max_new_tokens": LENGTH,
            "rollout.min_new_tokens": LENGTH, "rollout.temperature": 1.0, "rollout.top_p": 1.0, "rollout.top_k": 0,
            "optim.lr": 1e-5, "optim.schedule": "constant", "optim.warmup_steps": 0, "optim.weight_decay": 0.0,
            "optim.max_grad_norm": 1.0, "algorithm.kl.beta": 0.0, "algorithm.loss_agg": "token",
            "train.steps": args.steps, "train.threads": 2, "eval.every": 0, "eval.max_tasks": 16,
            "checkpoint.save_final": False, "log.run_dir": str(Path(tmp) / "runs"), "log.name": "w2", "log.console": "none",
            **dict(item.split("=", 1) for item in args.set),
        })
        summary = loop.train(config)
        rows = read_metrics(Path(summary["run_dir"]))
    peaks_after = {"fp32": matmul_gflops(torch.float32), "bf16": matmul_gflops(torch.bfloat16)}
    timed, phases = rows[1:], timer.steps[1 : len(rows)]  # the last split also holds the final evaluation: dropped
    med = statistics.median(r["step_time_s"] for r in timed)
    gen_tokens = statistics.mean(r["tokens"] for r in timed)
    prompt_tokens = statistics.mean(prompt_tokens[1 : len(rows)])
    flops = {"generation": 2 * params * gen_tokens, "train_forward": 2 * params * (prompt_tokens + gen_tokens),
             "backward": 4 * params * (prompt_tokens + gen_tokens)}
    total = 2 * params * gen_tokens + 6 * params * (prompt_tokens + gen_tokens)
    split = {k: statistics.median(p.get(k, 0.0) for p in phases) for k in ("generation", "train_forward", "backward", "optimizer")}
    peak_bf16 = max(peaks_before["bf16"], peaks_after["bf16"])
    peak_fp32 = max(peaks_before["fp32"], peaks_after["fp32"])
    limit = peak_fp32 if args.mode == "fp32" else peak_bf16
    print(json.dumps({
        "framework": "scalerl", "variant": "W2", "mode": args.mode, "params": params, "steps_timed": len(timed),
        "all_completions_exactly_32_tokens": all(r["response_len"] == LENGTH and r["truncated_frac"] == 1.0 for r in rows),
        "seconds_per_step": round(med, 3),
        "first_step_seconds": round(rows[0]["step_time_s"], 3),  # the warm-up (rollout.decode=compiled: it compiles)
        "generated_tokens_per_second": round(gen_tokens / med, 1),
        "est_gflop_per_step": round(total / 1e9, 1),
        "achieved_gflops": round(total / med / 1e9, 1),
        "fp32_matmul_peak_gflops": round(peak_fp32, 1), "bf16_matmul_peak_gflops": round(peak_bf16, 1),
        "achieved_fraction_of_bf16_matmul": round(total / med / 1e9 / peak_bf16, 3),
        "split_seconds": {k: round(v, 3) for k, v in split.items()},
        "split_gflops": {k: round(flops[k] / v / 1e9, 1) for k, v in split.items() if k in flops and v > 0},
        "split_fraction_of_its_dtype_peak": {k: round(flops[k] / v / 1e9 / limit, 3) for k, v in split.items() if k in flops and v > 0},
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "torch_threads": torch.get_num_threads(),
    }), flush=True)


if __name__ == "__main__":
    main()
