"""Host memory and time of one generation with a long prompt on the HF engine's static KV cache.

W2's model (hidden 512, 8 layers, MLP 1536, 8 heads; `--kv-heads 2` for grouped-query attention), random weights, fp32,
`--prompts` prompts of `--prompt-len` tokens x `--n` completions of `--new` tokens (EOS masked: every row decodes all of
them). Each measurement is a process of its own: the peak RSS during the generation above the RSS before it
(`ru_maxrss` against the resident size after a warm-up generation of 1 prompt), and the generation's seconds, printed as
one JSON line. Run it on two checkouts (PYTHONPATH) to compare them.

    python bench/prefill_memory.py [--prompts 16] [--n 8] [--prompt-len 480] [--new 32] [--kv-heads 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import psutil
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scalerl.rollout.hf import HFSampler
from scalerl.types import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=480)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=20, max_position_embeddings=args.prompt_len + args.new + 16, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=args.kv_heads, intermediate_size=1536)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()
    sampler = HFSampler(model, pad_id=0, eos_id=2, device=torch.device("cpu"), decode="auto")
    gen = torch.Generator().manual_seed(1)
    prompts = [[1, *torch.randint(4, 20, (args.prompt_len - 1,), generator=gen).tolist()] for _ in range(args.prompts)]
    params = SamplingParams(max_new_tokens=args.new, min_new_tokens=args.new, temperature=1.0, n=args.n)
    sampler.sample(prompts[:1], SamplingParams(max_new_tokens=4, temperature=1.0, n=1), seeds=[0])  # warm-up: lazy inits
    before = psutil.Process().memory_info().rss
    start = time.perf_counter()
    out = sampler.sample(prompts, params, seeds=list(range(args.prompts)))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    kv = 2 * config.num_hidden_layers * args.prompts * args.n * (args.prompt_len + args.new) * args.kv_heads * 64 * 4
    print(json.dumps({"rows": args.prompts * args.n, "prompt_len": args.prompt_len, "new": args.new, "kv_heads": args.kv_heads,
                      "peak_above_start_mb": round((peak - before) / 2**20, 1), "kv_cache_mb": round(kv / 2**20, 1),
                      "seconds": round(seconds, 3), "tokens": int(out.completion_mask.sum())}))


if __name__ == "__main__":
    main()
