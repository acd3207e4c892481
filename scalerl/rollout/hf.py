"""Rollout with a Hugging Face causal LM: batched, KV-cached sampling in a plain loop.

A hand-written loop rather than `model.generate`: we need the sampling distribution's log-prob
of every token (for off-policy correction and diagnostics) and nothing of generate's machinery;
on small models the loop is also several times cheaper per token. The model's own forward with
`past_key_values` does the caching, so any architecture that supports `generate` works here.

Randomness is per request (the `Sampler` contract, rollout/base.py): each prompt's seed draws all
the uniforms of its `n` rows up front, (n, max_new_tokens) from its own CPU generator, and a token
is the inverse CDF of the filtered distribution at its uniform. A prompt's samples then depend on
its seed alone, never on the batch around it or the device, while the per-token work stays one
batched `searchsorted`; the cost is one small generator call per prompt per `sample` call.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import ContextManager

import torch

from scalerl.errors import ScaleRLError
from scalerl.models.logprobs import head_logits, head_not_fp32
from scalerl.rollout.static_decode import StaticDecoder, unsupported
from scalerl.types import Rollout, SamplingParams

log = logging.getLogger(__name__)


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (B, P), real tokens aligned on the right."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row):] = 1
    return ids, mask


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf. logits: (B, V) float32."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the mass before it already reaches top_p (the top token always stays).
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(B,) long: token i of row b where cdf[i-1] <= u·total < cdf[i]; probs (B, V), u (B,) in [0, 1).

    The strict `<` (right=True) skips zero-probability tokens (filtered by top-k / top-p): their cdf
    equals their predecessor's, so the chosen token's cdf always rises. u·total rounding up to the
    total would select past the end (and clamping would pick the last token, possibly a filtered
    one), so it is kept strictly below the total."""
    cdf = probs.cumsum(-1)  # (B, V)
    total = cdf[:, -1:]  # (B, 1)
    if not bool(torch.isfinite(total).all()):  # NaN/inf logits would select past the vocabulary
        raise ScaleRLError("sampling: the policy's next-token probabilities are not finite (NaN or inf logits): its weights "
                           "are not finite, or the model overflows in this precision; check the checkpoint, or try precision.mode=fp32")
    x = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))  # (B, 1), < total
    return torch.searchsorted(cdf, x, right=True).squeeze(-1)


class DecodeClock:
    """How a decode step's time grows with the cached positions, for `scalerl plan` (scalerl/predict/step_cost.py).

    Each decode step's interval between two host syncs (the forward at cache length c, then the next
    token's sampling) is recorded as (c, τ); `slope` is the least-squares dτ/dc over the recorded
    steps, in seconds per cached position per step of the whole batch: the part of decoding that
    reads (and, for a growing cache, copies) the KV cache, which a pilot at short completions cannot
    otherwise tell from the per-token work. `reset` starts a new record (the worker: once per batch)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.n, self.seconds, self.c, self.cc, self.ct = 0, 0.0, 0.0, 0.0, 0.0

    def add(self, context: int, seconds: float) -> None:
        self.n += 1
        self.seconds += seconds
        self.c, self.cc, self.ct = self.c + context, self.cc + context * context, self.ct + context * seconds

    def slope(self) -> float | None:
        """dτ/dc (s per position per step), or None with fewer than 3 steps or one cache length only."""
        var = self.n * self.cc - self.c * self.c
        return (self.n * self.ct - self.c * self.seconds) / var if self.n >= 3 and var > 0 else None


class CompileTrial:
    """rollout.decode=auto's choice of compiling the decode step, by measurement.

    The kept decoder's generations (training's shape) are timed. Once the last `TIMED` of them (after the first, a
    warm-up; checked after every generation, as completions grow) say that the generations still planned (the run's steps after the policy version that generates: a resumed run
    has fewer ahead) would take `AHEAD_S` or more eagerly, the step is compiled and its next
    `TIMED` generations after the one that compiled are timed too; the compiled step stays if its median is at
    least `MARGIN` faster than the eager one, else the eager step comes back. One trial a run, on the kept shape: other
    shapes (an evaluation's) decode on the eager static step. The threshold is meant to
    cover the compile and a trial that loses: compiling took 0.5-15 s on a 2-core CPU for 1-8 layers
    (docs/benchmarks.md), and the compiled step ranged from 0.87x (sdpa attention, W2's shape) to 1.69x the eager one.
    """

    AHEAD_S = 600.0  # seconds of eager decoding still ahead that make a trial worth its compile
    TIMED = 3  # generations timed on each side, after each side's first
    MARGIN = 0.95  # the compiled step's median time must be under this x the eager one's

    def __init__(self, planned: int):
        self.planned = planned  # training generations of the run: one per policy version
        self.verdict: str | None = None  # None, "trying", "kept", "reverted", "failed"
        self.restart()

    def restart(self) -> None:
        self.eager: list[float] = []
        self.compiled: list[float] = []

    def record(self, decoder: StaticDecoder, seconds: float, version: int) -> bool | None:
        """Time one generation of the kept `decoder` by the policy of `version`; returns True to compile its step now,
        False to go back to the eager step, None to keep it as it is."""
        if self.verdict == "trying" and not decoder.compiled:  # it did not compile: StaticDecoder.step warned
            self.verdict = "failed"
        if self.verdict not in (None, "trying"):
            return None
        (self.compiled if decoder.compiled else self.eager).append(seconds)
        if len(self.eager) > self.TIMED + 1:  # the warm-up and the last TIMED: a long run's record stays this short
            del self.eager[1]
        eager = statistics.median(self.eager[1:]) if len(self.eager) > self.TIMED else None
        if self.verdict is None and eager is not None:
            left = max(self.planned - version - 1, 0)
            if left * eager < self.AHEAD_S:
                return None
            self.verdict = "trying"
            log.warning("rollout.decode=auto: %d generations ahead at %.3g s each (%.0f s): compiling the decode step for "
                        "%d rows x %d positions, kept if its next %d generations are faster", left, eager, left * eager,
                        decoder.keys[0].shape[0], decoder.capacity, self.TIMED)
            return True
        if self.verdict == "trying" and len(self.compiled) > self.TIMED:
            compiled = statistics.median(self.compiled[1:])
            took = self.compiled[0] - compiled
            self.verdict = "kept" if compiled < self.MARGIN * eager else "reverted"
            log.warning("rollout.decode=auto: the compiled decode step took %.3g s a generation against %.3g s eagerly "
                        "(compiling: %.1f s): %s", compiled, eager, took,
                        "kept" if self.verdict == "kept" else "back to the eager step")
            return False if self.verdict == "reverted" else None
        return None


class HFSampler:
    """Samples from a Hugging Face causal LM: the training model itself (weights shared, `sync_weights(None, v)`)
    or a copy that receives state dicts."""

    def __init__(self, model: torch.nn.Module, pad_id: int, eos_id: int | Sequence[int], device: torch.device,
                 autocast: Callable[[], ContextManager] | None = None, fp32_head: bool = True,
                 gather: Callable[[], ContextManager] | None = None, decode: str = "auto", planned_generations: int | None = None):
        """`autocast`: the learner's compute precision (a context factory, e.g. bf16 autocast), so that
        sampling runs in it too; `fp32_head`: the LM head's matmul and the softmax in float32 whatever
        the compute dtype (the ScaleRL recipe's FP32 head, as in `completion_forward`); `gather`: a
        context factory in which a sharded model's full weights are readable (FSDP2's all-gather);
        `decode` (rollout.decode): "auto" decodes on a static KV cache (scalerl/rollout/static_decode.py) where
        the model allows, and compiles its step where that pays (`CompileTrial`: `planned_generations`, the run's
        training generations, must be given), "hf" with the model's forward, "compiled" the static step compiled."""
        # eos_id: EOS, or the tokens that end a completion (EOS and a chat template's end-of-turn token)
        stops = [eos_id] if isinstance(eos_id, int) else list(eos_id)
        self.model, self.pad_id, self.eos_id, self.device = model, pad_id, stops[0], device
        self.stop_ids = torch.tensor(stops, dtype=torch.long, device=device)
        self.autocast, self.fp32_head = autocast or contextlib.nullcontext, fp32_head
        self.gather = gather or contextlib.nullcontext
        if decode not in ("auto", "hf", "compiled"):
            raise ValueError(f"HFSampler: decode={decode!r}; use auto, hf or compiled")
        self.decode = decode
        self._static: StaticDecoder | None = None  # kept across generations of one shape (_static_decoder)
        self._warned = False
        self._version = 0
        self.decode_clock = DecodeClock()
        self.trial = CompileTrial(planned_generations) if decode == "auto" and planned_generations else None
        # transformers 5.x renamed the cache argument of forward from `past_key_values` to `cache`.
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @property
    def version(self) -> int:
        return self._version

    @torch.no_grad()
    def sync_weights(self, weights: Mapping[str, torch.Tensor] | None, version: int) -> None:
        if weights is not None:  # None: the model is the learner's own, already up to date
            self.model.load_state_dict(weights, strict=True)
        self._version = version

    def _uniforms(self, seeds: Sequence[int], n: int, steps: int) -> torch.Tensor:
        """(steps, B) float32: row i·n+j's uniform at each step, from seeds[i] alone."""
        u = torch.cat([torch.rand((n, steps), generator=torch.Generator().manual_seed(int(seed))) for seed in seeds])
        return u.T.contiguous().to(self.device)  # (steps, B): one contiguous row per step

    @torch.no_grad()
    def sample(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None = None) -> Rollout:
        n = params.n
        greedy = params.temperature == 0
        if not greedy:
            if seeds is None:
                raise ValueError(f"HFSampler.sample: temperature {params.temperature} draws random tokens and needs `seeds`, "
                                 "one per prompt (only greedy decoding, temperature 0, goes without)")
            if len(seeds) != len(prompt_ids):
                raise ValueError(f"HFSampler.sample: `seeds` has {len(seeds)} seeds for {len(prompt_ids)} prompts; give one per prompt")
            uniforms = self._uniforms(seeds, n, params.max_new_tokens)  # (T, B)
        ids, mask = left_pad(prompt_ids, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            with self.gather(), self.autocast():  # one context for the whole loop: weights gathered and cast once
                completion, logps, finished = self._decode(ids, mask, params, None if greedy else uniforms)
        finally:
            self.model.train(was_training)
        ids, mask = ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
        # A token is part of the completion if no EOS came strictly before it.
        is_eos = torch.isin(completion, self.stop_ids).long()
        completion_mask = ((is_eos.cumsum(1) - is_eos) == 0).long()  # (B, T)
        return Rollout(
            prompt_ids=ids,
            prompt_mask=mask,
            completion_ids=completion,
            completion_mask=completion_mask,
            sampler_logprobs=logps * completion_mask,
            truncated=~finished,
            group_ids=torch.arange(len(prompt_ids), device=self.device).repeat_interleave(n),
        )

    def _next_logits(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, past,
                     own_head: bool) -> tuple[object, torch.Tensor]:
        """(cache, (B, V) float32 logits of the last position): through the model's own head, or (not
        `own_head`) the decoder then `head_logits`'s float32 head outside autocast."""
        cache = {self._cache_arg: past} if past is not None else {}
        if own_head:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1, **cache)
            return getattr(out, self._cache_arg), out.logits[:, -1].float()
        out = self.model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **cache)
        return getattr(out, self._cache_arg), head_logits(self.model, out.last_hidden_state[:, -1], fp32_head=True)

    def _static_decoder(self, cache, mask: torch.Tensor, first_positions: torch.Tensor, new_tokens: int,
                        group: int = 1) -> StaticDecoder | None:
        """The static-cache decoder loaded with this generation's prompt (`decode` auto or compiled and the model
        allows), or None. Its buffers are kept for the next generation of the same shape, unless the kept ones served
        several weight versions (training's: a generation a step): those stay, and this generation's (an evaluation's,
        whose batches all have one version) are freed when it ends (`_decode`)."""
        if self.decode == "hf" or new_tokens < 1 or not getattr(cache, "layers", None):
            return None
        rows, capacity = mask.shape[0], mask.shape[1] + new_tokens
        if (why := unsupported(self.model, capacity)) is not None:
            if self.decode == "compiled" and not self._warned:
                log.warning("rollout.decode=compiled: %s; decoding with the model's forward", why)
                self._warned = True
            return None
        dtype = cache.layers[0].keys.dtype
        if torch.is_autocast_enabled(mask.device.type):
            # autocast casts the keys and values to its dtype for every attention product (the model's forward casts
            # its whole fp32 cache every token): buffers in that dtype take the same numbers once, as each token's
            # column is written, at half the memory
            dtype = torch.get_autocast_dtype(mask.device.type)
        kept, compiled = self._static, self.decode == "compiled"
        if kept is not None and kept.fits(rows, capacity, dtype):
            decoder = kept
        elif kept is not None and kept.uses > 1:
            # buffers that served several weight versions (training's) stay; this one (an evaluation's, say) gets its
            # own, freed when it ends: kept, an evaluation's larger buffers would add to the memory of every later step.
            # Counted in versions, not generations: an evaluation in several batches would otherwise pass for training
            # and leave every later step allocating buffers of its own
            decoder = StaticDecoder(self.model, rows, capacity, dtype, mask.device, compiled=compiled)
        else:
            if kept is not None:
                kept.release()  # the old buffers go before the new ones are allocated
            self._static = None
            if self.trial is not None:
                self.trial.restart()  # another kept shape: its own timings, before a verdict
            decoder = self._static = StaticDecoder(self.model, rows, capacity, dtype, mask.device, compiled=compiled)
        decoder.load(cache, mask, first_positions, self._version, group=group)
        return decoder

    def _head(self, hidden: torch.Tensor, own_head: bool) -> torch.Tensor:
        """(B, V) float32 logits of final hidden states (B, H), as `_next_logits` computes them."""
        if own_head:
            return self.model.get_output_embeddings()(hidden).float()
        return head_logits(self.model, hidden, fp32_head=True)

    def _decode(self, ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams,
                uniforms: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(completion (B, T), sampler log-probs (B, T), finished (B,)) for the (P, L) left-padded prompts."""
        n = params.n
        own_head = not (self.fp32_head and head_not_fp32(self.model, ids.device.type))  # fixed for the whole call
        # Prefill each prompt once, then copy its KV cache to its n samples: the prompt forward
        # costs a factor n less, and every row still samples independently.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (P, L); left padding shifts positions
        past, logits = self._next_logits(ids, mask, positions, None, own_head)  # (P, V)
        if n > 1:
            mask, positions, logits = (x.repeat_interleave(n, dim=0) for x in (mask, positions, logits))
        B = logits.shape[0]
        next_pos = positions[:, -1:] + 1  # (B, 1)
        # the static buffers take each prompt's cache straight into its n rows; the model's cache is repeated only for
        # the model's forward (a copy as large as the buffers' prompt part, beside them, where the prompts are long)
        static = self._static_decoder(past, mask, next_pos[:, 0], params.max_new_tokens - 1, group=n)
        if static is None and n > 1:
            past.batch_repeat_interleave(n)
        attn = mask
        began = time.perf_counter()
        finished = torch.zeros(B, dtype=torch.bool, device=self.device)
        tokens, logps = [], []
        synced = context = None  # the last host sync (decode_clock) and the cache length of the forward since
        for step in range(params.max_new_tokens):
            if step < params.min_new_tokens:
                logits[:, self.stop_ids] = float("-inf")
            if uniforms is None:  # greedy
                token = logits.argmax(-1)  # (B,)
                logp = logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
            else:
                logp_all = filter_logits(logits / params.temperature, params.top_k, params.top_p).log_softmax(-1)  # (B, V)
                token = inverse_cdf(logp_all.exp(), uniforms[step])  # (B,)
                logp = logp_all.gather(-1, token[:, None]).squeeze(-1)
            token = token.masked_fill(finished, self.pad_id)
            tokens.append(token)
            logps.append(logp.masked_fill(finished, 0.0))
            finished = finished | torch.isin(token, self.stop_ids)
            done = bool(finished.all()) or step == params.max_new_tokens - 1
            now = time.perf_counter()  # after that sync: the previous forward and this token's sampling are done
            if synced is not None:
                self.decode_clock.add(context, now - synced)
            if done:
                break
            synced = now
            if static is not None:
                context = static.length + 1
                logits = self._head(static.step(token), own_head)
            else:
                attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=self.device)], dim=1)
                context = attn.shape[1]
                past, logits = self._next_logits(token[:, None], attn, next_pos, past, own_head)
            next_pos = next_pos + 1
        if static is not None and static is not self._static:
            static.release()  # this generation's own buffers (an evaluation's), not kept
        elif static is not None and self.trial is not None and \
                (swap := self.trial.record(static, time.perf_counter() - began, self._version)) is not None:
            self._static = static.swapped(compiled=swap)  # the kept buffers' step, compiled or back to eager
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1), finished
