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

On a GPU (issue 13's device check, one script, one run):

    python bench/precision_modes.py --device cuda --size 0.5b --steps 3 --new-tokens 256 --save

a ~0.5B random-init Llama (hidden 1536, 16 layers), 16 prompts × 8 completions, and the GPU's own modes:
`aggressive` through torchao's float8 (`precision.fp8=auto`), `optim.offload`, flash_attention_2 where
installed. Per mode `torch.cuda.max_memory_allocated` over the steps (the issue's measure) beside the
states' bytes, the median step time and the sampler's generated tokens per second; ratios against fp32.
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

SIZES = {"26m": dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8),
         "0.5b": dict(hidden_size=1536, intermediate_size=4096, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16)}
GPU_MODES = [("fp32", []), ("standard", []), ("standard", ["optim.offload=true"]), ("compressed", ["precision.reference_8bit=true"]),
             ("aggressive", ["precision.fp8=auto"]), ("standard", ["model.gradient_checkpointing=true"]),
             ("standard", ["model.attn_implementation=flash_attention_2"])]
MODES = [("fp32", []), ("standard", []), ("compressed", ["precision.reference_8bit=true"]),
         ("aggressive", ["precision.fp8=simulated"]), ("fp32", ["model.gradient_checkpointing=true"]),
         ("standard", ["model.gradient_checkpointing=true"]),
         ("compressed", ["precision.reference_8bit=true", "model.gradient_checkpointing=false"])]


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def build_model(folder: Path, size: str = "26m") -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from scalerl.models.paths import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), **SIZES[size], max_position_embeddings=512, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, tie_word_embeddings=False)
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


def one(mode: str, extra: list[str], model: str, steps: int, new_tokens: int, device: str = "cpu") -> dict:
    import torch

    from scalerl.config import load_config
    from scalerl.distributed.context import DistContext
    from scalerl.trainer import loop

    torch.set_num_threads(2)
    base = rss_mib()
    gpu = device == "cuda"
    batch = ["rollout.prompts_per_step=16", "rollout.group_size=8", "train.micro_batch_size=16"] if gpu else ["rollout.prompts_per_step=8", "rollout.group_size=4"]
    with tempfile.TemporaryDirectory() as runs:
        over = [f"model.path={model}", f"precision.mode={mode}", "algorithm.kl.beta=0.04", *batch, f"train.device={device}",
                f"rollout.max_new_tokens={new_tokens}", f"rollout.min_new_tokens={new_tokens}", "train.threads=2", f"log.run_dir={runs}", "log.name=m",
                "log.console=none", "log.tensorboard=false", *extra]
        config = load_config(overrides=over)
        rollout, learner, _ = loop.build_roles(config, DistContext(device=torch.device(device)), resume=False)
        saved, saved_max = count_saved_tensors(learner), 0
        times, gen = [], []
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        for step in range(1, steps + 1):
            saved.clear()
            t = time.perf_counter()
            metrics = loop.train_step(rollout, learner, step, learner.ctx)[1]
            if gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            gen.append(metrics["tokens"] / metrics["time/rollout_s"])
            saved_max = max(sum(saved.values()), saved_max)
        parts = learner.component_bytes()
        peak_gpu = torch.cuda.max_memory_allocated() / 2**20 if gpu else None
        rollout.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"mode": mode, "extra": extra, "checkpointing": config.model.gradient_checkpointing, "states_mib": sum(parts.values()) / 2**20, "parts": parts,
            "saved_mib": saved_max / 2**20, "tensors_at_peak_mib": (sum(parts.values()) + saved_max) / 2**20,
            "peak_rss_above_start_mib": peak - base, "peak_gpu_allocated_mib": peak_gpu, "step_s_median": statistics.median(times[1:] or times),
            "generated_tokens_per_s_median": statistics.median(gen[1:] or gen)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--size", choices=list(SIZES), default="26m")
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--one", nargs=3, metavar=("MODE", "EXTRA", "MODEL"))
    args = ap.parse_args()
    if args.one:
        mode, extra, model = args.one
        print(json.dumps(one(mode, json.loads(extra), model, args.steps, args.new_tokens, args.device)))
        return
    rows, failed = [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / f"llama{args.size}"
        build_model(folder, args.size)
        env = {**os.environ, "OMP_NUM_THREADS": "2"}
        for mode, extra in GPU_MODES if args.device == "cuda" else MODES:
            proc = subprocess.run([sys.executable, __file__, "--steps", str(args.steps), "--new-tokens", str(args.new_tokens), "--device", args.device,
                                   "--one", mode, json.dumps(extra), str(folder)], capture_output=True, text=True, env=env)
            if proc.returncode:  # e.g. torchao or flash-attn not installed there: said, and the others still run
                failed.append(f"{mode} {extra}: {(proc.stderr.strip().splitlines() or ['exit ' + str(proc.returncode)])[-1]}")
                continue
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    lines = table(rows) + [f"- failed: {f}" for f in failed]
    print("\n".join(lines))
    if args.save:
        out = Path(__file__).parent / "results" / f"precision_modes_{'gpu_' if args.device == 'cuda' else ''}{date.today()}"
        out.with_suffix(".json").write_text(json.dumps({"rows": rows, "failed": failed}, indent=1))
        command = f"python bench/precision_modes.py {' '.join(sys.argv[1:])}"
        out.with_suffix(".md").write_text(f"# Precision modes, {date.today()}\n\n`{command}` (alone on the machine)\n\n" + "\n".join(lines) + "\n")


def table(rows: list[dict]) -> list[str]:
    """Markdown rows, each ratio against the first row (fp32)."""
    if not rows:
        return []
    ref, gpu = rows[0], rows[0]["peak_gpu_allocated_mib"] is not None
    lines = [("| mode | activation checkpointing | states MiB | × fp32 | states + saved tensors MiB | × fp32 | "
              + ("peak GPU allocated MiB" if gpu else "peak RSS above start MiB") + " | × fp32 | step s | × fp32 | generated tokens/s |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    peak_key = "peak_gpu_allocated_mib" if gpu else "peak_rss_above_start_mib"
    for r in rows:
        name = r["mode"] + (f" ({', '.join(r['extra'])})" if r["extra"] else "")
        lines.append(f"| {name} | {'on' if r['checkpointing'] else 'off'} | {r['states_mib']:.1f} | {r['states_mib'] / ref['states_mib']:.2f} | "
                     f"{r['tensors_at_peak_mib']:.0f} | {r['tensors_at_peak_mib'] / ref['tensors_at_peak_mib']:.2f} | {r[peak_key]:.0f} | "
                     f"{r[peak_key] / ref[peak_key]:.2f} | {r['step_s_median']:.2f} | {r['step_s_median'] / ref['step_s_median']:.2f} | "
                     f"{r['generated_tokens_per_s_median']:.0f} |")
    return lines


if __name__ == "__main__":
    main()
