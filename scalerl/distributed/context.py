"""Process-group setup and the few collectives the trainer uses.

A single process is rank 0 of world size 1 on the same code path: every collective below is then
the identity, so the training loop never branches on whether it is distributed. Under `torchrun`
(WORLD_SIZE > 1) the group is NCCL on CUDA and gloo on CPU.
"""

from __future__ import annotations

import datetime
import gc
import os
import random
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalerl.errors import ScaleRLError


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks, returned on the device `values` came from (NCCL needs
        the reduction itself on the GPU)."""
        if not self.active:
            return values
        reduced = values.to(self.device, copy=True)
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
        return reduced.to(values.device)

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """Every rank's `values` (same shape on all ranks) concatenated along dim 0 in rank order,
        on the device `values` came from: a batch statistic over the global batch."""
        if not self.active:
            return values
        local = values.to(self.device).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return torch.cat(parts).to(values.device)

    def sum_gradients(self, model: torch.nn.Module) -> None:
        """Sum gradients over ranks. The loss is already divided by the *global* token (or
        sequence) count, so the sum, not the mean, gives the gradient of the global batch."""
        if not self.active:
            return
        params = list(model.parameters())
        for p in params:  # every rank must contribute the same tensors, even for a parameter it did not use
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()

    def gather_lists(self, items: list) -> list:
        """The concatenation of every rank's list, in rank order (pickled; for small control data)."""
        if not self.active:
            return list(items)
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, list(items))
        return [item for part in gathered for item in part]

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def resolve_device(preference: str, local_rank: int = 0) -> torch.device:
    if preference == "cuda" and not torch.cuda.is_available():
        raise ScaleRLError("train.device=cuda but no CUDA GPU is visible; use train.device=cpu (or auto)")
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device_preference: str = "auto", timeout_s: float | None = None) -> DistContext:
    """Join the process group started by torchrun, or return rank 0 of 1. `timeout_s` (`health.hang.deadline_s`): how
    long a collective waits for the other ranks before it raises (torch's default is 30 minutes), so that a rank that
    stops answering is reported within it (scalerl/distributed/watchdog.py `peer_silent`). Under gloo the waiting
    ranks raise "Timed out waiting"; under NCCL the watchdog aborts the waiting process after it."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_preference, local_rank)
    if world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        timeout = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
        start_process_group("nccl" if device.type == "cuda" else "gloo", **timeout, **_restart_store(rank, world_size))
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def start_process_group(backend: str, **options) -> None:
    """`dist.init_process_group`, after importing the modules that bind `dist.group.WORLD` as a default argument at
    import: torch.distributed.fsdp (its ShardedGradScaler; transformers' models import the package when a model is
    first loaded) and torch.distributed.nn.functional, which it imports. Imported after, they hold the group past
    destroy_process_group, and with it gloo's worker threads until interpreter exit, where one still releasing a
    finished collective's tensor aborts the process ("terminate called without an active exception")."""
    import torch.distributed.fsdp  # noqa: F401

    dist.init_process_group(backend, **options)


def _restart_store(rank: int, world_size: int) -> dict:
    """After torchrun restarted the workers (TORCHELASTIC_RESTART_COUNT > 0), the agent's store still holds the
    failed attempt's keys, and a rank that reads its dead peer's address before the new one is written
    fails to connect ("Connection refused"). Each attempt gets keys of its own under a prefix."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if not attempt or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False)
    return {"store": dist.PrefixStore(f"scalerl/attempt_{attempt}", store), "rank": rank, "world_size": world_size}


def shutdown(ctx: DistContext) -> None:
    """Destroy the process group, so that gloo's worker threads end now and not at interpreter exit (see
    `start_process_group`). Call it once the roles are dropped: a model wrapped by FSDP2 sits in reference
    cycles that hold the group until the garbage collector runs, so it runs first."""
    if ctx.active and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    """Python's and torch's default generators (sampling draws from per-request seeds of its own)."""
    random.seed(seed)
    torch.manual_seed(seed)


def set_threads(threads: int | None) -> None:
    """This process's compute threads (None: torch's default)."""
    if threads:
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
