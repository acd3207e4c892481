"""What `forgetting.*` adds to the learner: the SFT anchor's supervised rows, EWC's anchor state, self-distillation's
frozen teacher (`SelfDistill`), and the terms around each optimizer update (`Forgetting`).

    forgetting.data (JSONL of prompt/response, or a save_to_disk dataset folder)
        → AnchorData: prompts through the run's prompt format (chat template), responses + the stop token
        → `batch(step, update, n)`: n rows as a `Rollout` (the learner's forward and `sft_nll`)
        → `EWCState.measure`: the diagonal Fisher at the starting weights, over fisher_batches × batch rows
        → `SelfDistill.backward`: n anchor prompts sampled by the policy, reverse KL to the starting policy on them

The objective terms themselves are pure functions in scalerl/algorithms/forgetting.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from scalerl.algorithms.forgetting import ewc_gradient, ewc_penalty, self_distill_loss, sft_nll
from scalerl.envs.base import conversational_prompt
from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_objects
from scalerl.models.logprobs import CompletionModel
from scalerl.types import Rollout, Task, derive_seed

RESPONSE_KEYS = ("response", "completion")  # TRL's prompt-completion format calls it completion


def conversation_row(messages: object, where: str) -> tuple[str, list[dict[str, str]], str]:
    """A chat row's (prompt text, the messages before the reply, the reply): its last message is the assistant's."""
    if not (isinstance(messages, list) and len(messages) >= 2 and isinstance(messages[-1], dict)
            and messages[-1].get("role") == "assistant" and isinstance(messages[-1].get("content"), str)):
        raise ScaleRLError(f"{where}: 'messages' must end with the assistant's reply ({{\"role\": \"assistant\", \"content\": ...}}) "
                           "after at least one message")
    text, prompt = conversational_prompt(messages[:-1], where)
    return text, prompt, messages[-1]["content"]


def read_anchor_rows(source: Path, where: str = "forgetting.data") -> list[tuple[str, list[dict[str, str]] | None, str]]:
    """(prompt text, its messages or None, response) of each row of a JSONL file or a `save_to_disk` folder: a row has a
    'prompt' (text or messages) and a 'response' (or 'completion'), or 'messages' ending with the assistant's reply.
    `where`: the config key that named the data, for the messages."""
    if source.is_dir():
        return _dataset_rows(source, where)
    rows = []
    for i, row in read_objects(source, expected="'prompt' and 'response'", where=where):
        if "prompt" not in row and isinstance(row.get("messages"), list):
            rows.append(conversation_row(row["messages"], f"{where}: {source}:{i}"))
            continue
        response = next((row[k] for k in RESPONSE_KEYS if k in row), None)
        if "prompt" not in row or not isinstance(response, str):
            raise ScaleRLError(f"{where}: {source}:{i} needs a 'prompt' (text or messages) and a 'response' text, or 'messages' "
                               f"ending with the assistant's reply (it has: {', '.join(row) or 'nothing'})")
        rows.append((*conversational_prompt(row["prompt"], f"{where}: {source}:{i}"), response))
    return rows


def _dataset_rows(folder: Path, where: str) -> list[tuple[str, list[dict[str, str]] | None, str]]:
    try:
        import datasets
    except ImportError:
        raise ScaleRLError(f"{where}: a dataset folder needs the 'datasets' package (pip install 'scalerl[datasets]'), "
                           "or give a JSONL file") from None
    try:
        ds = datasets.load_from_disk(str(folder))
    except FileNotFoundError as err:
        raise ScaleRLError(f"{where}: {folder} is not a save_to_disk folder ({err}); give one, or a JSONL file") from None
    if isinstance(ds, datasets.DatasetDict):
        ds = ds["train"] if "train" in ds else next(iter(ds.values()))
    key = next((k for k in RESPONSE_KEYS if k in ds.column_names), None)
    if "prompt" not in ds.column_names and "messages" in ds.column_names:
        return [conversation_row(m, f"{where}: {folder}") for m in ds["messages"]]
    if "prompt" not in ds.column_names or key is None:
        raise ScaleRLError(f"{where}: {folder} needs 'prompt' and 'response' columns (it has: {', '.join(ds.column_names)})")
    return [(*conversational_prompt(p, f"{where}: {folder}"), r) for p, r in zip(ds["prompt"], ds[key])]


@dataclass
class AnchorData:
    """Tokenised anchor rows; `batch` draws rows without replacement, a pure function of (seed, step, update, rank)."""

    prompts: list[list[int]]
    responses: list[list[int]]  # each ends with the stop token (EOS, or the chat template's end of turn)
    pad_id: int
    seed: int
    rank: int = 0

    @classmethod
    def build(cls, source: Path, encode: Callable[[Task], list[int]], tokenizer: Any, stop_id: int, seed: int,
              rank: int = 0, where: str = "forgetting.data") -> "AnchorData":
        rows = read_anchor_rows(source, where)
        prompts = [encode(Task(text, meta={"messages": messages} if messages else {})) for text, messages, _ in rows]
        responses = [tokenizer(r, add_special_tokens=False)["input_ids"] + [stop_id] for _, _, r in rows]
        return cls(prompts, responses, tokenizer.pad_token_id, seed, rank)

    def __len__(self) -> int:
        return len(self.prompts)

    def batch(self, step: int, update: int, n: int, device: torch.device) -> Rollout:
        """n anchor rows for optimizer update `update` of `step` (different ones on every rank)."""
        gen = torch.Generator().manual_seed(derive_seed(self.seed, "anchor", step, update, self.rank))
        rows = torch.randperm(len(self), generator=gen)[: min(n, len(self))].tolist()
        return self.rollout(rows, device)

    def rollout(self, rows: list[int], device: torch.device) -> Rollout:
        """The rows as a Rollout: prompts left-padded, responses right-padded, the mask on every response token."""
        P = max(len(self.prompts[i]) for i in rows)
        T = max(len(self.responses[i]) for i in rows)
        prompt_ids = torch.full((len(rows), P), self.pad_id, dtype=torch.long)
        prompt_mask = torch.zeros((len(rows), P), dtype=torch.long)
        completion_ids = torch.full((len(rows), T), self.pad_id, dtype=torch.long)
        completion_mask = torch.zeros((len(rows), T), dtype=torch.long)
        for r, i in enumerate(rows):
            p, c = self.prompts[i], self.responses[i]
            prompt_ids[r, P - len(p):], prompt_mask[r, P - len(p):] = torch.tensor(p), 1
            completion_ids[r, : len(c)], completion_mask[r, : len(c)] = torch.tensor(c), 1
        return Rollout(prompt_ids=prompt_ids.to(device), prompt_mask=prompt_mask.to(device), completion_ids=completion_ids.to(device),
                       completion_mask=completion_mask.to(device), sampler_logprobs=torch.zeros((len(rows), T), device=device),
                       truncated=torch.zeros(len(rows), dtype=torch.bool, device=device),
                       group_ids=torch.arange(len(rows), device=device))


@dataclass
class SelfDistill:
    """forgetting.self_distill: the frozen starting policy π_0 as the teacher of the policy's own samples of anchor prompts
    (scalerl/algorithms/forgetting.py: self_distill_loss). The samples are drawn by the policy's plain module with Hugging
    Face `generate` (a few short rows per update), per-update seeds (run seed, update, rank), at the sampling temperature."""

    teacher: CompletionModel  # π_0: a frozen copy of the policy taken before the first update
    policy: torch.nn.Module  # the plain Hugging Face policy, to sample from (no gradient sync, no grad)
    rows: int
    weight: float
    max_new_tokens: int
    temperature: float
    stop_ids: list[int]

    @torch.no_grad()
    def sample(self, anchor: AnchorData, update: int, device: torch.device) -> Rollout:
        """`rows` anchor prompts of update `update` (a function of the run seed, the update and the rank) with one
        completion each from the policy: the completion ends at its first stop token (mask 1 up to it)."""
        gen = torch.Generator().manual_seed(derive_seed(anchor.seed, "self_distill", update, anchor.rank))
        picked = torch.randperm(len(anchor), generator=gen)[: min(self.rows, len(anchor))].tolist()
        prompts = anchor.rollout(picked, device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(derive_seed(anchor.seed, "self_distill_draws", update, anchor.rank))
            out = self.policy.generate(input_ids=prompts.prompt_ids, attention_mask=prompts.prompt_mask, do_sample=True,
                                       temperature=self.temperature, top_k=0, top_p=1.0, max_new_tokens=self.max_new_tokens,
                                       eos_token_id=self.stop_ids, pad_token_id=anchor.pad_id)
        completion = out[:, prompts.prompt_ids.shape[1]:]  # (B, T)
        stop = torch.isin(completion, torch.tensor(self.stop_ids, device=completion.device)).long()
        mask = ((stop.cumsum(1) - stop) == 0).long()  # up to and including the first stop token
        return Rollout(prompt_ids=prompts.prompt_ids, prompt_mask=prompts.prompt_mask, completion_ids=completion * mask + anchor.pad_id * (1 - mask),
                       completion_mask=mask, sampler_logprobs=torch.zeros(mask.shape, device=device),
                       truncated=stop.sum(1) == 0, group_ids=prompts.group_ids)

    def backward(self, anchor: AnchorData, policy_forward: torch.nn.Module, update: int, autocast: Callable, fp32_head: bool,
                 ctx: Any, loss_scale: float) -> dict[str, float]:
        batch = self.sample(anchor, update, ctx.device)
        tokens = ctx.sum(batch.completion_mask.sum().double().reshape(1)).item()
        with torch.no_grad(), autocast():
            teacher = self.teacher(batch, temperature=self.temperature, fp32_head=fp32_head).logprobs.float()
        with autocast():
            student = policy_forward(batch, temperature=self.temperature, fp32_head=fp32_head).logprobs.float()
        loss, kl = self_distill_loss(student, teacher, batch.completion_mask, normalizer=tokens)
        (self.weight * loss_scale * loss).backward()
        return {"self_distill/reverse_kl": ctx.sum(kl.double().reshape(1)).item()}  # the anchor tokens' mean, all ranks


@dataclass
class EWCState:
    """θ* and the diagonal Fisher F of every trained tensor, in the parameters' order; checkpointed with the run
    (`state_dict`: plain name → tensor, which DCP saves beside the weights). Every rank holds all of it (EWC runs
    with the strategies that replicate the weights: none, ddp, dynamic)."""

    names: list[str]
    anchors: list[torch.Tensor]
    fisher: list[torch.Tensor]
    lam: float

    @classmethod
    def zeros(cls, named_params: list[tuple[str, torch.Tensor]], lam: float) -> "EWCState":
        """θ* = the current weights, F = 0 (filled by `measure`, or by a checkpoint's on resume)."""
        return cls([n for n, _ in named_params], [p.detach().clone() for _, p in named_params],
                   [torch.zeros_like(p, dtype=torch.float32) for _, p in named_params], lam)

    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.anchors, *self.fisher))

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"anchor": dict(zip(self.names, self.anchors)), "fisher": dict(zip(self.names, self.fisher))}


class Forgetting:
    """The learner's forgetting terms around each optimizer update (scalerl/learner/learner.py):

        before the micro-batches: the SFT anchor's rows, forward + backward of `sft_weight · sft_nll`, and
                                   self-distillation's sampled anchor prompts, of `weight · self_distill_loss`
                                   (no gradient sync: the update's last micro-batch sums everything)
        after the gradient sum:    EWC's gradient 2 λ F (θ − θ*) added to every trained tensor (the same
                                   on every rank, so it is added after the sum, not summed over ranks)
    """

    def __init__(self, *, anchor: AnchorData, rows: int, sft_weight: float, ewc: EWCState | None, params: list[torch.Tensor],
                 ctx: Any, fisher_rows: int, fisher_batches: int, self_distill: SelfDistill | None = None):
        """`rows`: anchor rows per update (0: no SFT anchor); `params`: the policy's trained tensors, in EWC's order;
        `self_distill`: the starting policy as the teacher on sampled anchor prompts (None: off)."""
        self.anchor, self.rows, self.sft_weight, self.ewc, self.params, self.ctx = anchor, rows, sft_weight, ewc, params, ctx
        self.fisher_rows, self.fisher_batches = fisher_rows, fisher_batches
        self.self_distill = self_distill

    def anchor_backward(self, policy_forward: torch.nn.Module, update: int, autocast: Callable, fp32_head: bool,
                        loss_scale: float = 1.0) -> dict[str, float]:
        """The terms on anchor rows before an update's micro-batches: the SFT anchor's NLL and self-distillation's reverse KL."""
        stats = self.sft_backward(policy_forward, update, autocast, fp32_head, loss_scale)
        if self.self_distill is not None:
            stats.update(self.self_distill.backward(self.anchor, policy_forward, update, autocast, fp32_head, self.ctx, loss_scale))
        return stats

    def sft_backward(self, policy_forward: torch.nn.Module, update: int, autocast: Callable, fp32_head: bool,
                     loss_scale: float = 1.0) -> dict[str, float]:
        """The anchor's NLL for update number `update` (its rows: a function of the run seed, `update` and the rank);
        its backward carries the learner's `loss_scale` (fp16) like the RL loss's."""
        if self.rows == 0:
            return {}
        batch = self.anchor.batch(0, update, self.rows, self.ctx.device)
        tokens = self.ctx.sum(batch.completion_mask.sum().double().reshape(1)).item()
        with autocast():
            logprobs = policy_forward(batch, fp32_head=fp32_head).logprobs.float()
        nll = sft_nll(logprobs, batch.completion_mask, normalizer=tokens)
        (self.sft_weight * loss_scale * nll).backward()
        return {"sft/loss": self.ctx.sum(nll.detach().double().reshape(1)).item()}  # the anchor tokens' mean NLL, all ranks

    @torch.no_grad()
    def ewc_gradients(self) -> dict[str, float]:
        if self.ewc is None:
            return {}
        for p, a, f in zip(self.params, self.ewc.anchors, self.ewc.fisher):
            if p.grad is not None:
                p.grad.add_(ewc_gradient(p, a, f, lam=self.ewc.lam))
        return {"ewc/loss": ewc_penalty(self.params, self.ewc.anchors, self.ewc.fisher, lam=self.ewc.lam).item()}

    def measure_fisher(self, model: torch.nn.Module, autocast: Callable, fp32_head: bool) -> int:
        """F_i = (1/N) Σ_n (∂ log π_θ*(y_n | x_n) / ∂θ_i)² over N anchor rows (`fisher_batches` × `fisher_rows` per rank, then
        every rank's), at the starting weights θ*: one backward per row through `model` (the plain module: no
        gradient sync), the gradients cleared after. Returns N."""
        for f in self.ewc.fisher:
            f.zero_()
        count = 0
        for b in range(self.fisher_batches):
            batch = self.anchor.batch(-1, b, self.fisher_rows, self.ctx.device)  # step -1: draws of their own
            for i in range(len(batch)):
                row = batch.select(slice(i, i + 1))
                with autocast():
                    logprobs = model(row, fp32_head=fp32_head).logprobs.float()
                (logprobs * row.completion_mask).sum().backward()
                with torch.no_grad():
                    for p, f in zip(self.params, self.ewc.fisher):
                        if p.grad is not None:
                            f.add_(p.grad.float().square())
                        p.grad = None
                count += 1
        total = self.ctx.sum(torch.tensor([float(count)], dtype=torch.float64)).item()
        for f in self.ewc.fisher:
            f.copy_(self.ctx.sum(f) / total)
        return int(total)
