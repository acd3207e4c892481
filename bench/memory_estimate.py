"""The memory estimator (`scalerl estimate`) against what a real training step holds on this CPU.

For each random-init Llama config (built in-process, no download), a fresh subprocess runs two
optimizer steps of the project's own loss path (`completion_forward` on prompt + completion, a
policy-gradient loss, backward, AdamW) with two micro-batches of gradient accumulation, so that in
the second step weights, gradients, AdamW states and one micro-batch's activations coexist. Measured:

- weights / gradients / optimizer: bytes of the parameters, of their .grad, of AdamW's state tensors;
- activations: bytes of the distinct storages autograd saves for backward during one micro-batch's
  forward (`torch.autograd.graph.saved_tensors_hooks`; parameters excluded);
- backward_transient: how far the peak RSS rose during the backward that set it, over the RSS just before
  that backward (the log-softmax's float32 gradients of the logits come before any activation is freed); 0
  when no backward set the peak;
- peak: the process's peak RSS (ru_maxrss) minus its RSS after imports (bitsandbytes' too, for the 8-bit
  modes: library code, not training memory), before the model is built. This also holds what the estimate
  does not model (matmul workspaces, allocator slack), and is compared with the estimated peak
  W + G + O + C + max(A + T, optimizer step).

Each precision mode (`--modes`, default fp32 standard compressed; aggressive on its simulated-fp8 path) runs
as the trainer runs it: the mode's weight dtype, its AdamW (`scalerl.precision.apply.build_adamw`: fused fp32,
bf16 or 8-bit moments with error feedback), bf16 autocast with the FP32 LM head, the mode's `prepare_policy`
(standard's bf16 residual stream, aggressive's fp8 linear layers); `optimizer` then includes the error feedback.

    python bench/memory_estimate.py --modes fp32 standard compressed aggressive --save
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "h512_l8_v32000": dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8, vocab_size=32000),
    "h768_l6_gqa_v8000": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=12, num_key_value_heads=4, vocab_size=8000),
}
MICRO, PROMPT, COMPLETION = 8, 96, 32
# glibc raises its mmap threshold after large frees, after which freed blocks stay in the heap and in RSS;
# a fixed threshold returns every large block on free, so RSS follows the live tensor bytes.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}


def measure(name: str, mode: str) -> dict:
    import contextlib
    import resource

    import psutil
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from scalerl.models.logprobs import completion_forward
    from scalerl.config.plan import precision_policy
    from scalerl.precision.adamw import _bnb_functional
    from scalerl.precision.apply import build_adamw, component_bytes, prepare_policy, weights_dtype
    from scalerl.types import Rollout

    torch.set_num_threads(1)
    if mode in ("compressed", "aggressive"):  # the 8-bit states' library: code, not training memory
        _bnb_functional()
    base_rss = psutil.Process().memory_info().rss
    torch.manual_seed(0)
    cfg = LlamaConfig(**CONFIGS[name], head_dim=CONFIGS[name]["hidden_size"] // CONFIGS[name]["num_attention_heads"],
                      max_position_embeddings=256, tie_word_embeddings=False, attn_implementation="sdpa")
    policy = precision_policy(mode, fp8="simulated")  # aggressive: its fp8 numerics and storage on CPU
    model = LlamaForCausalLM(cfg).to(weights_dtype(policy)).train()
    prepare_policy(model, policy, torch.device("cpu"))  # standard: the residual stream in bf16, as in training
    opt = build_adamw([{"params": list(model.parameters())}], policy, lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                      device=torch.device("cpu"))
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if policy.autocast_dtype else contextlib.nullcontext
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    # the working copy, not activations: under autocast with fp32 weights the saved bf16 casts of the weights;
    # with bf16 weights the FP32 head's float32 copy of the head weight
    if policy.weights_dtype == "float32":
        copy_dtype, copy_sizes = torch.bfloat16, ({p.numel() * 2 for p in model.parameters() if p.dim() == 2}
                                                  if policy.autocast_dtype else set())
    else:
        copy_dtype, copy_sizes = torch.float32, {model.get_output_embeddings().weight.numel() * 4}
    saved: dict[int, int] = {}
    copies: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr, nbytes = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        if ptr not in param_ptrs:
            (copies if t.dtype == copy_dtype and nbytes in copy_sizes else saved)[ptr] = nbytes
        return t

    def batch() -> Rollout:
        g = torch.Generator().manual_seed(1)
        ones = lambda n: torch.ones(MICRO, n, dtype=torch.long)  # noqa: E731
        return Rollout(prompt_ids=torch.randint(3, cfg.vocab_size, (MICRO, PROMPT), generator=g), prompt_mask=ones(PROMPT),
                       completion_ids=torch.randint(3, cfg.vocab_size, (MICRO, COMPLETION), generator=g),
                       completion_mask=ones(COMPLETION), sampler_logprobs=torch.zeros(MICRO, COMPLETION),
                       group_ids=torch.arange(MICRO), truncated=torch.zeros(MICRO, dtype=torch.bool))

    def maxrss() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    activations, transient = 0, 0
    for step in range(2):
        for micro in range(2):
            if step == 0 and micro == 0:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast():
                    out = completion_forward(model, batch(), fp32_head=policy.fp32_lm_head)
                activations, working_copy = sum(saved.values()), sum(copies.values())
            else:
                with autocast():
                    out = completion_forward(model, batch(), fp32_head=policy.fp32_lm_head)
            loss = -(out.logprobs.float() * torch.randn(MICRO, 1)).mean() / 2
            before, max_before = psutil.Process().memory_info().rss, maxrss()
            loss.backward()
            del out, loss
            if maxrss() > max_before:  # this backward set the peak: how far it rose over the forward's end
                transient = maxrss() - before
        grads = sum(p.grad.nbytes for p in model.parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
    weights = sum(p.nbytes for p in model.parameters())
    parts = component_bytes(None, opt)
    optim = parts["optimizer"] + parts["error_feedback"]
    peak = maxrss() - base_rss
    return {"weights": weights, "gradients": grads, "optimizer": optim, "working_copy": working_copy, "activations": activations,
            "backward_transient": transient, "peak_rss_growth": peak,
            "params": sum(p.numel() for p in model.parameters())}


def compare(name: str, mode: str, measured: dict) -> dict:
    from scalerl.predict.memory import ModelShape, estimate_memory

    c = CONFIGS[name]
    shape = ModelShape.from_hf_config({**c, "head_dim": c["hidden_size"] // c["num_attention_heads"]})
    est = estimate_memory(shape, precision=mode, micro_batch=MICRO, prompt_len=PROMPT, completion_len=COMPLETION, rollout_sequences=2 * MICRO)
    est["optimizer"] += est["error_feedback"]
    est_peak = est["weights"] + est["gradients"] + est["optimizer"] + est["working_copy"] + max(est["activations"] + est["backward_transient"],
                                                                                             est["optimizer_step"])
    rows = {k: {"estimate_mb": est[k] / 2**20, "measured_mb": measured[k] / 2**20, "rel_error": est[k] / measured[k] - 1}
            for k in ("weights", "gradients", "optimizer", "working_copy", "activations", "backward_transient") if measured[k] or est[k]}
    rows["peak (W+G+O+C+max(A+T, step) vs RSS growth)"] = {"estimate_mb": est_peak / 2**20, "measured_mb": measured["peak_rss_growth"] / 2**20,
                                             "rel_error": est_peak / measured["peak_rss_growth"] - 1}
    return {"config": name, "mode": mode, "shape": c, "params_estimate": est["params"], "params_measured": measured["params"],
            "components": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--modes", nargs="+", default=["fp32", "standard", "compressed"])
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    results = []
    for mode in args.modes:
        for name in CONFIGS:
            proc = subprocess.run([sys.executable, __file__, "--measure", name, mode], capture_output=True, text=True, cwd=ROOT,
                                  env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **MALLOC})
            if proc.returncode:
                sys.exit(proc.stderr)
            results.append(compare(name, mode, json.loads(proc.stdout.strip().splitlines()[-1])))
    report = {"date": datetime.date.today().isoformat(), "micro_batch": MICRO, "prompt_len": PROMPT, "completion_len": COMPLETION,
              "modes": args.modes, "results": results}
    lines = [f"# Memory estimate vs measured, {report['date']}", "",
             f"`python bench/memory_estimate.py {' '.join(sys.argv[1:])}`: micro-batch {MICRO} × ({PROMPT} prompt + {COMPLETION} completion) "
             "tokens, the mode's AdamW, 2 micro-batches of accumulation, CPU.", ""]
    for r in results:
        lines += [f"## {r['mode']}: {r['config']} ({r['params_measured']:,} parameters; estimated {int(r['params_estimate']):,})", "",
                  "| component | estimate (MiB) | measured (MiB) | error |", "|---|---|---|---|"]
        lines += [f"| {k} | {v['estimate_mb']:.1f} | {v['measured_mb']:.1f} | {100 * v['rel_error']:+.1f} % |" for k, v in r["components"].items()]
        lines.append("")
    print("\n".join(lines))
    if args.save:
        out = ROOT / "bench" / "results" / f"memory_estimate_{report['date']}"
        out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        out.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
