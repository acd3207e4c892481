"""Data-parallel strategies: `parallel.strategy` none | ddp | fsdp2, the learner's one gradient-sync seam.

The learner never branches on the strategy. It runs its models through `wrap`'s modules (whose
forward is `completion_forward`, the log-probs of a batch), accumulates micro-batches inside
`accumulating`, and calls `finish_gradients` once per update; the sampler reads the policy inside
`gathered`.

The convention every strategy keeps: the loss of a micro-batch is its sum divided by the *global*
count of tokens (or completions, or prompts) of the mini-batch, so the gradient of the global batch
is the **sum** of the ranks' gradients, never their mean. DDP and FSDP2 average by default; here
DDP's gradient buckets are all-reduced by a comm hook that sums (`_sum_buckets`) and FSDP2's
reduce-scatter is a plain SUM (divide factor 1, `set_force_sum_reduction_for_comms`). Micro-batches before the
last of a mini-batch skip the sync (`no_sync` / `set_requires_gradient_sync(False)`), so a
mini-batch costs one reduction whatever its number of micro-batches.

Every rank ends an update with the same gradient (DDP: the same summed tensors; FSDP2: shards of one
gradient whose norm is reduced over the ranks), so the non-finite skip and the clipping decision,
taken from that norm, agree across ranks without an extra collective.

    none   one process (world size 1), or ranks that run the plain module and sum gradients with
           one flat all-reduce (for models no wrapper can take; not the default)
    ddp    torch.nn.parallel.DistributedDataParallel: each rank holds the whole model and optimizer
    fsdp2  torch.distributed.fsdp.fully_shard per decoder layer and on the whole: parameters,
           gradients and optimizer moments are 1/N per rank; bf16 compute follows the precision mode
           (MixedPrecisionPolicy: bf16 parameters in compute, float32 reduction)
    dynamic the source's dynamic sharding (scalerl/distributed/dynamic_sharding.py): no gradient
           sync; groups of parameters averaged every few steps (local SGD)

`comm/bytes` (logged every step at world size > 1) is the payload this rank reduced: DDP's buckets
as its comm hook sent them (so a micro-batch that failed to skip the sync shows), every gradient
once per update for none and fsdp2 (FSDP2's parameter all-gathers not counted), the averaged
groups for dynamic.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from scalerl.distributed.context import DistContext
from scalerl.errors import ScaleRLError
from scalerl.models.logprobs import CompletionModel
from scalerl.config.plan import PrecisionPolicy

STRATEGIES = ("none", "ddp", "fsdp2", "dynamic")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks of a Hugging Face model (FSDP2's unit of sharding)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "backbone", model)
    layers = getattr(decoder, "layers", None) or getattr(decoder, "h", None)
    if layers is None:
        raise ScaleRLError(f"parallel.strategy=fsdp2: cannot find the decoder layers of {type(model).__name__} "
                           "(looked for .layers and .h); use parallel.strategy=ddp")
    return list(layers)


@dataclass
class BytesSent:
    """Gradient payload reduced since the last `end_of_step`. It is the DDP comm hook's state, apart from the
    strategy: DDP's C++ reducer holds that state, so a state leading back to the DDP module (as the strategy does)
    makes a cycle the garbage collector cannot see, and the module would keep the process group (Strategy.close)."""

    bytes: int = 0


class Strategy:
    """`none`: the plain modules; at world size > 1 a flat all-reduce sums the gradients."""

    name = "none"

    def __init__(self, ctx: DistContext, precision: PrecisionPolicy):
        self.ctx, self.precision = ctx, precision
        self._roots: list[nn.Module] = []  # the modules whose gradients this strategy syncs
        self._sent = BytesSent()  # payload reduced since the last end_of_step

    def _trainable(self) -> list[torch.Tensor]:
        return [p for root in self._roots for p in root.parameters() if p.requires_grad]

    def wrap(self, module: nn.Module, *, trainable: bool = True) -> nn.Module:
        """The module the learner calls (a `CompletionModel` or a critic). Frozen modules (the
        reference) get no gradient sync."""
        if trainable:
            self._roots.append(module)
        return module

    @contextlib.contextmanager
    def accumulating(self, sync: bool) -> Iterator[None]:
        """Around a micro-batch's forward and backward: `sync` is False for all but a mini-batch's last."""
        yield

    def finish_gradients(self) -> None:
        """After the last micro-batch's backward: every rank holds the global batch's gradient (summed)."""
        for root in self._roots:
            self.ctx.sum_gradients(root)
        self._count_gradients()

    def _count_gradients(self) -> None:
        if self.ctx.active:  # one reduction of every gradient per update (its payload, not the bytes on the wire)
            self._sent.bytes += sum(p.numel() * p.element_size() for p in self._trainable())

    def end_of_step(self, step: int, full: bool, optimizer: torch.optim.Optimizer, moments: bool = False) -> dict[str, float]:
        """After a step's updates; `full`: the replicas' weights must agree now (first and last step, before
        an evaluation or a checkpoint), `moments`: their optimizer states too (before a checkpoint).
        Returns the step's communication metrics (`comm/bytes`)."""
        sent, self._sent.bytes = self._sent.bytes, 0
        return {"comm/bytes": float(sent)} if self.ctx.active else {}

    def synchronize(self, optimizer: torch.optim.Optimizer) -> None:
        """Make every rank's weights and optimizer state the same (a no-op where they always are)."""

    @contextlib.contextmanager
    def gathered(self, module: nn.Module) -> Iterator[None]:
        """Full weights readable on `module`'s submodules for generation (a no-op unless sharded)."""
        yield

    def grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        """Clip to `max_norm` (inf: only measure); the norm of the whole (global) gradient."""
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
            norm = norm.full_tensor()
        return norm.item()

    def describe(self) -> str:
        return f"parallel: {self.name}, world size {self.ctx.world_size}"

    def close(self) -> None:
        """After training, before `shutdown`: drop every reference this strategy made to the process group (why:
        scalerl/distributed/context.py's start_process_group). Nothing to drop here; see BytesSent (DDP) and
        FSDP2Strategy.close."""


def _sum_buckets(sent, bucket):  # no annotations: DDP checks them, and this module's are strings
    """DDP comm hook: all-reduce each gradient bucket (a dist.GradBucket) with SUM (DDP's own default
    divides by the world size), counting its bytes in `sent` (a BytesSent). Returns the reduced buffer's future."""
    buffer = bucket.buffer()
    sent.bytes += buffer.numel() * buffer.element_size()
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])


class DDPStrategy(Strategy):
    name = "ddp"

    def __init__(self, ctx: DistContext, precision: PrecisionPolicy):
        super().__init__(ctx, precision)
        self._ddp: list[nn.parallel.DistributedDataParallel] = []

    def wrap(self, module: nn.Module, *, trainable: bool = True) -> nn.Module:
        if not trainable or not self.ctx.active:
            return module
        device_ids = [self.ctx.device.index] if self.ctx.device.type == "cuda" else None
        # buffers (rotary frequencies) are the same on every rank: no sync each forward (rank 0's copied once at init)
        ddp = nn.parallel.DistributedDataParallel(module, device_ids=device_ids, forward_sync_buffers=False)
        ddp.register_comm_hook(self._sent, _sum_buckets)
        self._ddp.append(ddp)
        return ddp

    @contextlib.contextmanager
    def accumulating(self, sync: bool) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if not sync:
                for ddp in self._ddp:
                    stack.enter_context(ddp.no_sync())
            yield

    def finish_gradients(self) -> None:
        pass  # the comm hook summed (and counted) every bucket during the last backward


class FSDP2Strategy(Strategy):
    name = "fsdp2"

    def __init__(self, ctx: DistContext, precision: PrecisionPolicy):
        super().__init__(ctx, precision)
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            raise ScaleRLError("parallel.strategy=fsdp2 needs a process group: start with torchrun (or scalerl train --nproc N)")
        if not precision.fused_adamw:
            raise ScaleRLError(f"parallel.strategy=fsdp2 with precision.mode={precision.mode}: its CompactAdamW does not take sharded "
                               "(DTensor) parameters yet; use precision.mode fp32 or standard, or parallel.strategy=ddp")
        self.mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        self._fsdp: list[nn.Module] = []

    def _policy(self):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.precision.autocast_dtype is None:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=getattr(torch, self.precision.autocast_dtype), reduce_dtype=torch.float32)

    def wrap(self, module: nn.Module, *, trainable: bool = True) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        if any(getattr(m, "weight", None) is not None and m.weight.dtype == torch.int8 for m in module.modules()):
            return module  # an int8 reference stays whole on every rank
        mp = self._policy() if trainable else None
        options = {"mesh": self.mesh, **({"mp_policy": mp} if mp is not None else {})}
        # decoder layers each a unit of their own: a causal LM's, or a separate critic's backbone; a value head is one unit
        has_layers = isinstance(module, CompletionModel) or hasattr(module, "backbone")
        for layer in decoder_layers(module.model if isinstance(module, CompletionModel) else module) if has_layers else []:
            fully_shard(layer, **options)
        fully_shard(module, **options)
        if trainable:
            self._roots.append(module)
        for m in module.modules():
            if hasattr(m, "set_gradient_divide_factor"):  # per FSDP module (not recursive)
                m.set_gradient_divide_factor(1.0)  # the loss is already divided by the global count: sum, not mean
                m.set_force_sum_reduction_for_comms(True)  # a plain SUM reduce-scatter (gloo has no PREMUL_SUM)
        module._get_fsdp_state()._lazy_init()  # fix the root now: the sampler may run a layer before any root forward
        self._fsdp.append(module)
        return module

    @contextlib.contextmanager
    def accumulating(self, sync: bool) -> Iterator[None]:
        for module in self._fsdp:
            module.set_requires_gradient_sync(sync)
        try:
            yield
        finally:
            for module in self._fsdp:
                module.set_requires_gradient_sync(True)

    def close(self) -> None:
        """DTensor's sharding and topology caches keep this mesh for the life of the process, and the mesh keeps the
        process group (its `_pg_registry`, read only under torch.compile; torch resolves groups by name otherwise):
        emptying that registry lets the group go when destroy_process_group drops it."""
        getattr(self.mesh, "_pg_registry", {}).clear()

    def finish_gradients(self) -> None:
        self._count_gradients()  # reduce-scatter ran in the last backward; each rank holds its shard of the summed gradient

    @contextlib.contextmanager
    def gathered(self, module: nn.Module) -> Iterator[None]:
        """All-gather every shard of `module` once and keep it gathered (no reshard after each layer's
        forward) while the sampler decodes token by token; reshard afterwards."""
        from torch.distributed.fsdp import FSDPModule

        sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]
        if not sharded:
            yield
            return
        layers = sharded[1:]
        for m in layers:
            m.set_reshard_after_forward(False, recurse=False)
        for m in sharded:
            m.unshard()
        try:
            yield
        finally:
            for m in sharded:
                m.reshard()
            for m in layers:
                m.set_reshard_after_forward(True, recurse=False)


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (FSDP2 wraps in place: its module is itself)."""
    return module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
