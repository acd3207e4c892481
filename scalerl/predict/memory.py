"""Memory of an RL training job per component, before launch, from the model's shape alone (no torch).

Bytes per parameter or element by precision mode (`precision.mode`, scalerl/config/plan.py):

| mode | weights | grads | AdamW (2 moments) | error feedback | activations | KV cache | reference |
|---|---|---|---|---|---|---|---|
| fp32 | 4 | 4 | 8 | - | 4 | 4 | 4 |
| standard (bf16 autocast, fp32 master) | 4 (+ 2: autocast's bf16 copy of the decoder's weights, transient) | 4 | 8 | - | 2 | 4 | 2 |
| aggressive (fp8 matmuls, bf16 master) | 2 | 2 | 4 | 1 + s | 2 | 2 | 2 |
| compressed (bf16, 8-bit moments) | 2 | 2 | 2 + 2s | 1 + s | 2 | 2 | 2, or 1 + per-row scale (reference_8bit) |

s: the 8-bit states' block-wise scales, one float32 per 256 values of each tensor (4·⌈n/256⌉ bytes per
tensor of n values). `--optim-8bit` gives any mode 8-bit moments. The state bytes are counted tensor by
tensor, as the trainer holds them (tests/precision compare them with a real learner's, byte for byte).
With bf16 weights the FP32 LM head's float32 copy of the head weight (4·V·h) is held for its backward
(`working_copy`).
Aggressive's fp8 matmuls keep their saved inputs in fp8 but the rest of a layer's saved tensors in
bf16: 2 bytes per element is used. On the simulated-fp8 path (CPU) that is 8–13 % under what autograd
saves there, since the fp8 copies of the linear layers' inputs come beside bf16 tensors other ops keep
(bench/memory_estimate.py, 2026-12-06; the peak within −5.6 / −8.8 %); torchao's path is not measured.

Activations (saved for backward, per micro-batch): tokens × layers × per-layer elements × bytes, where
the per-layer elements per token of a Llama decoder layer with SDPA attention are counted tensor by
tensor (listed with `torch.autograd.graph.saved_tensors_hooks` on transformers' LlamaDecoderLayer):
RMSNorm input, its normalised value and output (3h), q after RoPE and the attention output, which
o_proj reads in place (2h), k and v (2h·kv/heads), the second RMSNorm (3h), and the MLP's gate, up,
SiLU(gate) and their product (4i) — i.e. (8 + 2·kv/heads)·h + 4·i, the "factor" being that over h
(≈ 20.75 for a Llama-2 7B shape). Plus the final norm (3h per token) and the fp32 logits of
the completion positions (the log-softmax keeps its input: V per token, ×2 with the entropy term).
With gradient checkpointing only each layer's input (h) is kept, plus one layer recomputed at a time.
Under bf16 autocast a layer saves its elements in bf16 except what runs in float32: the RMSNorms upcast
their inputs (+ 4 bytes per token per hidden unit), measured tensor by tensor on two shapes (h 256/i 768/MHA
and h 384/i 1024/GQA: 2·E + 4h bytes per layer and token, E the elements); the final norm adds 2h, and
the FP32 head keeps a float32 copy of its bf16 input (4h per completion position), measured on
tests/predict/test_memory.py's shape. `standard` casts the embedding's and the norms' outputs to bf16
(scalerl/precision/apply.py), so its residual stream is bf16 as with bf16 weights; with
`precision.fp32_residual` it would save an fp32 residual and per-consumer casts (+ 14h per layer, +6h
at the final norm and an fp32 KV cache: the 2026-12-04 measurement, `fp32_residual=True` here).

KV cache of the rollout: layers × 2 × kv_heads × head_dim × tokens × bytes, tokens = the rollout batch
(prompts × group size) × (prompt + completion length). AdamW with bf16 or 8-bit moments steps one tensor
at a time in float32, with up to four float32 temporaries of the largest tensor (`optimizer_step`).
The backward's first nodes allocate beyond the activations before freeing them: 4 × the float32 completion
logits in the log-softmax's backward, or the head weight's float32 gradient (`backward_transient`).
With the chunked LM head (train.logprob_chunk_tokens, where a micro-batch has more completion positions
than a chunk) no logits are saved, and the backward holds two chunks' worth of them at a time beside the
head's and the hidden states' gradients (`chunked_head_bytes`). Rollout,
the backward and the optimizer step come one after the other, so the peak is
    states + max(activations + backward transient, KV cache, optimizer step),
    states = weights + grads + optimizer + error feedback + working copy (+ reference) (+ critic)
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from scalerl.config.plan import chunk_positions
from scalerl.errors import ScaleRLError
from scalerl.precision.bytes import PRECISIONS, Precision, state_bytes

LEGACY_NAMES = {"bf16": "standard", "fp8": "aggressive"}  # the older train.precision spelling

GIB = 1024**3


@dataclass(frozen=True)
class ModelShape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tie_embeddings: bool = False

    @property
    def params(self) -> int:
        """Llama: embeddings V·h, per layer q,o (h·heads·d each), k,v (h·kv·d each), MLP 3·h·i, two norms 2h;
        final norm h; LM head V·h unless tied."""
        attn = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        layer = attn + 3 * self.hidden * self.intermediate + 2 * self.hidden
        head = 0 if self.tie_embeddings else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * layer + self.hidden + head

    def tensors(self) -> list[tuple[int, ...]]:
        """The parameter tensors' shapes in the order of a Llama's named_parameters: the embedding first,
        per layer q, k, v, o, gate, up, down and the two norms, the final norm, the LM head unless tied."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        layer = [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i), (h,), (h,)]
        return [(self.vocab, h), *layer * self.layers, (h,), *([] if self.tie_embeddings else [(self.vocab, h)])]

    @classmethod
    def from_hf_config(cls, cfg: dict, source: str = "config.json") -> "ModelShape":
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(vocab=int(cfg["vocab_size"]), hidden=hidden, intermediate=int(cfg["intermediate_size"]),
                       layers=int(cfg["num_hidden_layers"]), heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
                       head_dim=int(cfg.get("head_dim") or hidden // heads), tie_embeddings=bool(cfg.get("tie_word_embeddings", False)))
        except KeyError as err:
            raise ScaleRLError(f"{source}: no {err.args[0]} key; the estimator needs a Llama-style decoder config") from None


# Llama-2 shapes (Touvron et al. 2023, table of model sizes; 70B uses grouped-query attention with 8 KV heads).
MODEL_PRESETS: dict[str, ModelShape] = {
    "7b": ModelShape(vocab=32000, hidden=4096, intermediate=11008, layers=32, heads=32, kv_heads=32, head_dim=128),
    "13b": ModelShape(vocab=32000, hidden=5120, intermediate=13824, layers=40, heads=40, kv_heads=40, head_dim=128),
    "70b": ModelShape(vocab=32000, hidden=8192, intermediate=28672, layers=80, heads=64, kv_heads=8, head_dim=128),
}


LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # a Llama layer's linear layers


def lora_tensors(shape: ModelShape, r: int, targets: list[str] | str = "all-linear") -> list[tuple[int, ...]]:
    """The adapters' shapes: for each targeted linear layer (out × in) of every decoder layer, A (r × in) and
    B (out × r). `targets`: peft's target_modules (names matched as suffixes), or all-linear (every linear of
    the decoder layers; the LM head is never targeted)."""
    q, kv, h, i = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden, shape.intermediate
    dims = dict(zip(LINEARS, [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]))
    names = LINEARS if targets == "all-linear" else [n for n in LINEARS if any(n.endswith(t) for t in targets)]
    if not names:
        raise ScaleRLError(f"model.lora.target_modules: none of {targets} names a linear layer of a Llama decoder ({', '.join(LINEARS)})")
    return [t for name in names for out, inp in [dims[name]] for t in ((r, inp), (out, r))] * shape.layers


def reference_bytes(tensors: list[tuple[int, ...]], precision: Precision, *, int8: bool = False, head: tuple[int, ...] | None = None) -> int:
    """The frozen reference: every weight at the mode's width, or with `int8` each linear layer (2-D tensor,
    the embedding and the LM head `head` excepted) as int8 codes plus a float32 scale per row."""
    total = 0
    for i, t in enumerate(tensors):
        linear = int8 and len(t) == 2 and i > 0 and t != head
        total += t[0] * t[1] + 4 * t[0] if linear else int(math.prod(t) * precision.reference)
    return total


def shape_of_model_path(path: str) -> ModelShape:
    """The shape from a model folder's config.json ('builtin' is the shipped model)."""
    from scalerl.models.paths import resolve_model_path

    folder = Path(resolve_model_path(path))
    if not (folder / "config.json").is_file():
        raise ScaleRLError(f"model.path: {path} is not a local folder with config.json; use --model-size 7b/13b/70b for a hub model")
    return ModelShape.from_hf_config(json.loads((folder / "config.json").read_text()), str(folder / "config.json"))


def working_copy_bytes(shape: ModelShape, precision: Precision, *, fp32_head_copy: bool = True) -> float:
    """What the forward keeps besides activations and the weights: under autocast with fp32 weights, the bf16
    casts of the decoder's weights (not the embedding, whose lookup autocast leaves alone, nor the FP32 LM
    head); with bf16 weights, the FP32 head's float32 copy of the head weight, saved for its backward (not by
    the chunked head, `fp32_head_copy` False: it casts in its backward)."""
    embed = shape.vocab * shape.hidden
    norms = (2 * shape.layers + 1) * shape.hidden  # RMSNorm weights: their op runs in float32, never cast
    body = shape.params - embed * (1 if shape.tie_embeddings else 2) - norms
    return body * precision.working_copy + (4 * embed if precision.weights < 4 and fp32_head_copy else 0)


def activation_bytes_per_token(shape: ModelShape, precision: Precision, *, checkpointing: bool = False) -> float:
    """Saved bytes per token over all layers: the elements of `activation_elements_per_token` at the mode's
    width, plus the float32 parts under autocast of each full layer and of the final norm
    (`Precision.fp32_per_layer`, `fp32_final_norm`)."""
    full_layers = 1 if checkpointing else shape.layers
    return (activation_elements_per_token(shape, checkpointing=checkpointing) * precision.activations
            + (full_layers * precision.fp32_per_layer + precision.fp32_final_norm) * shape.hidden)


def activation_elements_per_token(shape: ModelShape, *, checkpointing: bool = False) -> float:
    """Saved elements per token over all layers: L·((8 + 2·kv/heads)·h + 4·i) + 3h (final norm); with
    checkpointing L·h (layer inputs) + one layer's full set (recomputed during backward) + 3h."""
    per_layer = (8 + 2 * shape.kv_heads / shape.heads) * shape.hidden + 4 * shape.intermediate
    if checkpointing:
        return shape.layers * shape.hidden + per_layer + 3 * shape.hidden
    return shape.layers * per_layer + 3 * shape.hidden


def estimate_memory(shape: ModelShape, *, precision: str = "fp32", optim_8bit: bool = False, micro_batch: int,
                    prompt_len: int, completion_len: int, rollout_sequences: int, reference: bool = False,
                    reference_8bit: bool = False, critic: str | None = None, checkpointing: bool = False,
                    entropy: bool = False, lora: tuple[int, list[str] | str] | None = None, ewc: bool = False,
                    fp32_residual: bool = False, offload: bool = False, logprob_chunk: int | None = 0,
                    restore_point: bool = False) -> dict[str, float]:
    """Bytes per component for one process holding the whole model (see the module docstring), and the peak.
    `lora` = (r, target_modules): weights, gradients and optimizer states are the adapters' (`lora_tensors`),
    the base is `frozen_base` at the weights' width, and the reference costs nothing (the base, adapters off).
    `ewc`: EWC's anchor copy of the trained weights (their width) and its float32 Fisher, on every rank.
    `offload` (optim.offload): the moments leave the device; `host` counts them with the pinned float32 copies
    of the weights and gradients the host steps on. `logprob_chunk` (train.logprob_chunk_tokens; None: auto, 0:
    never): where the micro-batch's completion positions exceed a chunk, the LM head runs chunk by chunk
    (`chunked_head_bytes`): no logits are kept for backward, nor the FP32 head's float32 copies. `restore_point`
    (health.nonfinite.snapshot_every > 0): the learner's CPU copy of the trained weights and optimizer state (the
    critic's too), counted in `host` (scalerl/learner/recovery.py)."""
    precision = LEGACY_NAMES.get(precision, precision)
    if precision not in PRECISIONS:
        raise ScaleRLError(f"--precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    p, n, tensors = PRECISIONS[precision], shape.params, shape.tensors()
    fp32_residual = fp32_residual and precision == "standard"
    if fp32_residual:  # autocast over an fp32 residual stream (precision.fp32_residual)
        p = replace(p, kv=4, fp32_per_layer=14, fp32_final_norm=6)
    seq = prompt_len + completion_len
    chunk = chunk_positions(logprob_chunk, shape.vocab)
    chunked = 0 < chunk < micro_batch * completion_len
    logits = micro_batch * (completion_len + 1) * shape.vocab * 4 * (2 if entropy else 1)  # fp32 LM head
    if p.activations < 4 and not fp32_residual:  # the FP32 head's float32 copy of its bf16 input
        logits += micro_batch * (completion_len + 1) * shape.hidden * 4
    if chunked:
        logits, transient = chunked_head_bytes(shape, positions=micro_batch * completion_len, chunk=chunk, entropy=entropy,
                                               head_grad=not lora, bf16_weights=p.weights < 4,
                                               hidden_bytes=4 if fp32_residual else p.activations)
    head = None if shape.tie_embeddings else tensors[-1]
    trained = lora_tensors(shape, *lora) if lora else tensors
    out: dict[str, float] = {
        "params": float(n),
        **state_bytes(trained, p, optim_8bit=optim_8bit),
        "frozen_base": float(n * p.weights) if lora else 0.0,
        "ewc": float(sum(math.prod(t) for t in trained) * (p.weights + 4)) if ewc else 0.0,
        "working_copy": working_copy_bytes(shape, p, fp32_head_copy=not chunked),
        "activations": micro_batch * seq * activation_bytes_per_token(shape, p, checkpointing=checkpointing) + logits,
        "kv_cache": float(shape.layers * 2 * shape.kv_heads * shape.head_dim * rollout_sequences * seq * p.kv),
        "reference": reference_bytes(tensors, p, int8=reference_8bit, head=head) if reference and not lora else 0.0,
        "critic": 0.0,
    }
    if critic == "separate":  # a value model from the policy's backbone: its own weights, grads, states, activations
        body = tensors[:-1] if head else tensors
        out["critic"] = sum(state_bytes(body, p, optim_8bit=optim_8bit).values()) + out["activations"] - logits
    out["backward_transient"] = transient if chunked else backward_transient_bytes(
        shape, micro_batch=micro_batch, completion_len=completion_len, entropy=entropy, head_grad=not lora, bf16_weights=p.weights < 4)
    # AdamW with bf16 or 8-bit moments steps each tensor in float32 with up to four temporaries of its size
    out["optimizer_step"] = 16.0 * max(math.prod(t) for t in trained) if p.moments != "float32" or optim_8bit else 0.0
    kept = ("weights", "optimizer", "error_feedback")
    out["restore_point"] = sum(out[k] for k in kept) if restore_point else 0.0
    if restore_point and critic == "separate":
        out["restore_point"] += sum(v for k, v in state_bytes(body, p, optim_8bit=optim_8bit).items() if k in kept)
    if offload:
        trained_n = sum(math.prod(t) for t in trained)
        out["host"], out["optimizer"] = out["optimizer"] + 8.0 * trained_n, 0.0
    else:
        out["host"] = 0.0
    out["host"] += out["restore_point"]
    out["states"] = sum(out[k] for k in ("weights", "gradients", "optimizer", "error_feedback", "frozen_base", "ewc", "working_copy",
                                         "reference", "critic"))
    out["peak"] = out["states"] + max(out["activations"] + out["backward_transient"], out["kv_cache"], out["optimizer_step"])
    return out


def backward_transient_bytes(shape: ModelShape, *, micro_batch: int, completion_len: int, entropy: bool, head_grad: bool,
                             bf16_weights: bool) -> float:
    """What the backward allocates on top of the forward's activations, at its start, before it frees them:
    the log-softmax's backward (logprob = z_y − logsumexp(z)) holds the gather's gradient of the float32 logits
    and the three logits-sized temporaries of grad·exp(z − lse) at once, 4 × the logits' bytes (seen op by op
    with torch.profiler; the entropy term doubles the logits, not measured). Then the head's matmul: its
    weight's float32 gradient (4·V·h; for bf16 weights also its bf16 cast) while the logits' own saved copy has
    been freed. Which is larger depends on tokens per micro-batch against the hidden size. Checked against
    what the backward allocates (tests/predict/test_memory.py, within 10 %, both cases) and against peak RSS
    (bench/memory_estimate.py)."""
    logits = micro_batch * (completion_len + 1) * shape.vocab * 4 * (2 if entropy else 1)
    head = 4.0 * shape.vocab * shape.hidden * (1.5 if bf16_weights else 1.0) if head_grad else 0.0
    return max(4.0 * logits, head)


def chunked_head_bytes(shape: ModelShape, *, positions: int, chunk: int, entropy: bool, head_grad: bool, bf16_weights: bool,
                       hidden_bytes: float) -> tuple[float, float]:
    """(saved, backward transient) of the chunked LM head (scalerl/models/chunked_logprobs.py) over N `positions`.
    Saved for backward: the final hidden states (N·h at `hidden_bytes`), the float32 logsumexp and entropy
    (4 + 4 bytes per position). The backward holds the head's float32 gradient (4·V·h) and, for bf16 weights,
    the head's float32 copy (4·V·h), and the hidden states' float32 gradient (4·N·h) throughout; on top, each
    chunk of c positions two float32 (c, V) tensors (log p and p) and its float32 hidden states (4·c·h), or at
    the end the bf16 casts of the two gradients (2·V·h, 2·N·h). Checked against what the backward allocates
    (tests/predict/test_memory.py)."""
    V, h, N, c = shape.vocab, shape.hidden, positions, min(chunk, positions)
    saved = N * (h * hidden_bytes + 4 * (2 if entropy else 1))
    held = 4.0 * V * h * (head_grad + bf16_weights) + 4.0 * N * h
    per_chunk = 8.0 * c * V + (4.0 * c * h if hidden_bytes < 4 else 0.0)
    casts = (2.0 * V * h * head_grad if bf16_weights else 0.0) + (2.0 * N * h if hidden_bytes < 4 else 0.0)
    return float(saved), held + max(per_chunk, casts)


def gpus_needed(mem: dict[str, float], gpu_mem_gb: float, *, usable: float = 0.9, max_gpus: int = 4096) -> int | None:
    """Smallest n with states / n + max(activations + backward transient, KV cache) ≤ usable × GPU memory: the states fully sharded
    (FSDP / ZeRO-3), activations and KV cache per process (each process samples its own prompts). 10 % is
    left for the CUDA context, the allocator's fragmentation and communication buffers. None: never fits."""
    budget = usable * gpu_mem_gb * GIB
    per_process = max(mem["activations"] + mem["backward_transient"], mem["kv_cache"])
    if per_process >= budget:
        return None
    n = math.ceil(mem["states"] / (budget - per_process))
    return max(n, 1) if n <= max_gpus else None


def per_gpu_bytes(mem: dict[str, float], gpus: int, strategy: str) -> float:
    """The peak of one GPU among `gpus` under parallel.strategy: fsdp2 shards the states (weights, gradients,
    moments, reference, critic) and the optimizer step's temporaries over the GPUs; ddp, dynamic and none keep
    the whole model on each. Activations and KV cache are per process either way (each samples its own prompts)."""
    share = gpus if strategy == "fsdp2" else 1
    return mem["states"] / share + max(mem["activations"] + mem["backward_transient"], mem["kv_cache"], mem["optimizer_step"] / share)


def shape_dict(shape: ModelShape) -> dict:
    return {**asdict(shape), "params": shape.params}
