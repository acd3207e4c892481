"""The HF engine's decode steps on a static KV cache, without the model's per-call machinery (rollout.decode).

Transformers' forward does, for every decoded token, what a decode loop that knows its batch needs once: it builds
a 4-D mask from the 2-D one, grows a DynamicCache by a `torch.cat` per layer (the whole cache copied each token),
validates keyword arguments and wraps outputs. `StaticDecoder` keeps each layer's keys and values in buffers
allocated once for the longest completion, writes each token's in place, and runs the decoder layers' own modules
(norms, projections, the model's rotary embedding and its `apply_rotary_pos_emb`, the MLP: LoRA adapters and
autocast act on them as on the model's forward) and the model's attention arithmetic (sdpa's kernel, or eager's
matmuls and float32 softmax) over the buffers, with a padding mask it extends by one column per token. The numbers are the model's own to float round-off (tests/rollout/
test_static_decode.py samples the same tokens; under precision.mode=standard the log-probs are bitwise the same).

`python bench/static_decode.py --rounds 9 --compiled --tag _late --save` on this project's 2-core EPYC, 2026-12-07
(bench/results/static_decode_2026-12-07_late.json; random weights): a generation at the reference benchmark's shape
(W1: hidden 128, 64 rows, up to 8 tokens, fp32) 36.9 ms with the model's forward, 32.8 ms
here (1.13x); at W2's (hidden 512, 128 rows, 32 tokens, bf16 autocast, eager attention) 1.58 s and 1.27 s (1.25x).
Under autocast the buffers hold keys and values in its dtype (the model's forward casts its whole fp32 cache for
every product), and eager attention runs over the whole buffer (see `_attend`).
`compiled` runs the step (fixed shapes: attention over the whole buffer, the mask hiding the columns not yet
written; buffers a multiple of BUCKET long, so prompts of other lengths reuse the graph) through `torch.compile`
once per batch shape: 3-15 s on this CPU, for 1.4-1.7x at W1 and 1.45x at W2 with eager attention (1.04x with
sdpa's) against the model's forward, ~1.2x against the eager static step at W2 eager (0.87x at W2 with sdpa); it
pays for itself after hundreds of generations at W1 and ~50 at W2, so `auto` compiles only by measurement, in a run
long enough to pay (`CompileTrial` in scalerl/rollout/hf.py), and keeps the graph only where it measures faster.

Families whose decoder layers are Llama's (llama, mistral, qwen2, qwen3: pre-norm, rotary, optional q/k norms and
biases); others, sliding windows shorter than the sequence, or attention other than sdpa/eager take the model's forward.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from scalerl.errors import ScaleRLError

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
log = logging.getLogger(__name__)


def unsupported(model: torch.nn.Module, total: int) -> str | None:
    """Why `model` cannot decode here (None: it can), for sequences of up to `total` positions."""
    config = model.config
    if getattr(config, "model_type", None) not in FAMILIES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {', '.join(FAMILIES)}"
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return f"attention {config._attn_implementation!r}"
    decoder = model.get_decoder()
    for layer in decoder.layers:
        window = getattr(layer.self_attn, "sliding_window", getattr(config, "sliding_window", None))
        if window is not None and window < total:
            return f"a sliding window of {window} positions, shorter than {total}"
    return None


def decode_path(model: torch.nn.Module, decode: str) -> str:
    """What rollout.decode runs on `model`, for resolved.yaml: the static KV cache (compiled or not) or the model's
    forward and why (a sliding window shorter than a batch's sequences falls back per batch, not here)."""
    if decode == "hf":
        return "the model's forward (rollout.decode=hf)"
    if (why := unsupported(model, 0)) is not None:
        return f"the model's forward ({why})"
    return "static KV cache, compiled per batch shape" if decode == "compiled" else "static KV cache"


BUCKET = 16  # buffers are a multiple of this long: batches whose prompts differ in length reuse them (and a compiled graph)


class StaticDecoder:
    """Decode steps on KV buffers that are kept across generations of the same shape (`fits`, `load`)."""

    def __init__(self, model: torch.nn.Module, rows: int, capacity: int, dtype: torch.dtype, device: torch.device, *,
                 compiled: bool = False, asked: bool = True):
        """Buffers for `rows` sequences of up to `capacity` positions, rounded up to BUCKET. `compiled`: the step through
        torch.compile; `asked`: rollout.decode=compiled asked for it (a failed compile is a one-line error), else
        rollout.decode=auto chose it (scalerl/rollout/hf.py: a failed compile warns and the step runs eagerly)."""
        self.model, self.decoder = model, model.get_decoder()
        attn = self.decoder.layers[0].self_attn
        kv_heads, head_dim = attn.config.num_key_value_heads, attn.head_dim
        self.capacity = -(-capacity // BUCKET) * BUCKET
        shape = (rows, kv_heads, self.capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.decoder.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.decoder.layers]
        self.mask = torch.zeros((rows, 1, 1, self.capacity), dtype=torch.bool, device=device)
        self.length = 0  # columns written
        self.uses = 0  # weight versions it generated for (a run's training generations: one per step)
        self._version: int | None = None
        self.rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        self.gqa = attn.config.num_attention_heads != kv_heads
        self.eager = attn.config._attn_implementation == "eager"
        self.compiled = compiled
        # attention over every column of the buffers, those not yet written masked: the compiled step (fixed shapes)
        # and eager's matmuls (over a slice, each batched matmul would copy it first: 4x slower at W2's shape)
        self.whole_buffer = compiled or self.eager
        # on a GPU the compiled step replays as a CUDA graph (reduce-overhead): one launch per token instead of one per kernel
        mode = "reduce-overhead" if device.type == "cuda" else None
        # only the compiled step is kept as an attribute: a bound method kept on its own object is a reference cycle,
        # and buffers in a cycle wait for the garbage collector instead of going when the sampler lets go of them
        self._compiled: Callable | None = torch.compile(self._forward, dynamic=False, mode=mode) if compiled else None
        self.asked, self._ran = asked, False  # _ran: the compiled step has run once (compiled)
        if compiled and asked:
            log.warning("rollout.decode=compiled: compiling the decode step for %d rows x %d positions (once per batch shape: "
                        "training and evaluation batches are separate shapes; 4-15 s each on a 2-core CPU)", rows, self.capacity)

    def fits(self, rows: int, capacity: int, dtype: torch.dtype) -> bool:
        return self.keys[0].shape[0] == rows and capacity <= self.capacity and self.keys[0].dtype == dtype

    def swapped(self, *, compiled: bool) -> StaticDecoder:
        """A decoder of this one's shape in its place, its step compiled or not (rollout.decode=auto's trial,
        scalerl/rollout/hf.py); this one's buffers go first."""
        keys = self.keys[0]
        rows, capacity, dtype, device = keys.shape[0], self.capacity, keys.dtype, keys.device
        self.release()
        other = StaticDecoder(self.model, rows, capacity, dtype, device, compiled=compiled, asked=False)
        other.uses, other._version = self.uses, self._version
        return other

    def release(self) -> None:
        """Let go of the buffers now (a decoder the sampler no longer keeps; a compiled one is held by its graph)."""
        self.keys, self.values, self.mask, self.cos, self.sin = [], [], None, None, None

    @torch.no_grad()
    def load(self, prefill_cache, mask: torch.Tensor, first_positions: torch.Tensor, version: int = 0, group: int = 1) -> None:
        """Start a generation from the model's cache after the prompt, its padding mask `mask` (B, P) long and the
        position of each row's first new token `first_positions` (B,), with the weights of `version`. The cache has one
        row per prompt, whose `group` consecutive rows of the buffers (its sampled completions) each get a copy. The
        rotary embedding of every position the generation can reach is computed here at once, by the model's own module
        (elementwise in the position: the same numbers as one call per token)."""
        P = mask.shape[1]
        if version != self._version:
            self.uses, self._version = self.uses + 1, version
        for layer, keys, values in zip(prefill_cache.layers, self.keys, self.values):
            for buffer, cached in ((keys, layer.keys), (values, layer.values)):  # (B, heads, capacity, D) <- (B / group, heads, P, D)
                buffer.view(-1, group, *buffer.shape[1:])[:, :, :, :P] = cached[:, None]
            if self.whole_buffer:  # the columns not yet written get attention weight 0: their values must be finite
                values[:, :, P:].zero_()
        self.mask.zero_()
        self.mask[:, 0, 0, :P] = mask.bool()
        self.start = self.length = P
        positions = first_positions[:, None] + torch.arange(self.capacity - P, device=mask.device)  # (B, new tokens)
        # the rotary module takes its dtype from its input: the hidden states' in the model's forward, which the prompt's
        # keys carry (bf16 where precision.mode=standard casts the residual stream, float32 under plain autocast)
        probe = torch.empty(1, dtype=prefill_cache.layers[0].keys.dtype, device=mask.device)
        self.cos, self.sin = self.decoder.rotary_emb(probe, positions)  # (B, new tokens, D)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, H) final hidden state after the decoder's final norm, for the next token of each row, `tokens` (B,);
        its keys and values are written to the next column."""
        i, c = self.length - self.start, self.length
        self.mask[:, 0, 0, c] = True
        self.length += 1
        cos, sin = self.cos[:, i:i + 1], self.sin[:, i:i + 1]
        visible = self.mask if self.whole_buffer else self.mask[..., : c + 1]
        if self._compiled is None:
            return self._forward(tokens[:, None], cos, sin, c, visible)
        column = torch.tensor([c], device=tokens.device)  # compiled: fixed shapes, the column a tensor
        if self._ran:
            return self._compiled(tokens[:, None], cos, sin, column, visible)
        try:  # the first call compiles
            out = self._compiled(tokens[:, None], cos, sin, column, visible)
        except Exception as error:  # any type: inductor fails in many ways (no C++ compiler, an unsupported op)
            why = type(error).__name__ + (f": {str(error).strip().splitlines()[0]}" if str(error).strip() else "")
            if self.asked:
                raise ScaleRLError(f"rollout.decode=compiled: torch.compile failed on the decode step ({why}); "
                                   "use rollout.decode=auto (the same static KV cache, not compiled)") from error
            log.warning("rollout.decode=auto: the decode step did not compile (%s); it runs eagerly", why)
            self._compiled, self.compiled = None, False  # the same buffers, the whole of them attended, masked
            return self._forward(tokens[:, None], cos, sin, c, visible)
        self._ran = True
        return out

    def _forward(self, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, column: int | torch.Tensor,
                 visible: torch.Tensor) -> torch.Tensor:
        decoder = self.decoder
        x = decoder.embed_tokens(ids)  # (B, 1, H)
        B = x.shape[0]
        width = visible.shape[-1]
        for i, layer in enumerate(decoder.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(B, 1, -1, attn.head_dim)
            k = attn.k_proj(h).view(B, 1, -1, attn.head_dim)
            if hasattr(attn, "q_norm"):  # qwen3: RMSNorm per head before the rotation
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            v = attn.v_proj(h).view(B, 1, -1, attn.head_dim).transpose(1, 2)
            keys, values = self.keys[i], self.values[i]
            if isinstance(column, int):
                keys[:, :, column:column + 1], values[:, :, column:column + 1] = k, v
            else:
                keys.index_copy_(2, column, k.to(keys.dtype))
                values.index_copy_(2, column, v.to(values.dtype))
            o = self._attend(q, keys[:, :, :width], values[:, :, :width], visible, attn.scaling)
            x = x + attn.o_proj(o.transpose(1, 2).reshape(B, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return decoder.norm(x)[:, 0]

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
        """(B, heads, 1, D): the model's attention implementation's arithmetic, sdpa's kernel or eager's two matmuls
        with the softmax in float32 (bench/static_decode.py measures both). Over the whole buffer (`whole_buffer`) a
        masked column's weight is exactly 0, so the numbers are those over the written columns to round-off."""
        if not self.eager:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=scale, enable_gqa=self.gqa)
        B, heads, _, D = q.shape
        # grouped-query attention: query head h reads key/value head h // group (the model's repeat_kv); its group's
        # queries become the rows of one product with that head's keys, instead of a copy of the cache per query head
        # (at 14 query heads on 2 key/value heads, 128 rows, 48 positions: 0.42 ms against 17 ms in fp32)
        q = q.reshape(B, keys.shape[1], heads // keys.shape[1], D)
        scores = torch.matmul(q, keys.transpose(2, 3)) * scale
        scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(weights, values).reshape(B, heads, 1, D)
