"""A two-process link over torch.distributed (gloo; NCCL for the weights between two GPUs): the learner
(rank 0) and its rollout producer (rank 1) of an asynchronous run (scalerl/rollout/async_rollout.py).

The link is a `ProcessGroupGloo` of its own over a `TCPStore` the learner opens (on all of its
addresses; the producer joins at 127.0.0.1 beside it, at the learner's node address under Ray), so
it never touches the default process group that torchrun's ranks use for their collectives. It
moves two kinds of messages, each with a tag of its own so that they never interleave:

- weights: a header (version, layout digest) and one flat buffer per dtype, in the order of the
  model's `state_dict` (`WeightLayout`); version −1 asks the producer to stop. The buffers travel on
  a process group of their own, of the run's `rollout.weight_transport`: gloo (host memory), or
  NCCL (GPU to GPU, each side on a CUDA device of its own), so they never wait behind a batch;
- objects (a scored batch and the producer's state): pickled by `torch.save`, sent as a length and
  a uint8 tensor.

gloo's receives block until their data is there (a wait with a timeout breaks the pair), so each side
runs its blocking receives on a thread of its own where it must not stall; when the other process
dies the connection closes and a blocked receive raises at once ("Connection closed by peer").
"""

from __future__ import annotations

import datetime
import io
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scalerl.errors import ScaleRLError
from scalerl.types import derive_seed

WEIGHTS_TAG, OBJECT_TAG = 11, 12
STOP = -1
CPU = torch.device("cpu")
TIMEOUT = datetime.timedelta(hours=6)  # a blocking op's limit: a learner step or a batch can legitimately take long


@dataclass(frozen=True)
class WeightLayout:
    """Which tensors a weights message holds, in order, and how they are grouped into one flat buffer per dtype."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    @classmethod
    def of(cls, state: Mapping[str, torch.Tensor]) -> "WeightLayout":
        return cls(tuple(state), tuple(tuple(t.shape) for t in state.values()), tuple(t.dtype for t in state.values()))

    @property
    def digest(self) -> int:
        """Both sides must agree on this before a buffer is read as weights (53 bits: exact in a float64 header)."""
        return derive_seed(*self.keys, *map(str, self.shapes), *map(str, self.dtypes)) >> 10

    def groups(self) -> dict[torch.dtype, list[int]]:
        out: dict[torch.dtype, list[int]] = {}
        for i, dtype in enumerate(self.dtypes):
            out.setdefault(dtype, []).append(i)
        return out

    def pack(self, state: Mapping[str, torch.Tensor], device: torch.device = CPU) -> list[torch.Tensor]:
        """One contiguous buffer per dtype on `device`, in dtype-first-seen order."""
        tensors = list(state.values())
        return [torch.cat([tensors[i].detach().reshape(-1).to(device) for i in idx]) for idx in self.groups().values()]

    def empty(self, device: torch.device = CPU) -> list[torch.Tensor]:
        sizes = [sum(torch.Size(self.shapes[i]).numel() for i in idx) for idx in self.groups().values()]
        return [torch.empty(n, dtype=dtype, device=device) for n, dtype in zip(sizes, self.groups())]

    @torch.no_grad()
    def unpack_into(self, buffers: list[torch.Tensor], state: Mapping[str, torch.Tensor]) -> None:
        """Copy the buffers into `state`'s tensors (a model's own state_dict: its parameters are written in place)."""
        targets = list(state.values())
        for buffer, idx in zip(buffers, self.groups().values()):
            offset = 0
            for i in idx:
                n = torch.Size(self.shapes[i]).numel()
                targets[i].copy_(buffer[offset:offset + n].view(self.shapes[i]))
                offset += n


def check_transport(transport: str, device: torch.device, who: str) -> None:
    """A one-line error when `transport` cannot run on `device` (NCCL needs a CUDA device and torch built with it)."""
    if transport == "nccl" and (device.type != "cuda" or not dist.is_nccl_available()):
        raise ScaleRLError(f"rollout.weight_transport=nccl needs the {who} on a CUDA GPU with NCCL (it is on {device}"
                           f"{'' if dist.is_nccl_available() else ', and this torch has no NCCL'}); use rollout.weight_transport=gloo")


def _weights_group(store: dist.Store, rank: int, transport: str, device: torch.device) -> dist.ProcessGroup:
    prefix = dist.PrefixStore(f"scalerl-async-weights-{transport}", store)
    if transport == "gloo":
        return dist.ProcessGroupGloo(prefix, rank, 2, TIMEOUT)
    torch.cuda.set_device(device)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = TIMEOUT
    return dist.ProcessGroupNCCL(prefix, rank, 2, options)


class PairLink:
    """rank 0 (the learner) opens the store with `PairLink.listen()`; rank 1 joins with `PairLink.join(host, port, ...)`.
    `transport` carries the weight buffers: "gloo" (CPU buffers) or "nccl" (buffers on `device`, a CUDA GPU)."""

    def __init__(self, store: dist.Store, rank: int, transport: str = "gloo", device: torch.device = CPU):
        self.rank, self.peer, self.store = rank, 1 - rank, store
        self.device = device if transport == "nccl" else CPU
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("scalerl-async", store), rank, 2, TIMEOUT)
        self.weights = _weights_group(store, rank, transport, self.device)

    @classmethod
    def listen(cls) -> tuple[dist.TCPStore, int]:
        """The learner's store on a free port (for the producer to join) and that port."""
        store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=TIMEOUT, wait_for_workers=False)
        return store, store.port

    @classmethod
    def join(cls, host: str, port: int, transport: str = "gloo", device: torch.device = CPU) -> "PairLink":
        return cls(dist.TCPStore(host, port, 2, False, timeout=TIMEOUT), 1, transport, device)

    def _send(self, tensor: torch.Tensor, tag: int, group: dist.ProcessGroup | None = None) -> None:
        (group or self.group).send([tensor], self.peer, tag).wait()

    def _recv(self, tensor: torch.Tensor, tag: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
        (group or self.group).recv([tensor], self.peer, tag).wait()
        return tensor

    def send_weights(self, layout: WeightLayout, state: Mapping[str, torch.Tensor] | None, version: int) -> None:
        """Send `state` as policy `version` (None with version STOP: the stop message)."""
        self._send(torch.tensor([float(version), float(layout.digest)], dtype=torch.float64), WEIGHTS_TAG)
        if state is not None:
            for buffer in layout.pack(state, self.device):
                self._send(buffer, WEIGHTS_TAG, self.weights)

    def recv_weights(self, layout: WeightLayout) -> tuple[int, list[torch.Tensor] | None]:
        """(version, buffers on the link's device), or (STOP, None)."""
        version, digest = self._recv(torch.empty(2, dtype=torch.float64), WEIGHTS_TAG).tolist()
        if int(version) == STOP:
            return STOP, None
        if int(digest) != layout.digest:
            raise RuntimeError("the learner's weights do not match the producer's model (different keys, shapes or dtypes); "
                               "both must be built from the same config")
        buffers = [self._recv(buffer, WEIGHTS_TAG, self.weights) for buffer in layout.empty(self.device)]
        if self.device.type == "cuda":  # NCCL's wait orders this thread's stream only: the buffers are read on another
            torch.cuda.synchronize(self.device)
        return int(version), buffers

    def send_object(self, obj: object) -> None:
        data = io.BytesIO()
        torch.save(obj, data)
        payload = torch.frombuffer(bytearray(data.getbuffer()), dtype=torch.uint8)
        self._send(torch.tensor([payload.numel()], dtype=torch.int64), OBJECT_TAG)
        self._send(payload, OBJECT_TAG)

    def recv_object(self) -> object:
        n = int(self._recv(torch.empty(1, dtype=torch.int64), OBJECT_TAG))
        payload = self._recv(torch.empty(n, dtype=torch.uint8), OBJECT_TAG)
        return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)  # our own producer's data
