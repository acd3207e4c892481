"""Step time and memory per rank of parallel.strategy none / ddp / fsdp2 with 1 and 2 gloo ranks, W2-sized model.

    python bench/parallel_ranks.py [--steps 4] [--save]

The model is W2's shape (random-init Llama, hidden 512, 8 layers, MLP 1536, untied; a 256-token
vocabulary here, so ≈ 25.6M parameters). Each configuration samples 16 prompts x 8 completions of
exactly 32 new tokens in all (8 prompts per rank with 2 ranks), of 16 random prompt tokens, with the
trainer's sampler (under FSDP2 inside the strategy's all-gather) and learns them with the trainer's
learner (GRPO, fp32, one update, random rewards). The same 2 cores serve every configuration: 1 rank
with 2 threads, 2 ranks with 1 thread each. Per rank: the median step time over the steps after the
first, the sampling and learning parts, the bytes this rank holds of parameters, gradients and AdamW
moments (the local shards of FSDP2's DTensors) and its peak RSS. Also the 2048² fp32 matmul peak of
the same run. `--save` writes bench/results/parallel_ranks_<date>.{json,md}. Run it alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scalerl_w2 import matmul_gflops  # noqa: E402 - the same 2048² peak as the W2 benchmarks
RESULTS = Path(__file__).parent / "results"
MODEL = dict(vocab_size=256, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8,
             intermediate_size=1536, max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=0, eos_token_id=1)
PROMPTS, GROUP, NEW, PROMPT_LEN = 16, 8, 32, 16
CONFIGS = [("none", 1), ("ddp", 2), ("fsdp2", 2)]


def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def rank_main(rank: int, world: int, port: int, strategy: str, folder: str, steps: int, out: str) -> None:
    from scalerl.config import load_config
    from scalerl.distributed.context import DistContext
    from scalerl.models.loading import load_model
    from scalerl.rollout.hf import HFSampler
    from scalerl.learner.build import build_learner
    from scalerl.types import SamplingParams, ScoredBatch

    torch.set_num_threads(2 // world)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    ctx = DistContext(rank=rank, world_size=world)
    prompts = PROMPTS // world
    config = load_config(overrides=[f"model.path={folder}", f"parallel.strategy={strategy}", f"rollout.prompts_per_step={prompts}",
                                    f"rollout.group_size={GROUP}", f"rollout.max_new_tokens={NEW}", f"rollout.min_new_tokens={NEW}",
                                    "algorithm.kl.beta=0", "optim.lr=1e-5", "env.name=arithmetic"])
    learner = build_learner(config, ctx, load_model(config.model, ctx.device))
    sampler = HFSampler(learner.policy, pad_id=0, eos_id=1, device=ctx.device,
                        gather=lambda: learner.parallel.gathered(learner.policy_forward))
    params = SamplingParams(max_new_tokens=NEW, temperature=1.0, n=GROUP, min_new_tokens=NEW)
    g = torch.Generator().manual_seed(rank)
    times, sample_t, learn_t = [], [], []
    for step in range(1, steps + 1):
        ids = torch.randint(2, MODEL["vocab_size"], (prompts, PROMPT_LEN), generator=g).tolist()
        start = time.perf_counter()
        rollout = sampler.sample(ids, params, seeds=[step * 1000 + rank * 100 + i for i in range(prompts)])
        sampled = time.perf_counter()
        rewards = torch.rand(len(rollout.completion_ids), generator=g)
        batch = ScoredBatch(rollout, rewards, rewards, policy_version=learner.version, prompts=[""] * len(rewards),
                            completions=[""] * len(rewards), generated_tokens=int(rollout.completion_mask.sum()))
        learner.learn(batch, step)
        sampler.sync_weights(None, learner.version)
        end = time.perf_counter()
        times.append(end - start)
        sample_t.append(sampled - start)
        learn_t.append(end - sampled)
    trainable = [p for group in learner.optimizer.param_groups for p in group["params"]]
    moments = [v for s in learner.optimizer.state.values() for k, v in s.items() if isinstance(v, torch.Tensor) and k != "step"]
    result = {"strategy": strategy, "world": world, "rank": rank, "threads": torch.get_num_threads(),
              "step_s": statistics.median(times[1:]), "sample_s": statistics.median(sample_t[1:]), "learn_s": statistics.median(learn_t[1:]),
              "param_bytes": local_bytes(trainable), "grad_bytes": local_bytes(trainable),  # a gradient per parameter, as sharded
              "moment_bytes": local_bytes(moments), "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    Path(out, f"{strategy}_{world}_{rank}.json").write_text(json.dumps(result))
    if world > 1:
        dist.barrier()  # no rank leaves while another still talks to it (gloo aborts on a closed peer)
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(2)
    peak = matmul_gflops(torch.float32)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**MODEL))
        model.save_pretrained(tmp)
        n_params = sum(p.numel() for p in model.parameters())
        del model
        for strategy, world in CONFIGS:
            out = tempfile.mkdtemp(dir=tmp)
            mp.start_processes(rank_main, args=(world, free_port(), strategy, tmp, args.steps, out), nprocs=world, join=True,
                               start_method="spawn")
            for rank in range(world):
                rows.append(json.loads(Path(out, f"{strategy}_{world}_{rank}.json").read_text()))
                r = rows[-1]
                print(f"{strategy:6} {world} ranks, rank {rank}: step {r['step_s']:.2f} s (sample {r['sample_s']:.2f}, learn "
                      f"{r['learn_s']:.2f}), params+grads+moments {(r['param_bytes'] + r['grad_bytes'] + r['moment_bytes']) / 2**20:.0f} MiB, "
                      f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
    peak_after = matmul_gflops(torch.float32)
    one = next(r for r in rows if r["world"] == 1)
    state = lambda r: r["param_bytes"] + r["grad_bytes"] + r["moment_bytes"]  # noqa: E731
    summary = {f"{r['strategy']}_{r['world']}": {"state_fraction_of_one_rank": state(r) / state(one), "step_ratio": r["step_s"] / one["step_s"]}
               for r in rows if r["rank"] == 0}
    print(f"matmul fp32 peak {peak:.0f} / {peak_after:.0f} GFLOP/s; per rank state / one rank's: " +
          ", ".join(f"{k} {v['state_fraction_of_one_rank']:.2f}" for k, v in summary.items()))
    if args.save:
        date = datetime.date.today().isoformat()
        RESULTS.mkdir(exist_ok=True)
        record = {"date": date, "command": "python bench/parallel_ranks.py " + " ".join(sys.argv[1:]), "parameters": n_params,
                  "matmul_fp32_gflops": [peak, peak_after], "rows": rows, "summary": summary}
        (RESULTS / f"parallel_ranks_{date}.json").write_text(json.dumps(record, indent=1))
        lines = [f"# Step time and memory per rank, {date}", "", f"`{record['command']}`: W2-shaped Llama ({n_params / 1e6:.1f}M parameters), "
                 f"{PROMPTS} prompts x {GROUP} completions x {NEW} new tokens per step in all, fp32, 2 cores (1 rank x 2 threads or 2 x 1); "
                 f"2048² fp32 matmul {peak:.0f} / {peak_after:.0f} GFLOP/s before / after.", "",
                 "| strategy | ranks | rank | step s | sample s | learn s | params + grads + moments MiB | of one rank's | peak RSS MiB |",
                 "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['strategy']} | {r['world']} | {r['rank']} | {r['step_s']:.2f} | {r['sample_s']:.2f} | {r['learn_s']:.2f} | "
                  f"{state(r) / 2**20:.0f} | {state(r) / state(one):.2f} | {r['peak_rss_bytes'] / 2**20:.0f} |" for r in rows]
        (RESULTS / f"parallel_ranks_{date}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
