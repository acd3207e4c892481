"""Reward models: a scalar head on any Hugging Face model, trained on preference pairs with the
Bradley–Terry loss, and scored as the reward of an RL job.

    pairs (JSONL prompt/chosen/rejected) → encode_pairs → AutoModelForSequenceClassification
      (num_labels=1) → r(prompt + completion + EOS) → bradley_terry_loss → AdamW

Encoding, the same in training and scoring (`encode_pairs`): the text `prompt + completion` goes
through the model's own tokenizer (with its special tokens, e.g. BOS), the EOS id is appended for
a finished completion (a finished answer and the same digits cut off mid-way are different
things), rows are right-padded. The score is read by transformers' own pooling, which takes the
hidden state of the rightmost token that is not `pad_token_id` (that works for either padding
side; right padding also keeps position ids unchanged), so the saved folder gives the same scores
to anyone who loads it with `AutoModelForSequenceClassification`. Caveat: a tokenizer without a
pad token gets pad = EOS, and then the pooled token is the last one before the EOS (finished and
cut-off completions then score alike).

Optimisation: AdamW, linear warm-up over the first 10 % of steps then cosine decay to 0, and
gradient-norm clipping. On the shipped set a constant rate made held-out accuracy swing by several
points from epoch to epoch; the decay lets the last epoch be the one that is saved.

Left out on purpose: a margin term (Llama 2), a reward-centering auxiliary loss, several
completions per prompt (the K-choose-2 pairs of Ouyang et al.).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_objects
from scalerl.models.paths import resolve_model_path
from scalerl.rewards.rm_config import RewardModelTrainConfig

Normalize = Literal["none", "sigmoid", "batch"]


@dataclass(frozen=True)
class Preference:
    prompt: str
    chosen: str
    rejected: str


def load_preferences(path: Path | str) -> list[Preference]:
    """Pairs from a JSONL file with string fields `prompt`, `chosen`, `rejected` (others ignored)."""
    pairs = []
    for i, row in read_objects(path, expected="string 'prompt', 'chosen' and 'rejected'"):
        for key in ("prompt", "chosen", "rejected"):
            if not isinstance(row.get(key), str):
                problem = "missing" if key not in row else f"not a string ({row[key]!r})"
                raise ScaleRLError(f"{path}:{i}: '{key}' is {problem}; each line needs string 'prompt', 'chosen' and 'rejected'")
        pairs.append(Preference(row["prompt"], row["chosen"], row["rejected"]))
    return pairs

def bradley_terry_loss(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Pairwise loss on the scalar rewards (B,) of the chosen and rejected completion of B prompts:

        L = −(1/B) Σ_i log σ(r_c,i − r_r,i)

    the negative log-likelihood of the preferences under the Bradley–Terry model (Bradley & Terry,
    1952), as in Ouyang et al. (2022), eq. 1, with one comparison per prompt. `logsigmoid` keeps it
    finite for large margins. Stats (detached): accuracy = mean(r_c > r_r) (a tie counts as wrong),
    margin = mean(r_c − r_r).
    """
    diff = chosen_scores - rejected_scores  # (B,)
    loss = -F.logsigmoid(diff).mean()
    with torch.no_grad():
        stats = {"accuracy": (diff > 0).float().mean(), "margin": diff.mean()}
    return loss, stats


def load_reward_model(path: str, device: torch.device | str = "cpu") -> tuple[torch.nn.Module, object]:
    """(model, tokenizer): a one-logit sequence classifier from a causal-LM folder (the score head is
    new) or from a saved reward model. 'builtin' is the package's tiny model. No remote code runs."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    source = resolve_model_path(path, "model")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1, dtype=torch.float32, trust_remote_code=False)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise ScaleRLError(f"model: cannot load a reward model from {source} ({first})") from None
    if tokenizer.eos_token_id is None:
        raise ScaleRLError(f"model: the tokenizer of {source} defines no eos_token; a finished completion could not be marked")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # decoder-only models often ship without a pad token
    # Decoder-only classifiers pool the rightmost non-pad token; without pad_token_id they refuse batches.
    model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device), tokenizer


def encode_pairs(
    tokenizer, prompts: list[str], completions: list[str], *, max_length: int, finished: list[bool] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (N, T): `prompt + completion` with the tokenizer's special
    tokens, EOS appended where `finished` (default: all), right-padded with pad_token_id. A row
    longer than max_length keeps its last max_length tokens: the completion is what is judged."""
    finished = [True] * len(prompts) if finished is None else finished
    if not len(prompts) == len(completions) == len(finished):
        raise ValueError(f"got {len(prompts)} prompts, {len(completions)} completions, {len(finished)} finished flags")
    texts = [p + c for p, c in zip(prompts, completions)]
    rows = tokenizer(texts, add_special_tokens=True)["input_ids"]
    rows = [(row + [tokenizer.eos_token_id] if done else row)[-max_length:] for row, done in zip(rows, finished)]
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)  # (N, T)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # (N, T)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, : len(row)] = 1
    return input_ids, attention_mask


def sequence_scores(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(N,) float32 rewards: the one logit at each row's last non-pad token."""
    device = next(model.parameters()).device
    out = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False)
    return out.logits[:, 0].float()  # (N, 1) -> (N,)


@torch.no_grad()
def score_texts(
    model: torch.nn.Module, tokenizer, prompts: list[str], completions: list[str], *,
    batch_size: int, max_length: int, finished: list[bool] | None = None,
) -> torch.Tensor:
    """(N,) float32 rewards on the CPU, in batches, without gradients (callers set eval mode)."""
    finished = [True] * len(prompts) if finished is None else finished
    out = []
    for start in range(0, len(prompts), batch_size):
        window = slice(start, start + batch_size)
        ids, mask = encode_pairs(tokenizer, prompts[window], completions[window], max_length=max_length, finished=finished[window])
        out.append(sequence_scores(model, ids, mask).cpu())
    return torch.cat(out) if out else torch.zeros(0)


class RewardModelScorer:
    """The reward of an RL job from a trained reward model: r_i = RM(prompt_i + completion_i + EOS).

    normalize: "none" (the raw logit), "sigmoid" (σ(r), the Bradley–Terry probability of beating a
    completion of score 0, in (0, 1)), or "batch" ((r − mean) / std over the scored batch).
    """

    def __init__(self, path: str, device: torch.device | str = "cpu", batch_size: int = 64,
                 normalize: Normalize = "none", max_length: int = 512):
        if normalize not in ("none", "sigmoid", "batch"):
            raise ValueError(f"unknown reward normalization {normalize!r}; use none, sigmoid or batch")
        self.model, self.tokenizer = load_reward_model(path, device)
        self.model.eval()
        self.batch_size, self.normalize, self.max_length = batch_size, normalize, max_length

    def score(self, prompts: list[str], completions: list[str], finished: list[bool] | None = None) -> torch.Tensor:
        """(N,) float32 rewards on the CPU. `finished[i]` False (cut off at max_new_tokens) leaves out the EOS."""
        raw = score_texts(self.model, self.tokenizer, prompts, completions, batch_size=self.batch_size,
                          max_length=self.max_length, finished=finished)
        match self.normalize:
            case "none":
                return raw
            case "sigmoid":
                return torch.sigmoid(raw)
            case "batch":
                return (raw - raw.mean()) / (raw.std(unbiased=False) + 1e-6)


def pairwise_accuracy(model: torch.nn.Module, tokenizer, pairs: list[Preference], *, batch_size: int, max_length: int) -> float | None:
    """Share of pairs whose chosen completion scores strictly higher; None without pairs."""
    if not pairs:
        return None
    was_training = model.training
    model.eval()
    prompts = [p.prompt for p in pairs]
    chosen = score_texts(model, tokenizer, prompts, [p.chosen for p in pairs], batch_size=batch_size, max_length=max_length)
    rejected = score_texts(model, tokenizer, prompts, [p.rejected for p in pairs], batch_size=batch_size, max_length=max_length)
    model.train(was_training)
    return int((chosen > rejected).sum()) / len(pairs)


def split_pairs(pairs: list[Preference], eval_fraction: float, seed: int) -> tuple[list[Preference], list[Preference]]:
    """(train, eval): a seeded shuffle, the first ceil(eval_fraction·N) pairs held out."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    n_eval = math.ceil(eval_fraction * len(pairs))
    if n_eval >= len(pairs):
        raise ScaleRLError(f"eval_fraction={eval_fraction} leaves no training pairs out of {len(pairs)}; lower it")
    return [pairs[i] for i in order[n_eval:]], [pairs[i] for i in order[:n_eval]]


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Fail before training, not after, when the result could not be saved."""
    if out.exists() and not out.is_dir():
        raise ScaleRLError(f"out: {out} is a file; give a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ScaleRLError(f"out: {out} exists and is not empty; pass --overwrite or choose another --out")


def save_reward_model(out: Path, model: torch.nn.Module, tokenizer, summary: dict) -> None:
    """Write into `<out>.tmp`, then swap it in with a rename: `out` never holds half a model."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)


def _device(preference: str) -> torch.device:
    if preference == "cuda" and not torch.cuda.is_available():
        raise ScaleRLError("device=cuda but no CUDA GPU is visible; use device=cpu (or auto)")
    return torch.device("cuda" if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()) else "cpu")


def warmup_cosine(total_steps: int, warmup_fraction: float = 0.1):
    """LambdaLR factor: linear from 1/W to 1 over W = ceil(warmup_fraction·total) steps, then cosine to 0."""
    warmup = max(1, math.ceil(warmup_fraction * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(step - warmup, total_steps - warmup) / max(1, total_steps - warmup)))

    return factor


def train_epoch(model: torch.nn.Module, tokenizer, opt: torch.optim.Optimizer, pairs: list[Preference], *,
                batch_size: int, max_length: int, scheduler=None, max_grad_norm: float | None = None) -> dict[str, float]:
    """One pass over `pairs` in the given order; means of loss, accuracy and margin over pairs."""
    model.train()
    sums = {"loss": 0.0, "accuracy": 0.0, "margin": 0.0}
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        b = len(batch)
        # Chosen and rejected share one forward of 2b rows: rows 0..b-1 chosen, b..2b-1 rejected.
        ids, mask = encode_pairs(tokenizer, [p.prompt for p in batch] * 2, [p.chosen for p in batch] + [p.rejected for p in batch],
                                 max_length=max_length)  # (2b, T)
        scores = sequence_scores(model, ids, mask)  # (2b,)
        loss, stats = bradley_terry_loss(scores[:b], scores[b:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
        if scheduler is not None:
            scheduler.step()
        for key, value in (("loss", loss.detach()), *stats.items()):
            sums[key] += float(value) * b  # weighted by pairs: the last batch may be short
    return {key: total / len(pairs) for key, total in sums.items()}


def train_reward_model(config: RewardModelTrainConfig, *, overwrite: bool = False, log=print) -> dict:
    """Train on `config.data`, save model + tokenizer + summary.json to `config.out`, return the summary."""
    t0 = time.perf_counter()
    check_out_dir(config.out, overwrite)
    if config.threads:
        torch.set_num_threads(config.threads)
    random.seed(config.seed)
    torch.manual_seed(config.seed)  # also the score head's initialisation
    train_pairs, eval_pairs = split_pairs(load_preferences(config.data), config.eval_fraction, config.seed)
    model, tokenizer = load_reward_model(config.model, _device(config.device))
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(config.epochs * math.ceil(len(train_pairs) / config.batch_size)))

    def evaluate() -> float | None:
        return pairwise_accuracy(model, tokenizer, eval_pairs, batch_size=max(config.batch_size, 64), max_length=config.max_length)

    acc_before = evaluate()
    log(f"reward model on {config.model}: {len(train_pairs)} training pairs, {len(eval_pairs)} held out; "
        f"held-out accuracy before {_fmt(acc_before)}")
    rng, history = random.Random(config.seed + 1), []
    for epoch in range(1, config.epochs + 1):
        shuffled = rng.sample(train_pairs, len(train_pairs))
        stats = train_epoch(model, tokenizer, opt, shuffled, batch_size=config.batch_size, max_length=config.max_length,
                            scheduler=scheduler, max_grad_norm=config.max_grad_norm)
        history.append({"epoch": epoch, **stats, "eval_accuracy": evaluate()})
        log(f"epoch {epoch}/{config.epochs}  loss {stats['loss']:.4f}  train acc {stats['accuracy']:.3f}  "
            f"margin {stats['margin']:.2f}  held-out acc {_fmt(history[-1]['eval_accuracy'])}")
    model.eval()
    summary = {
        "model": config.model, "data": str(config.data), "train_pairs": len(train_pairs), "eval_pairs": len(eval_pairs),
        "eval_accuracy_before": acc_before, "eval_accuracy_after": history[-1]["eval_accuracy"],
        "history": history, "train_time_s": round(time.perf_counter() - t0, 2), "config": config.model_dump(mode="json"),
    }
    save_reward_model(config.out, model, tokenizer, summary)
    log(f"held-out accuracy {_fmt(acc_before)} -> {_fmt(summary['eval_accuracy_after'])}, "
        f"{summary['train_time_s']:.1f} s; saved to {config.out}")
    return summary


def _fmt(acc: float | None) -> str:
    return "n/a" if acc is None else f"{acc:.3f}"
