"""The vLLM rollout engine against the Hugging Face sampler on W2's model: engine start, weight sync, generation.

    python bench/vllm_engine.py [--threads 2] [--reps 3] [--modes fp32 standard] [--device auto] [--save]

W2's model (shared/bench/trl_grpo_w2.py: random-init Llama, `torch.manual_seed(0)`, hidden 512, 8 layers,
MLP 1536, untied, tiny_task's 20-token vocabulary, 27.3M parameters), W2's generation: the first 16 GRPO
prompts × 8 samples of exactly 32 new tokens (EOS masked out, `min_new_tokens=32`), temperature 1, fixed
per-prompt seeds. Both engines run in this one process with `--threads` torch threads:

- engine start: `VLLMSampler(folder)` until it can sample (the HF sampler has none: it wraps the model);
- weight sync: a state dict of the training model's weights into the engine (`sync_weights`): vLLM's in-place
  reload and prefix-cache reset, against the HF sampler loading the same state dict into a model copy (which
  it does only when it does not share the learner's modules, e.g. another process; in `scalerl train` the
  HF engine shares them and a sync costs nothing);
- generation: one `sample` call of 128 completions, tokens/s = 4096 / seconds.

The two engines alternate, one untimed call each first, and each figure is the median of `--reps` (≥ 3).
Each precision mode of `--modes` is measured in turn: fp32 (both engines in float32) and standard (the HF sampler
under the learner's bf16 autocast with its float32 head, vLLM in bfloat16 with `head_dtype` float32). On a CUDA
machine (`--device auto` picks it) the same script times both on the GPU. `--save` writes
bench/results/vllm_engine_<date>.{json,md}. Run it alone: nothing else busy on the cores.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results"
PROMPTS, GROUP, LENGTH = 16, 8, 32
MODEL = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
             intermediate_size=1536, max_position_embeddings=128)


def build_w2(folder: Path, tiny_task):
    """W2's model and tokenizer, saved to `folder` (what the vLLM engine starts from)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_task.build_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), **MODEL, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(tiny_task.SEED)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, tok


def timed(fn, device: torch.device) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["fp32", "standard"], choices=["fp32", "standard"],
                    help="precision.mode: fp32, or bf16 compute (standard)")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--tiny-task", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "bench")
    args = ap.parse_args()
    if args.reps < 3:
        ap.error("--reps must be at least 3 (the figures are medians)")
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(args.tiny_task))
    import tiny_task

    from scalerl.distributed.context import resolve_device

    device = resolve_device(args.device)
    runs = [run_mode(mode, device, args.reps, tiny_task) for mode in args.modes]
    result = {
        "benchmark": "vllm_engine", "date": datetime.date.today().isoformat(), "device": str(device),
        "cpu": platform.processor() or platform.machine(), "torch": torch.__version__, "vllm": __import__("vllm").__version__,
        "threads": args.threads, "reps": args.reps,
        "work": f"{PROMPTS} prompts x {GROUP} samples x {LENGTH} new tokens (EOS masked), temperature 1",
        "command": f"python bench/vllm_engine.py --threads {args.threads} --reps {args.reps} --modes {' '.join(args.modes)} --device {args.device}",
        "runs": runs, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(result), flush=True)
    if args.save:
        RESULTS.mkdir(exist_ok=True)
        stem = RESULTS / f"vllm_engine_{result['date']}"
        stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        stem.with_suffix(".md").write_text(markdown(result))


def run_mode(mode: str, device: torch.device, reps: int, tiny_task) -> dict:
    """One precision mode: the vLLM engine's start, then both engines' generation and weight sync, alternated."""
    from scalerl.config.plan import precision_policy
    from scalerl.rollout.hf import HFSampler
    from scalerl.rollout.vllm_engine import VLLMSampler, engine_dtype
    from scalerl.types import SamplingParams

    policy = precision_policy(mode)
    dtype = engine_dtype(policy.autocast_dtype, policy.weights_dtype)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if policy.autocast_dtype else contextlib.nullcontext
    with tempfile.TemporaryDirectory() as tmp:
        model, tok = build_w2(Path(tmp) / "w2", tiny_task)
        params_count = sum(p.numel() for p in model.parameters())
        model = model.to(device)
        hf = HFSampler(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, device=device, autocast=autocast)
        start, vllm_engine = timed(lambda: VLLMSampler(Path(tmp) / "w2", pad_id=tok.pad_token_id, stop_ids=tok.eos_token_id,
                                                       device=device, dtype=dtype, fp32_head=True, kv_cache_gb=1.0, max_model_len=128),
                                   device)
        threads_after_start = torch.get_num_threads()
        _, train_prompts, _ = tiny_task.task_splits()
        ids = [tok(p)["input_ids"] for p in train_prompts[:PROMPTS]]
        sp = SamplingParams(max_new_tokens=LENGTH, min_new_tokens=LENGTH, temperature=1.0, n=GROUP)
        seeds = list(range(PROMPTS))
        # The weights a learner would publish: the model's, nudged so a sync is not a no-op.
        g = torch.Generator().manual_seed(1)
        weights = {k: (v.detach().cpu() + 1e-4 * torch.randn(v.shape, generator=g)).to(device) for k, v in model.state_dict().items()}
        hf_copy = HFSampler(type(model)(model.config).to(device), pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, device=device)
        engines = {"hf": hf, "vllm": vllm_engine}
        sync_target = {"hf": hf_copy, "vllm": vllm_engine}
        gen: dict[str, list[float]] = {name: [] for name in engines}
        sync: dict[str, list[float]] = {name: [] for name in engines}
        lengths_ok = True
        for name, engine in engines.items():  # untimed first calls
            engine.sample(ids, sp, seeds)
            sync_target[name].sync_weights(weights, 1)
        for rep in range(reps):
            for name, engine in (engines.items() if rep % 2 == 0 else reversed(engines.items())):
                seconds, batch = timed(lambda: engine.sample(ids, sp, seeds), device)
                gen[name].append(seconds)
                lengths_ok &= bool((batch.completion_mask.sum(1) == LENGTH).all())
                seconds, _ = timed(lambda: sync_target[name].sync_weights(weights, rep + 2), device)
                sync[name].append(seconds)
        vllm_engine.close()
    tokens = PROMPTS * GROUP * LENGTH
    med = {name: statistics.median(v) for name, v in gen.items()}
    return {
        "mode": mode, "vllm_dtype": dtype, "params": params_count, "torch_threads_after_engine_start": threads_after_start,
        "all_completions_exactly_32_tokens": lengths_ok,
        "vllm_engine_start_s": round(start, 2),
        "generation_s": {k: [round(x, 3) for x in v] for k, v in gen.items()},
        "generation_s_median": {k: round(v, 3) for k, v in med.items()},
        "generated_tokens_per_s": {k: round(tokens / v, 1) for k, v in med.items()},
        "vllm_speedup_generation": round(med["hf"] / med["vllm"], 2),
        "weight_sync_s": {k: [round(x, 4) for x in v] for k, v in sync.items()},
        "weight_sync_s_median": {k: round(statistics.median(v), 4) for k, v in sync.items()},
    }


def markdown(r: dict) -> str:
    lines = [f"# vLLM engine vs the HF sampler on W2's model ({r['date']})\n",
             f"`{r['command']} --save`, alone on the machine; {r['device']} ({r['cpu']}), torch {r['torch']}, vLLM {r['vllm']}, "
             f"{r['threads']} torch threads. Model: W2's random-init Llama, {r['runs'][0]['params']:,} parameters. Work: {r['work']}; "
             f"the engines alternate after one untimed call each, medians of {r['reps']}. Weight sync: a state dict into the HF "
             "sampler's own model copy (`load_state_dict`; in `scalerl train` the HF engine shares the learner's modules and a sync "
             "costs nothing) and into the vLLM engine (in-place reload + prefix-cache reset).\n",
             "| mode (vLLM dtype) | engine start (s) | generation HF (s) | generation vLLM (s) | tokens/s HF | tokens/s vLLM | vLLM / HF | sync HF (s) | sync vLLM (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for x in r["runs"]:
        g, t, s = x["generation_s_median"], x["generated_tokens_per_s"], x["weight_sync_s_median"]
        lines.append(f"| {x['mode']} ({x['vllm_dtype']}) | {x['vllm_engine_start_s']} | {g['hf']} | {g['vllm']} | {t['hf']} | {t['vllm']} | "
                     f"{x['vllm_speedup_generation']}x | {s['hf']} | {s['vllm']} |")
    lines.append("")
    for x in r["runs"]:
        lines.append(f"- {x['mode']}: every completion exactly 32 tokens: {x['all_completions_exactly_32_tokens']}; torch threads after the "
                     f"engine started: {x['torch_threads_after_engine_start']}; generation runs {x['generation_s']}, syncs {x['weight_sync_s']}.")
    lines.append(f"\nThe first mode's engine start includes importing vLLM into the process. Peak RSS of the process: {r['peak_rss_mb']} MB.\n")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
