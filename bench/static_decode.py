"""The HF engine's generation with each rollout.decode (scalerl/rollout/static_decode.py), at W1's and W2's shapes.

W1: the reference benchmark's model (shared/bench: hidden 128, 4 layers, vocab 20), 8 prompts x 8 completions, up to 8
new tokens (rows stop at EOS), fp32. W2: bench/scalerl_w2.py's model (hidden 512, 8 layers, MLP 1536), 16 x 8 completions, 32 new tokens
(EOS masked, every row decodes all 32), bf16 autocast. W2-GQA: the same with 2 key/value heads for its 8 query heads. Random weights (the time does not depend on them), the
reference task's prompts; each mode's sampler is built once and the modes alternate, `--rounds` generations each
after a warm-up; medians. `compiled`'s first generation (torch.compile) is reported apart, with how many
generations it takes to pay for itself.

    python bench/static_decode.py [--rounds 15] [--compiled] [--shapes W1,W2,W2-GQA] [--tag _evening] [--save]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scalerl.rollout.hf import HFSampler
from scalerl.types import SamplingParams

SHAPES = {
    "W1": dict(model=dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, intermediate_size=512),
               prompts=8, n=8, new=8, min_new=0, bf16=False),
    "W2": dict(model=dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8, intermediate_size=1536),
               prompts=16, n=8, new=32, min_new=32, bf16=True),
    # W2 with grouped-query attention (8 query heads on 2 key/value heads, as most current models have)
    "W2-GQA": dict(model=dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1536),
                   prompts=16, n=8, new=32, min_new=32, bf16=True),
}


def _prompts(count: int) -> list[list[int]]:
    """`a+b=` prompts in the reference tokenizer's ids (BOS 1, digits 4-13, + 14, = 15)."""
    rng = random.Random(0)
    digits = lambda x: [4 + int(c) for c in str(x)]
    return [[1, *digits(rng.randint(0, 99)), 14, *digits(rng.randint(0, 99)), 15] for _ in range(count)]


def measure(name: str, attn: str, modes: list[str], rounds: int, device: torch.device) -> dict:
    shape = SHAPES[name]
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=20, max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0, **shape["model"])
    model = LlamaForCausalLM._from_config(config, attn_implementation=attn).eval().to(device)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if shape["bf16"] else None
    prompts = _prompts(shape["prompts"])
    params = SamplingParams(max_new_tokens=shape["new"], min_new_tokens=shape["min_new"], temperature=1.0, n=shape["n"])
    samplers = {mode: HFSampler(model, pad_id=0, eos_id=2, device=device, decode=mode, autocast=autocast) for mode in modes}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    first, times, tokens = {}, {mode: [] for mode in modes}, {}
    for i in range(rounds + 1):
        for mode, sampler in samplers.items():
            sync()
            start = time.perf_counter()
            out = sampler.sample(prompts, params, seeds=[1000 * i + k for k in range(len(prompts))])
            sync()
            seconds = time.perf_counter() - start
            (times[mode].append(seconds) if i else first.__setitem__(mode, seconds))
            tokens[mode] = int(out.completion_mask.sum())
    medians = {mode: statistics.median(v) for mode, v in times.items()}
    row = {"workload": name, "device": str(device), "attn": attn, "precision": "bf16 autocast" if shape["bf16"] else "fp32", "rounds": rounds,
           "median_s": medians, "first_s": first, "tokens_last": tokens,
           "speedup_vs_hf": {mode: medians["hf"] / medians[mode] for mode in modes}}
    if "compiled" in modes:
        saved = medians["hf"] - medians["compiled"]
        row["compiled_pays_after_generations"] = (first["compiled"] - medians["compiled"]) / saved if saved > 0 else None
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compiled", action="store_true", help="also rollout.decode=compiled (torch.compile: 4-15 s per shape on a 2-core CPU)")
    ap.add_argument("--device", default="cpu", help="cuda: compiled is torch.compile's reduce-overhead mode (CUDA graphs); results "
                                                    "file static_decode_gpu_<date>")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--tag", default="", help="appended to the results file's name (a second run on one date)")
    ap.add_argument("--save", action="store_true", help=f"write bench/results/static_decode_{date.today()}<tag>.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        print(f"--device {args.device}: not a torch device; use cpu or cuda", file=sys.stderr)
        sys.exit(2)
    if args.device.startswith("cuda"):
        import torch as _torch

        if not _torch.cuda.is_available():
            print(f"--device {args.device}: no CUDA device here (torch {_torch.__version__}); run it on a GPU machine "
                  "(bash bench/gpu_check.sh run) or with --device cpu", file=sys.stderr)
            sys.exit(2)
    modes = ["hf", "auto"] + (["compiled"] if args.compiled else [])
    shapes = args.shapes.split(",")
    if unknown := [name for name in shapes if name not in SHAPES]:
        print(f"--shapes: {', '.join(unknown)} not one of {', '.join(SHAPES)}", file=sys.stderr)
        sys.exit(2)
    rows = []
    for name in shapes:
        for attn in ("sdpa", "eager"):
            row = measure(name, attn, modes, args.rounds, device)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.save:
        gpu = "_gpu" if device.type == "cuda" else ""
        out = Path(__file__).parent / "results" / f"static_decode{gpu}_{date.today()}{args.tag}.json"
        tag = f" --tag {args.tag}" if args.tag else ""
        out.write_text(json.dumps({"date": str(date.today()), "threads": args.threads, "command": "python bench/static_decode.py "
                                   f"--rounds {args.rounds}{' --compiled' if args.compiled else ''} --shapes {args.shapes} --device {args.device}{tag} --save",
                                   "rows": rows}, indent=1))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
