"""Builds the built-in base model shipped in `scalerl/models/builtin/` (deterministic, ~20 s on CPU).

A tiny Llama (hidden 128, 4 layers, 4 heads, MLP 512; ~1.06M parameters, ~4.3 MB of fp32
safetensors) with the character tokenizer of `scalerl.models.char_tokenizer`, randomly
initialised from a fixed seed and then warm-started *briefly* with plain next-token loss on noisy
sums from the arithmetic environment's training pool (80 % correct, 20 % a random wrong sum). The
warm-start is stopped early on purpose: the held-out greedy pass rate must sit between 0.15 and
0.5, low enough for RL to show a real gain in a few minutes on a CPU.

    python scripts/build_base_model.py            # rewrites scalerl/models/builtin/
    python scripts/build_base_model.py --eval-every 50 --out /tmp/base   # watch the pass rate

The same seed gives bit-identical weights on the same machine (the script prints their sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scalerl.envs.arithmetic import ArithmeticEnv
from scalerl.models.char_tokenizer import build_char_tokenizer

OUT = Path(__file__).resolve().parents[1] / "scalerl" / "models" / "builtin"
STEPS, BATCH, LR, WARMUP, P_CORRECT = 250, 64, 1e-3, 100, 0.8


def build_model(tokenizer, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=512, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        setattr(model.generation_config, key, getattr(tokenizer, key))
    return model


@torch.no_grad()
def greedy_pass_rate(model, tokenizer, env: ArithmeticEnv) -> float:
    from scalerl.types import Completion

    tasks = env.eval_tasks()
    enc = tokenizer([t.prompt for t in tasks], return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=False, max_new_tokens=8, pad_token_id=tokenizer.pad_token_id)
    total = 0.0
    for task, row in zip(tasks, out[:, enc["input_ids"].shape[1]:].tolist()):
        finished = tokenizer.eos_token_id in row
        ids = row[: row.index(tokenizer.eos_token_id)] if finished else row
        total += env.score(task, Completion(tokenizer.decode(ids), tuple(ids), finished))
    return total / len(tasks)


def noisy_text(task, pool_answers: list[str], rng: random.Random) -> str:
    answer = task.answer if rng.random() < P_CORRECT else rng.choice([a for a in pool_answers if a != task.answer])
    return task.prompt + answer


def warm_start(model, tokenizer, env: ArithmeticEnv, steps: int, seed: int, eval_every: int = 0) -> None:
    rng = random.Random(seed + 1)
    torch.manual_seed(seed + 1)
    pool = env.train_tasks()
    wrong = [str(s) for s in range(0, 2 * env.config.max_operand + 1)]
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    model.train()
    for step in range(1, steps + 1):
        texts = [noisy_text(rng.choice(pool), wrong, rng) for _ in range(BATCH)]
        ids = [tokenizer(t)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
        width = max(map(len, ids))
        input_ids = torch.full((len(ids), width), tokenizer.pad_token_id)
        for r, row in enumerate(ids):  # right padding for training
            input_ids[r, : len(row)] = torch.tensor(row)
        attn = (input_ids != tokenizer.pad_token_id).long()
        loss = model(input_ids=input_ids, attention_mask=attn, labels=input_ids.masked_fill(attn == 0, -100)).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if eval_every and step % eval_every == 0:
            print(json.dumps({"step": step, "loss": round(loss.item(), 4), "pass_rate": greedy_pass_rate(model, tokenizer, env)}), flush=True)
            model.train()
    model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(2)

    tokenizer = build_char_tokenizer()
    env = ArithmeticEnv()
    model = build_model(tokenizer, args.seed)
    warm_start(model, tokenizer, env, args.steps, args.seed, args.eval_every)
    pass_rate = greedy_pass_rate(model, tokenizer, env)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    digest = hashlib.sha256((args.out / "model.safetensors").read_bytes()).hexdigest()
    print(json.dumps({"out": str(args.out), "steps": args.steps, "greedy_pass_rate": pass_rate,
                      "n_params": sum(p.numel() for p in model.parameters()), "safetensors_sha256": digest}))


if __name__ == "__main__":
    main()
