"""Peak memory of the training forward + backward with the LM head chunked (train.logprob_chunk_tokens, auto)
against the whole float32 logits (train.logprob_chunk_tokens=0), at a 32k-token vocabulary and 1k-token
completions.

A random-init Llama (built in-process, no download) runs what the learner's micro-step runs:
`completion_forward` with the entropy (the learner always asks for it), a loss over the log-probs and the
entropy, backward. Each variant runs in a fresh subprocess, twice:

- RSS: the process's peak RSS (ru_maxrss) minus its RSS just before the forward (model built, gradients
  allocated by a first small step, so both variants start from the same state);
- tracked tensors: the peak of the bytes of the tensors the forward and backward create and hold at once
  (a TorchDispatchMode, each new storage counted until it is freed; parameters and their .grad excluded),
  the estimator's own tracker (tests/predict/test_memory.py).

Besides, the estimator's figure (`estimate_memory`: activations' logits part + backward transient) and the
largest difference of the log-probs, the entropy and the head's gradient between the two (float32).
Memory figures do not depend on CPU contention (timings would; none are reported as results).

    OMP_NUM_THREADS=2 python bench/chunked_logprobs.py --save
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=32768)
MICRO, PROMPT, COMPLETION = 2, 64, 1024
COMMAND = "OMP_NUM_THREADS=2 python bench/chunked_logprobs.py --save"


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(chunk: int | None, out: Path, device: str = "cpu") -> None:
    import resource
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from transformers import LlamaConfig, LlamaForCausalLM

    from scalerl.models.logprobs import completion_forward
    from scalerl.types import Rollout

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=False, attn_implementation="sdpa")).train().to(device)
    cuda = device.startswith("cuda")
    g = torch.Generator().manual_seed(1)
    V = SHAPE["vocab_size"]

    def batch(rows: int, completion: int) -> Rollout:
        b = Rollout(prompt_ids=torch.randint(3, V, (rows, PROMPT), generator=g), prompt_mask=torch.ones(rows, PROMPT, dtype=torch.long),
                    completion_ids=torch.randint(3, V, (rows, completion), generator=g),
                    completion_mask=torch.ones(rows, completion, dtype=torch.long), sampler_logprobs=torch.zeros(rows, completion),
                    group_ids=torch.arange(rows), truncated=torch.zeros(rows, dtype=torch.bool))
        return Rollout(**{k: v.to(device) for k, v in vars(b).items()})

    def step(b: Rollout):
        fwd = completion_forward(model, b, with_entropy=True, chunk_tokens=chunk)
        adv = torch.randn(len(b), 1, generator=torch.Generator().manual_seed(3)).to(device)
        (-(fwd.logprobs * adv).mean() - 0.01 * fwd.entropy.mean()).backward()
        return fwd

    step(batch(1, 8))  # gradients exist, as at a second micro-batch
    params = {p.untyped_storage().data_ptr() for p in model.parameters()} | {
        p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    b = batch(MICRO, COMPLETION)
    before = torch.cuda.memory_allocated() // 1024 if cuda else _rss_kib()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    fwd = step(b)
    # KiB: on a GPU the allocator's peak (torch.cuda.max_memory_allocated), on a CPU the process's peak RSS
    rss = (torch.cuda.max_memory_allocated() // 1024 if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) - before

    class Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live, self.peak, self.seen = 0, 0, set()

        def _freed(self, ptr, nbytes):
            self.live -= nbytes
            self.seen.discard(ptr)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            res = func(*args, **(kwargs or {}))
            inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
            for t in tree_flatten(res)[0]:
                if isinstance(t, torch.Tensor) and (s := t.untyped_storage()).nbytes() and (ptr := s.data_ptr()) not in self.seen | inputs | params:
                    self.seen.add(ptr)
                    self.live += s.nbytes()
                    weakref.finalize(s, self._freed, ptr, s.nbytes())
            self.peak = max(self.peak, self.live)
            return res

    model.zero_grad(set_to_none=False)
    with Live() as tracker:
        fwd = step(b)
    torch.save({"logprobs": fwd.logprobs.detach(), "entropy": fwd.entropy.detach(), "head_grad": model.lm_head.weight.grad.clone()},
               out.with_suffix(".pt"))
    out.write_text(json.dumps({"peak_rss_increase_mib": rss / 1024, "tracked_peak_mib": tracker.peak / 2**20}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", action="store_true", help="write bench/results/chunked_logprobs_<date>.{json,md}")
    ap.add_argument("--child", choices=["whole", "chunked"], help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cpu", help="cuda: peak_rss_increase_mib is then torch.cuda.max_memory_allocated's increase "
                                                    "(results file chunked_logprobs_gpu_<date>)")
    args = ap.parse_args()
    if args.device.startswith("cuda"):
        import torch as _torch

        if not _torch.cuda.is_available():
            print(f"--device {args.device}: no CUDA device here (torch {_torch.__version__}); run it on a GPU machine "
                  "(bash bench/gpu_check.sh run) or with --device cpu", file=sys.stderr)
            sys.exit(2)
    if args.child:
        child(0 if args.child == "whole" else None, args.out, args.device)
        return
    import torch

    from scalerl.config.plan import chunk_positions
    from scalerl.predict.memory import ModelShape, estimate_memory

    results, tensors = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ("whole", "chunked"):
            out = Path(tmp) / f"{variant}.json"
            subprocess.run([sys.executable, __file__, "--child", variant, "--out", str(out), "--device", args.device], check=True, cwd=ROOT)
            results[variant] = json.loads(out.read_text())
            tensors[variant] = torch.load(out.with_suffix(".pt"), map_location="cpu")
    shape = ModelShape(vocab=SHAPE["vocab_size"], hidden=SHAPE["hidden_size"], intermediate=SHAPE["intermediate_size"],
                       layers=SHAPE["num_hidden_layers"], heads=SHAPE["num_attention_heads"], kv_heads=SHAPE["num_key_value_heads"],
                       head_dim=SHAPE["hidden_size"] // SHAPE["num_attention_heads"])
    for variant, setting in (("whole", 0), ("chunked", None)):
        est = estimate_memory(shape, micro_batch=MICRO, prompt_len=PROMPT, completion_len=COMPLETION, rollout_sequences=MICRO,
                              entropy=True, logprob_chunk=setting)
        results[variant]["estimate_activations_plus_transient_mib"] = (est["activations"] + est["backward_transient"]) / 2**20
    w, c = tensors["whole"], tensors["chunked"]
    report = {
        "date": datetime.date.today().isoformat(), "command": COMMAND, "shape": SHAPE, "micro_batch": MICRO, "prompt_len": PROMPT,
        "completion_len": COMPLETION, "chunk_positions": chunk_positions(None, SHAPE["vocab_size"]), "precision": "fp32", "device": args.device,
        "results": results,
        "ratio_chunked_over_whole": {k: results["chunked"][k] / results["whole"][k] for k in results["whole"]},
        "max_abs_diff": {k: (c[k] - w[k]).abs().max().item() for k in w},
        "note": "memory figures; CPU contention by other workers changes timings, not these (no timing is reported)",
    }
    print(json.dumps(report, indent=1))
    if args.save:
        gpu = "_gpu" if args.device.startswith("cuda") else ""
        path = ROOT / "bench" / "results" / f"chunked_logprobs{gpu}_{report['date']}"
        path.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        r, q = results, report["ratio_chunked_over_whole"]
        rows = "\n".join(f"| {k} | {r['whole'][k]:.1f} | {r['chunked'][k]:.1f} | {q[k]:.3f} |" for k in r["whole"])
        path.with_suffix(".md").write_text(
            f"# Chunked log-probs: peak memory of forward + backward ({report['date']})\n\n"
            f"`{COMMAND}`\n\nRandom-init Llama h={SHAPE['hidden_size']}, {SHAPE['num_hidden_layers']} layers, vocabulary "
            f"{SHAPE['vocab_size']}; {MICRO} rows of {PROMPT} prompt + {COMPLETION} completion tokens; fp32, entropy on (as the "
            f"learner); chunks of {report['chunk_positions']} positions (train.logprob_chunk_tokens=null, auto) against the whole "
            f"logits (0).\n\n| MiB | whole logits | chunked | chunked / whole |\n|---|---|---|---|\n{rows}\n\n"
            f"Largest differences (float32): {', '.join(f'{k} {v:.2e}' for k, v in report['max_abs_diff'].items())}.\n\n"
            f"The estimator (activations' logits part + backward transient) against the tracked peak: whole "
            f"{r['whole']['estimate_activations_plus_transient_mib'] / r['whole']['tracked_peak_mib']:.2f}x, chunked "
            f"{r['chunked']['estimate_activations_plus_transient_mib'] / r['chunked']['tracked_peak_mib']:.2f}x (the whole-logits "
            "estimate doubles the logits for the entropy term, which scalerl/predict/memory.py marks as not measured).\n\n"
            "Memory figures: CPU contention by other workers (2 shared cores) slows the run but does not change them; "
            "no timing is reported.\n")


if __name__ == "__main__":
    main()
