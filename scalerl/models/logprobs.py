"""Per-token log-probabilities of completions under a causal LM (the policy or the reference)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scalerl.config.plan import chunk_positions
from scalerl.models.chunked_logprobs import chunked_logprobs
from scalerl.types import Rollout


@dataclass
class CompletionForward:
    logprobs: torch.Tensor  # (B, T) log π(y_t | x, y_<t)
    entropy: torch.Tensor | None = None  # (B, T) entropy of π(· | x, y_<t), with grad
    hidden: torch.Tensor | None = None  # (B, T, H) last hidden state at the positions that predict y_t


def completion_forward(
    model: torch.nn.Module, batch: Rollout, *, temperature: float = 1.0, fp32_head: bool = True,
    with_entropy: bool = False, with_hidden: bool = False, layout: str = "auto", chunk_tokens: int | None = 0,
    segments: torch.Tensor | None = None,
) -> CompletionForward:
    """One forward pass over prompt + completion, keeping only what predicts the completion.

    Logits are divided by the sampling temperature so that the ratio to the sampler's log-probs
    compares like with like. With `fp32_head` the LM head's matmul and the softmax run in float32
    whatever the compute dtype (the ScaleRL recipe's FP32 LM head; free for fp32 models): under
    autocast or with low-precision weights the decoder's last hidden state goes through a float32
    copy of the head outside autocast. Only the T + 1 last positions get logits: the prompt's own
    next-token predictions are never needed.

    `layout` "auto" takes the cheapest of three that give the same numbers on real tokens (`_layout`;
    at padding the values differ and mean nothing). "full" runs prompt + completion of every row.
    "shared": rows that repeat the row before them's prompt (a GRPO group) run that prompt once: the
    decoder runs the distinct prompts with a KV cache, the cache is indexed out to every row
    (gradients flow back through the index, summing over the group), and the completions run on it.
    Exact up to float rounding; it saves (n − 1)/n of the prompt positions' forward and backward.

    "packed" (`_packed_hidden`, sdpa or eager attention): each group becomes one sequence, its prompt's
    real tokens followed by the real tokens of each of its completions but the last (which predicts nothing
    and which nothing attends to), with a block mask (a token sees the prompt and the earlier tokens of its
    own completion) and each completion's positions continuing the prompt's. No padding is computed and the
    decoder runs once. Its attention costs (group length)²,
    so `_layout` takes it only where the FLOP count of the packed batch is below that of the padded one.
    Models with soft-capped logits take the full path; gradient checkpointing (no cache in training)
    takes the full or the packed path.

    `chunk_tokens` (train.logprob_chunk_tokens; None: auto, 0: never): when the batch has more completion
    positions than a chunk (`chunk_positions`), log-probs and entropy come from the final hidden states chunk
    by chunk (scalerl/models/chunked_logprobs.py): the (B, T, V) logits never exist whole, and the backward
    recomputes each chunk's. Same numbers up to rounding. Not for soft-capped logits, nor a low-precision head
    without `fp32_head` (those keep the logits whole).

    `segments` (B, P+T) long, for rows that hold several examples one after the other (`scalerl sft`'s
    packing): the example each position belongs to (−1 at padding). Each token then attends only to the
    earlier tokens of its own example and positions restart at 0 with each (`_segment_hidden`), so a
    packed row gives the numbers of its examples run alone.
    """
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (B, P+T)
    mask = batch.attention_mask()  # (B, P+T); a multi-turn episode's observations are context too
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    T = batch.completion_ids.shape[1]
    layout = "segments" if segments is not None else _layout(model, batch) if layout == "auto" else layout
    chunk = _chunk(model, batch, chunk_tokens, fp32_head)
    if layout == "segments":
        last = _segment_hidden(model, ids, segments)[:, -(T + 1):-1]  # (B, T, H)
    elif layout == "packed":
        last = _packed_hidden(model, batch)  # (B, T, H)
    elif layout == "shared":
        last = _shared_prompt_hidden(model, batch, mask, positions, prompt_groups(batch))  # (B, T, H)
    elif chunk or (fp32_head and head_not_fp32(model, ids.device.type)):
        out = model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        last = out.last_hidden_state[:, -(T + 1):-1]  # (B, T, H) after the final norm
    else:  # the model's own head (and its soft-capping, if any)
        last = None
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, logits_to_keep=T + 1,
                    output_hidden_states=with_hidden)
        logits = out.logits[:, :-1]  # (B, T, V): position P-1+t predicts completion token t
        logits = logits.float() if fp32_head else logits
        hidden = out.hidden_states[-1][:, -(T + 1):-1] if with_hidden else None  # (B, T, H)
    if chunk:
        head = model.get_output_embeddings()
        logprobs, entropy = chunked_logprobs(last, head.weight, head.bias, batch.completion_ids, temperature=temperature, chunk=chunk,
                                             dtype=_head_dtype(model, last.device.type), with_entropy=with_entropy)
        return CompletionForward(logprobs, entropy, last if with_hidden else None)
    if last is not None:
        logits, hidden = head_logits(model, last, fp32_head), last if with_hidden else None
    logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)  # (B, T)
    logprobs = logits.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1) - log_norm  # (B, T)
    entropy = log_norm - (torch.softmax(logits, dim=-1) * logits).sum(-1) if with_entropy else None  # H = logZ − Σ p·z
    return CompletionForward(logprobs, entropy, hidden)


def _head_dtype(model: torch.nn.Module, device_type: str) -> torch.dtype:
    """The dtype the chunked head computes in: float32 for a head that would multiply in less (the FP32 LM
    head), else the head's own (float32, or float64 in the exactness tests)."""
    return torch.float32 if _low_head(model, device_type) else model.get_output_embeddings().weight.dtype


def _low_head(model: torch.nn.Module, device_type: str) -> bool:
    """Whether the LM head would multiply in less than float32 (autocast, or bf16/fp16 weights)."""
    return torch.is_autocast_enabled(device_type) or model.get_output_embeddings().weight.dtype in (torch.bfloat16, torch.float16)


def _chunk(model: torch.nn.Module, batch: Rollout, setting: int | None, fp32_head: bool) -> int:
    """Positions per chunk for the chunked head, or 0 for the whole logits: no chunking asked, the batch's
    positions fit in one chunk (then recomputing would buy nothing), soft-capped logits, or a low-precision head
    whose logits are asked in its own dtype."""
    head = model.get_output_embeddings()
    if head is None or getattr(model.config, "final_logit_softcapping", None):
        return 0
    chunk = chunk_positions(setting, head.weight.shape[0])
    if not chunk or batch.completion_ids.numel() <= chunk:
        return 0
    return chunk if fp32_head or not _low_head(model, batch.completion_ids.device.type) else 0


def prompt_groups(batch: Rollout) -> torch.Tensor | None:
    """(B,) index of each row's prompt among the batch's runs of identical consecutive prompts (row i
    repeats row i−1's prompt and mask), or None when no row repeats the one before it."""
    ids, mask = batch.prompt_ids, batch.prompt_mask
    if len(ids) < 2:
        return None
    repeats = (ids[1:] == ids[:-1]).all(1) & (mask[1:] == mask[:-1]).all(1)  # (B−1,)
    if not bool(repeats.any()):
        return None
    starts = torch.cat([torch.ones(1, dtype=torch.bool, device=ids.device), ~repeats])
    return starts.long().cumsum(0) - 1


# A decoder layer call's fixed cost in FLOP terms. Measured on the W1 benchmark (bench/scalerl_grpo.py,
# 1M-parameter Llama, 2 CPU threads, cProfile): "shared" took 10.9 ms of forward against "packed"'s 7.6 ms
# for about the same FLOPs, i.e. ~0.8 ms per extra layer call, ~1.7e8 FLOP at the ~205 GFLOP/s its matmuls reach.
CALL_FLOPS = 2e8


def _layout(model: torch.nn.Module, batch: Rollout) -> str:
    """"packed", "shared" or "full": the cheapest of the layouts this model and batch allow.

    Per layer a position costs 2·(2h² + 2h·kv + 3h·m) FLOPs in its projections and MLP (h hidden, kv
    the key/value width, m the MLP width), a (query, key) pair 4·h in attention (every layout's attention
    runs over its whole mask: a custom mask gets no causal skipping), and each decoder call CALL_FLOPS
    for its fixed per-operator cost ("shared" makes two calls): on small models, which are overhead-bound,
    the calls decide; on large ones the FLOPs do."""
    if model.get_output_embeddings() is None or getattr(model.config, "final_logit_softcapping", None):
        return "full"
    groups = prompt_groups(batch)
    shared = groups is not None and _can_share(model)
    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", "eager") or not _prefix_extent(batch):
        return "shared" if shared else "full"
    B, P = batch.prompt_ids.shape
    T = batch.completion_ids.shape[1]
    U = int(groups[-1]) + 1 if groups is not None else B
    S = int(_group_lengths(batch, groups).max())
    cfg = model.config
    h, heads = cfg.hidden_size, getattr(cfg, "num_attention_heads", 1)
    kv = (getattr(cfg, "num_key_value_heads", None) or heads) * (getattr(cfg, "head_dim", None) or h // heads)
    m = getattr(cfg, "intermediate_size", None) or 4 * h
    per_position, per_pair = 2 * (2 * h * h + 2 * h * kv + 3 * h * m), 4 * h
    packed = CALL_FLOPS + U * S * per_position + U * S * S * per_pair
    padded = (2 * CALL_FLOPS + U * P * per_position + U * P * P * per_pair + B * T * per_position + B * T * (P + T) * per_pair if shared
              else CALL_FLOPS + B * (P + T) * per_position + B * (P + T) ** 2 * per_pair)
    return "packed" if packed < padded else "shared" if shared else "full"


def _prefix_extent(batch: Rollout) -> bool:
    """Whether every row's real completion-side tokens are a prefix (no hole before its padding) and every
    prompt has a token (the one that predicts the first completion token)."""
    ext = batch.completion_extent()
    prefix = (ext == (torch.arange(ext.shape[1], device=ext.device) < ext.sum(1, keepdim=True))).all()
    return bool(prefix) and bool((batch.prompt_mask.sum(1) > 0).all())


def _inputs(batch: Rollout) -> torch.Tensor:
    """(B,) long: the completion-side tokens of each row that the packed layout runs: all real ones but the last, which
    predicts nothing and which no later token of its row attends to."""
    return (batch.completion_extent().sum(1) - 1).clamp(min=0)


def _group_lengths(batch: Rollout, groups: torch.Tensor | None) -> torch.Tensor:
    """(U,) long: each group's packed length, its prompt's real tokens plus its completions' tokens that are run
    (`_inputs`)."""
    lengths = _inputs(batch)  # (B,)
    if groups is None:
        return batch.prompt_mask.sum(1) + lengths
    first = _group_starts(groups)
    return batch.prompt_mask[first].sum(1) + torch.zeros(len(first), dtype=lengths.dtype, device=lengths.device).index_add_(0, groups, lengths)


def _group_starts(groups: torch.Tensor) -> torch.Tensor:
    """(U,) the first row of each run of `groups` (B,)."""
    return torch.cat([torch.zeros(1, dtype=torch.long, device=groups.device), (groups[1:] != groups[:-1]).nonzero().squeeze(1) + 1])


def _packed_hidden(model: torch.nn.Module, batch: Rollout) -> torch.Tensor:
    """(B, T, H) final hidden states at the positions that predict each completion token (zeros at
    padding), from one decoder pass over the packed groups (see `completion_forward`)."""
    B, P = batch.prompt_ids.shape
    T = batch.completion_ids.shape[1]
    dev = batch.prompt_ids.device
    groups = prompt_groups(batch)
    groups = torch.arange(B, device=dev) if groups is None else groups
    first = _group_starts(groups)  # (U,)
    U, S = len(first), int(_group_lengths(batch, groups).max())
    prompt_len = batch.prompt_mask[first].sum(1)  # (U,)
    lengths = _inputs(batch)  # (B,) tokens run per row: all but the last
    before = lengths.cumsum(0) - lengths  # completion tokens run of the rows before each row
    start = prompt_len[groups] + before - before[first][groups]  # (B,) where each row's completion begins
    ids = torch.full((U, S), 0, dtype=torch.long, device=dev)
    positions = torch.zeros((U, S), dtype=torch.long, device=dev)
    segment = torch.full((U, S), -1, dtype=torch.long, device=dev)  # 0 the prompt, b + 1 row b's completion
    u, col = batch.prompt_mask[first].nonzero(as_tuple=True)  # left padded: real tokens end at column P − 1
    dest = col - (P - prompt_len[u])
    ids[u, dest], positions[u, dest], segment[u, dest] = batch.prompt_ids[first][u, col], dest, 0
    b, t = batch.completion_extent().nonzero(as_tuple=True)  # every real token, to be predicted
    ub, dest = groups[b], start[b] + t
    run = t < lengths[b]  # placed in the packed sequence: all but each row's last
    rb, rt, ru, rd = b[run], t[run], ub[run], dest[run]
    ids[ru, rd], positions[ru, rd], segment[ru, rd] = batch.completion_ids[rb, rt], prompt_len[ru] + rt, rb + 1
    sees = torch.ones((S, S), dtype=torch.bool, device=dev).tril() & ((segment[:, None, :] == 0) | (segment[:, None, :] == segment[:, :, None]))
    if model.config._attn_implementation == "eager":  # eager adds the mask to its scores
        sees = torch.zeros(sees.shape, device=dev).masked_fill(~sees, torch.finfo(torch.float32).min)
    hidden = model.get_decoder()(input_ids=ids, attention_mask=sees[:, None], position_ids=positions, use_cache=False).last_hidden_state
    # token t of row b is predicted at its previous token: the prompt's last for t = 0
    source = torch.where(t == 0, prompt_len[ub] - 1, dest - 1)
    picked = hidden.reshape(U * S, -1)[ub * S + source]  # (tokens, H)
    return picked.new_zeros(B * T, picked.shape[-1]).index_copy(0, b * T + t, picked).view(B, T, -1)


def _segment_hidden(model: torch.nn.Module, ids: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """(B, L, H) final hidden states of rows of consecutive examples (`segments`, see `completion_forward`)."""
    B, L = ids.shape
    dev = ids.device
    same = (segments[:, None, :] == segments[:, :, None]) & (segments[:, :, None] >= 0)  # (B, L, L) query, key
    sees = same & torch.ones((L, L), dtype=torch.bool, device=dev).tril()
    sees |= torch.eye(L, dtype=torch.bool, device=dev)  # padding sees itself: no row of the softmax is empty
    columns = torch.arange(L, device=dev).expand(B, L)
    starts = torch.ones_like(segments, dtype=torch.bool)
    starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
    positions = columns - (columns * starts).cummax(dim=1).values  # (B, L) 0 at each example's first token
    if model.config._attn_implementation == "eager":  # eager adds the mask to its scores
        sees = torch.zeros(sees.shape, device=dev).masked_fill(~sees, torch.finfo(torch.float32).min)
    return model.get_decoder()(input_ids=ids, attention_mask=sees[:, None], position_ids=positions, use_cache=False).last_hidden_state


def _can_share(model: torch.nn.Module) -> bool:
    # transformers 5.x renamed is_gradient_checkpointing (which now warns) to is_activation_checkpointing
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else "is_gradient_checkpointing"
    return (model.get_output_embeddings() is not None and not getattr(model.config, "final_logit_softcapping", None)
            and not getattr(model, name, False))


def _shared_prompt_hidden(model: torch.nn.Module, batch: Rollout, mask: torch.Tensor, positions: torch.Tensor,
                          groups: torch.Tensor) -> torch.Tensor:
    """(B, T, H) final hidden states at the positions that predict each completion token, with each
    distinct prompt run once (see `completion_forward`)."""
    decoder, P = model.get_decoder(), batch.prompt_ids.shape[1]
    first = _group_starts(groups)
    prompt = decoder(input_ids=batch.prompt_ids[first], attention_mask=batch.prompt_mask[first], position_ids=positions[first, :P],
                     use_cache=True)
    cache_name = "cache" if hasattr(prompt, "cache") else "past_key_values"  # transformers 5.x renamed it
    cache = getattr(prompt, cache_name)
    cache.batch_select_indices(groups)  # (U, ...) → (B, ...), differentiable
    rest = decoder(input_ids=batch.completion_ids, attention_mask=mask, position_ids=positions[:, P:], use_cache=True,
                   **{cache_name: cache})
    # position P−1 (the prompt's last) predicts completion token 0; P−1+t predicts token t
    return torch.cat([prompt.last_hidden_state[groups, -1:], rest.last_hidden_state[:, :-1]], dim=1)


def head_logits(model: torch.nn.Module, hidden: torch.Tensor, fp32_head: bool) -> torch.Tensor:
    """The LM head on final hidden states (..., H). With `fp32_head` and a head that would multiply in
    less than float32, a float32 matmul outside autocast on float32 copies of the hidden states and the
    head; otherwise the model's head, its output cast to float32 with `fp32_head`."""
    head = model.get_output_embeddings()
    if fp32_head and head_not_fp32(model, hidden.device.type):
        with torch.autocast(hidden.device.type, enabled=False):
            return F.linear(hidden.float(), head.weight.float(), None if head.bias is None else head.bias.float())
    logits = head(hidden)
    return logits.float() if fp32_head else logits


def head_not_fp32(model: torch.nn.Module, device_type: str) -> bool:
    """Whether the model's own LM head would multiply in less than float32 (autocast, or bf16/fp16 weights).
    Models that post-process their logits (Gemma's soft-capping) keep their own head: the cast comes after it."""
    head = model.get_output_embeddings()
    if head is None or getattr(model.config, "final_logit_softcapping", None):
        return False
    return torch.is_autocast_enabled(device_type) or head.weight.dtype != torch.float32


def completion_logprobs(
    model: torch.nn.Module, batch: Rollout, *, temperature: float = 1.0, fp32_head: bool = True, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs, entropy or None), both (B, T); see `completion_forward`."""
    out = completion_forward(model, batch, temperature=temperature, fp32_head=fp32_head, with_entropy=with_entropy)
    return out.logprobs, out.entropy


class CompletionModel(nn.Module):
    """A causal LM as the learner runs it: `forward(batch, **options)` is `completion_forward(model, batch,
    chunk_tokens=chunk_tokens, **options)`. Wrappers (DDP, FSDP2's root) hook a module's forward; the learner's forward runs the
    decoder and the LM head separately, so this module is what they wrap."""

    def __init__(self, model: nn.Module, *, chunk_tokens: int | None = None):
        super().__init__()
        self.model = model
        self.chunk_tokens = chunk_tokens  # train.logprob_chunk_tokens (None: auto)

    def forward(self, batch: Rollout, **options: Any) -> CompletionForward:
        return completion_forward(self.model, batch, **{"chunk_tokens": self.chunk_tokens, **options})
