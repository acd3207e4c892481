"""What a run's config implies, derived once when the config is built (`Config.plan`,
`Config.precision`) and read everywhere after: the loop, the learner's epochs and micro-batches,
the lr schedule's length, the memory estimate. Nothing re-derives a batch size. No project
imports and no torch, so `scalerl --help` stays instant.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPlan:
    """One step's batch on one rank, and how the learner walks it.

    A step samples `prompts` × `group_size` = `batch_size` completions per rank; the learner makes
    `epochs` passes over them, one optimizer update per mini-batch of `mini_batch_size`
    completions, each accumulated over micro-batches of `micro_batch_size`, or, with `micro_batch_tokens`,
    of rows packed by length under that token budget (scalerl/learner/micro_batches.py).
    """

    prompts: int
    group_size: int
    batch_size: int
    mini_batch_size: int
    micro_batch_size: int
    epochs: int
    steps: int
    micro_batch_tokens: int | None = None

    @property
    def minibatches(self) -> int:
        """Optimizer updates per epoch."""
        return self.batch_size // self.mini_batch_size

    @property
    def micro_per_mini(self) -> int:
        return self.mini_batch_size // self.micro_batch_size

    @property
    def updates_per_step(self) -> int:
        return self.epochs * self.minibatches

    @property
    def total_updates(self) -> int:
        """Optimizer updates of the whole run: the lr schedule's length."""
        return self.steps * self.updates_per_step

    @property
    def single_update(self) -> bool:
        """One update per batch: a batch sampled by the learner's current weights is then exactly
        on-policy (π_old = π_θ), and its old log-probs need no extra forward pass."""
        return self.updates_per_step == 1


def batch_plan(*, prompts: int, group_size: int, mini_batch_size: int | None, micro_batch_size: int | None,
               epochs: int, steps: int, micro_batch_tokens: int | None = None) -> BatchPlan:
    """The plan, or ValueError naming the setting that does not divide."""
    batch = prompts * group_size
    mini = mini_batch_size or batch
    micro = micro_batch_size or mini
    if batch % mini:
        raise ValueError(f"train.mini_batch_size ({mini}) must divide the batch of {batch} completions (rollout.prompts_per_step x rollout.group_size)")
    if micro_batch_tokens is not None and micro_batch_size is not None:
        raise ValueError("train.micro_batch_tokens and train.micro_batch_size are both set: micro-batches are cut by tokens or by rows; "
                         "unset one of them")
    if mini % micro:
        raise ValueError(f"train.micro_batch_size ({micro}) must divide train.mini_batch_size ({mini})")
    return BatchPlan(prompts=prompts, group_size=group_size, batch_size=batch, mini_batch_size=mini,
                     micro_batch_size=micro, epochs=epochs, steps=steps, micro_batch_tokens=micro_batch_tokens)


# Positions per chunk when train.logprob_chunk_tokens is null: 2^24 / V, i.e. 64 MiB of float32 logits a chunk
# (512 positions at a 32k vocabulary, 110 at 152k). Matmuls of that size still run near the machine's peak.
AUTO_CHUNK_LOGITS = 2**24


def chunk_positions(setting: int | None, vocab: int) -> int:
    """Positions per chunk of the LM head for train.logprob_chunk_tokens `setting` (None: auto; 0: never → 0).
    A batch with no more completion positions than this keeps its whole logits (scalerl/models/logprobs.py)."""
    if setting is None:
        return max(1, AUTO_CHUNK_LOGITS // vocab)
    return setting


MODES = ("fp32", "standard", "aggressive", "compressed")


@dataclass(frozen=True)
class PrecisionPolicy:
    """What the weights, gradients, optimizer states and matrix multiplies are stored and run in.

    | mode | weights (= grads) | AdamW moments | matmuls | weight-update rounding | reference |
    |---|---|---|---|---|---|
    | fp32 | fp32 | fp32 | fp32 | - | fp32 |
    | standard | fp32 master | fp32 | bf16 (or fp16 with loss scaling) autocast | - | bf16 (or fp16) |
    | aggressive | bf16 | bf16 | fp8 (torchao on H100-class GPUs, else simulated) | error feedback | bf16 |
    | compressed | bf16 | 8-bit block-wise | bf16 | error feedback | bf16, or int8 with reference_8bit |

    standard's residual stream (the embedding's output and each layer's sum) is in the compute dtype, as
    under FSDP2's bf16 parameters or Megatron's default, unless `fp32_residual`: then autocast saves an
    fp32 residual, fp32 norm outputs and a bf16 cast of each linear layer's input per consumer.
    compressed also recomputes activations in backward by default (`model.gradient_checkpointing`, set
    when the config is built): with long completions activations outweigh its 8-bit states.
    Error feedback: bf16 weights would drop the part of each update below half an ulp; the dropped
    rounding error is kept (8-bit block-wise) and added to the next update (scalerl/precision/adamw.py).
    `fp32_lm_head`: log-probs from a float32 LM-head matmul and softmax whatever the compute dtype.
    Loss scaling (standard with `compute=fp16`): the loss is multiplied by a dynamic scale before
    backward so that fp16 activation gradients do not underflow, the fp32 gradients divided by it
    before clipping; an overflowing step is skipped and halves the scale (`next_loss_scale`).
    """

    mode: str
    autocast_dtype: str | None  # a torch dtype name, e.g. "bfloat16"; None: no autocast
    weights_dtype: str  # "float32" (master weights) or "bfloat16"
    moments: str  # AdamW's two moments: "float32", "bfloat16" or "8bit"
    fp8: str | None  # aggressive's backend: "auto" (torchao where it runs), "torchao" or "simulated"; None: no fp8
    error_feedback: bool
    reference_8bit: bool
    fp32_lm_head: bool
    loss_scaling: bool = False
    fp32_residual: bool = False  # standard: the residual stream stays float32 under autocast

    @property
    def fused_adamw(self) -> bool:
        """torch's own AdamW does the job: float32 weights and moments."""
        return self.weights_dtype == "float32" and self.moments == "float32"


def precision_policy(mode: str, *, fp8: str = "auto", error_feedback: bool = True, reference_8bit: bool = False,
                     fp32_lm_head: bool = True, compute: str = "bf16", fp32_residual: bool = False) -> PrecisionPolicy:
    """The policy of `precision.mode` (the fp8 backend `auto` is resolved at setup, where the device is known). Mode
    auto holds fp32's values until setup chooses fp32 or standard for the device (scalerl/precision/probe.py)."""
    if mode not in (*MODES, "auto"):
        raise ValueError(f"precision.mode must be one of auto, {', '.join(MODES)}, not {mode!r}")
    if reference_8bit and mode != "compressed":
        raise ValueError(f"precision.reference_8bit applies to precision.mode=compressed (not {mode})")
    if compute == "fp16" and mode != "standard":
        raise ValueError(f"precision.compute=fp16 applies to precision.mode=standard (fp32 master weights; not {mode})")
    low = mode in ("aggressive", "compressed")
    return PrecisionPolicy(mode=mode, autocast_dtype=None if mode in ("fp32", "auto") else "float16" if compute == "fp16" else "bfloat16",
                           weights_dtype="bfloat16" if low else "float32",
                           moments={"aggressive": "bfloat16", "compressed": "8bit"}.get(mode, "float32"),
                           fp8=fp8 if mode == "aggressive" else None, error_feedback=error_feedback and low,
                           reference_8bit=reference_8bit, fp32_lm_head=fp32_lm_head, loss_scaling=compute == "fp16",
                           fp32_residual=fp32_residual)


# Dynamic loss scaling (as torch.amp.GradScaler's defaults): start at 2^16, halve on an overflow, double
# after GROWTH_INTERVAL overflow-free updates in a row.
INITIAL_LOSS_SCALE, GROWTH_INTERVAL = 2.0**16, 2000


def next_loss_scale(scale: float, good_steps: int, finite: bool) -> tuple[float, int]:
    """(scale, overflow-free updates in a row) after an update whose unscaled gradient was `finite`:
    S ← S/2 and the count restarts on an overflow; S ← 2S after GROWTH_INTERVAL good updates."""
    if not finite:
        return max(scale / 2, 1.0), 0
    if good_steps + 1 >= GROWTH_INTERVAL:
        return scale * 2, 0
    return scale, good_steps + 1
