"""Memory and step time of each precision mode on one workload where activations matter.

    python bench/precision_modes.py [--steps 3] [--new-tokens 192] [--save]

A random-init Llama (hidden 512, 8 layers, 25.9M parameters, the built-in character tokenizer) is
written to a temporary folder; each mode runs in its own process (`--one MODE`): GRPO with a KL term
(β 0.04, so a reference model is held), 8 prompts × 4 completions of exactly `--new-tokens` new tokens
(EOS suppressed: `rollout.min_new_tokens`, so that every mode trains on the same number of tokens; 192 by
default, so that activations outweigh the states), 2 threads. Reported per mode: the state tensors' bytes (weights, gradients,
moments, error feedback, reference; `Learner.component_bytes`); those plus the bytes autograd saves for
backward in the training forward (each storage once, parameters excluded: the live tensors when the
backward starts, whatever the allocator keeps); the process's peak RSS above its RSS
before the model was loaded (states + activations + allocator slack), and the median step time.
Ratios are against fp32 in the same run. `compressed` recomputes activations in backward by default
(`model.gradient_checkpointing`); the last rows switch it on for fp32 and standard and off for compressed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

MODES = [("fp32", []), ("standard", []), ("compressed", ["precision.reference_8bit=true"]),
         ("aggressive", ["precision.fp8=simulated"]), ("fp32", ["model.gradient_checkpointing=true"]),
         ("standard", ["model.gradient_checkpointing=true"]),
         ("compressed", ["precision.reference_8bit=true", "model.gradient_checkpointing=false"])]


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def build_model(folder: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from scalerl.models.paths import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=8, max_position_embeddings=256, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)


def count_saved_tensors(learner) -> dict[int, int]:
    """{storage: bytes} of what autograd saves for backward during the learner's training forwards (not the
    parameters themselves; each storage once), filled as the learner runs: the activations held when the
    backward starts, where they peak."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in learner.policy.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    forward = learner.policy_forward.forward

    def counted(*args, **kwargs):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            return forward(*args, **kwargs)

    learner.policy_forward.forward = counted
    return saved


def one(mode: str, extra: list[str], model: str, steps: int, new_tokens: int) -> dict:
    import torch

    from scalerl.config import load_config
    from scalerl.distributed.context import DistContext
    from scalerl.trainer import loop

    torch.set_num_threads(2)
    base = rss_mib()
    with tempfile.TemporaryDirectory() as runs:
        over = [f"model.path={model}", f"precision.mode={mode}", "algorithm.kl.beta=0.04", "rollout.prompts_per_step=8",
                "rollout.group_size=4", f"rollout.max_new_tokens={new_tokens}", f"rollout.min_new_tokens={new_tokens}", "train.threads=2", f"log.run_dir={runs}", "log.name=m",
                "log.console=none", "log.tensorboard=false", *extra]
        config = load_config(overrides=over)
        rollout, learner, _ = loop.build_roles(config, DistContext(), resume=False)
        saved, saved_max = count_saved_tensors(learner), 0
        times = []
        for step in range(1, steps + 1):
            saved.clear()
            t = time.perf_counter()
            loop.train_step(rollout, learner, step)
            times.append(time.perf_counter() - t)
            saved_max = max(sum(saved.values()), saved_max)
        parts = learner.component_bytes()
        rollout.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"mode": mode, "extra": extra, "checkpointing": config.model.gradient_checkpointing, "states_mib": sum(parts.values()) / 2**20, "parts": parts,
            "saved_mib": saved_max / 2**20, "tensors_at_peak_mib": (sum(parts.values()) + saved_max) / 2**20,
            "peak_rss_above_start_mib": peak - base, "step_s_median": statistics.median(times[1:] or times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--one", nargs=3, metavar=("MODE", "EXTRA", "MODEL"))
    args = ap.parse_args()
    if args.one:
        mode, extra, model = args.one
        print(json.dumps(one(mode, json.loads(extra), model, args.steps, args.new_tokens)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "llama26m"
        build_model(folder)
        env = {**os.environ, "OMP_NUM_THREADS": "2"}
        rows = []
        for mode, extra in MODES:
            out = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--new-tokens", str(args.new_tokens),
                                  "--one", mode, json.dumps(extra), str(folder)],
                                 capture_output=True, text=True, env=env, check=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    ref = rows[0]
    lines = [("| mode | activation checkpointing | states MiB | × fp32 | states + saved tensors MiB | × fp32 | peak RSS above start MiB "
              "| × fp32 | step s | × fp32 |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = r["mode"] + (f" ({', '.join(r['extra'])})" if r["extra"] else "")
        lines.append(f"| {name} | {'on' if r['checkpointing'] else 'off'} | {r['states_mib']:.1f} | {r['states_mib'] / ref['states_mib']:.2f} | "
                     f"{r['tensors_at_peak_mib']:.0f} | {r['tensors_at_peak_mib'] / ref['tensors_at_peak_mib']:.2f} | {r['peak_rss_above_start_mib']:.0f} | "
                     f"{r['peak_rss_above_start_mib'] / ref['peak_rss_above_start_mib']:.2f} | {r['step_s_median']:.2f} | "
                     f"{r['step_s_median'] / ref['step_s_median']:.2f} |")
    print("\n".join(lines))
    if args.save:
        out = Path(__file__).parent / "results" / f"precision_modes_{date.today()}"
        out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
        out.with_suffix(".md").write_text(f"# Precision modes, {date.today()}\n\n`python bench/precision_modes.py --steps {args.steps} --new-tokens {args.new_tokens} --save`"
                                          f" (2 threads, alone on the machine)\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
