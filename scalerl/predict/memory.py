"""Memory of an RL training job per component, before launch, from the model's shape alone (no torch).

Bytes per parameter or element by precision mode (this project's implementation of each mode):

| mode | weights | grads | AdamW (2 moments) | activations | KV cache | reference |
|---|---|---|---|---|---|---|
| fp32 | 4 | 4 | 8 (8-bit states: 2) | 4 | 4 | 4 |
| bf16 (autocast, fp32 master) | 4 + 2 (bf16 working copy) | 4 | 8 (2) | 2 | 2 | 4 |
| fp8 (bf16 master, fp8 compute) | 2 + 1 (fp8 copy) | 2 | 8 (2) | 1 | 2 | 2 |

8-bit optimizer states: one byte per moment (block-wise scales, ~1 %, ignored).

Activations (saved for backward, per micro-batch): tokens × layers × per-layer elements × bytes, where
the per-layer elements per token of a Llama decoder layer with SDPA attention are counted tensor by
tensor (listed with `torch.autograd.graph.saved_tensors_hooks` on transformers' LlamaDecoderLayer):
RMSNorm input, its normalised value and output (3h), q after RoPE and the attention output, which
o_proj reads in place (2h), k and v (2h·kv/heads), the second RMSNorm (3h), and the MLP's gate, up,
SiLU(gate) and their product (4i) — i.e. (8 + 2·kv/heads)·h + 4·i, the "factor" being that over h
(≈ 20.75 for a Llama-2 7B shape). Plus the final norm (3h per token) and the fp32 logits of
the completion positions (the log-softmax keeps its input: V per token, ×2 with the entropy term).
With gradient checkpointing only each layer's input (h) is kept, plus one layer recomputed at a time.

KV cache of the rollout: layers × 2 × kv_heads × head_dim × tokens × bytes, tokens = the rollout batch
(prompts × group size) × (prompt + completion length). Rollout and learning alternate, so the peak is
    states + max(activations, KV cache),  states = weights + grads + optimizer (+ reference) (+ critic)
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from scalerl.errors import ScaleRLError

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


@dataclass(frozen=True)
class Precision:
    weights: float
    grads: float
    optimizer: float
    activations: float
    kv: float
    reference: float


PRECISIONS: dict[str, Precision] = {
    "fp32": Precision(weights=4, grads=4, optimizer=8, activations=4, kv=4, reference=4),
    "bf16": Precision(weights=6, grads=4, optimizer=8, activations=2, kv=2, reference=4),
    "fp8": Precision(weights=3, grads=2, optimizer=8, activations=1, kv=2, reference=2),
}


def shape_of_model_path(path: str) -> ModelShape:
    """The shape from a model folder's config.json ('builtin' is the shipped model)."""
    from scalerl.models.paths import resolve_model_path

    folder = Path(resolve_model_path(path))
    if not (folder / "config.json").is_file():
        raise ScaleRLError(f"model.path: {path} is not a local folder with config.json; use --model-size 7b/13b/70b for a hub model")
    return ModelShape.from_hf_config(json.loads((folder / "config.json").read_text()), str(folder / "config.json"))


def activation_elements_per_token(shape: ModelShape, *, checkpointing: bool = False) -> float:
    """Saved elements per token over all layers: L·((8 + 2·kv/heads)·h + 4·i) + 3h (final norm); with
    checkpointing L·h (layer inputs) + one layer's full set (recomputed during backward) + 3h."""
    per_layer = (8 + 2 * shape.kv_heads / shape.heads) * shape.hidden + 4 * shape.intermediate
    if checkpointing:
        return shape.layers * shape.hidden + per_layer + 3 * shape.hidden
    return shape.layers * per_layer + 3 * shape.hidden


def estimate_memory(shape: ModelShape, *, precision: str = "fp32", optim_8bit: bool = False, micro_batch: int,
                    prompt_len: int, completion_len: int, rollout_sequences: int, reference: bool = False,
                    critic: str | None = None, checkpointing: bool = False, entropy: bool = False) -> dict[str, float]:
    """Bytes per component for one process holding the whole model (see the module docstring), and the peak."""
    if precision not in PRECISIONS:
        raise ScaleRLError(f"--precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    p, n = PRECISIONS[precision], shape.params
    seq = prompt_len + completion_len
    logits = micro_batch * (completion_len + 1) * shape.vocab * 4 * (2 if entropy else 1)  # fp32 LM head
    out = {
        "params": float(n),
        "weights": n * p.weights,
        "gradients": n * p.grads,
        "optimizer": n * (2.0 if optim_8bit else p.optimizer),
        "activations": micro_batch * seq * activation_elements_per_token(shape, checkpointing=checkpointing) * p.activations + logits,
        "kv_cache": float(shape.layers * 2 * shape.kv_heads * shape.head_dim * rollout_sequences * seq * p.kv),
        "reference": n * p.reference if reference else 0.0,
        "critic": 0.0,
    }
    if critic == "separate":  # a value model from the policy's backbone: its own weights, grads, states, activations
        body = n - (0 if shape.tie_embeddings else shape.vocab * shape.hidden)
        out["critic"] = body * (p.weights + p.grads + (2.0 if optim_8bit else p.optimizer)) + out["activations"] - logits
    out["states"] = out["weights"] + out["gradients"] + out["optimizer"] + out["reference"] + out["critic"]
    out["peak"] = out["states"] + max(out["activations"], out["kv_cache"])
    return out


def gpus_needed(mem: dict[str, float], gpu_mem_gb: float, *, usable: float = 0.9, max_gpus: int = 4096) -> int | None:
    """Smallest n with states / n + max(activations, KV cache) ≤ usable × GPU memory: the states fully sharded
    (FSDP / ZeRO-3), activations and KV cache per process (each process samples its own prompts). 10 % is
    left for the CUDA context, the allocator's fragmentation and communication buffers. None: never fits."""
    budget = usable * gpu_mem_gb * GIB
    per_process = max(mem["activations"], mem["kv_cache"])
    if per_process >= budget:
        return None
    n = math.ceil(mem["states"] / (budget - per_process))
    return max(n, 1) if n <= max_gpus else None


def shape_dict(shape: ModelShape) -> dict:
    return {**asdict(shape), "params": shape.params}
