"""A two-process link over torch.distributed's gloo backend: the learner (rank 0) and its rollout
producer (rank 1) of an asynchronous run (scalerl/trainer/async_rollout.py).

The link is a `ProcessGroupGloo` of its own over a `TCPStore` the learner opens on 127.0.0.1, so
it never touches the default process group that torchrun's ranks use for their collectives. It
moves two kinds of messages, each with a tag of its own so that they never interleave:

- weights: a header (version, layout digest) and one flat buffer per dtype, in the order of the
  model's `state_dict` (`WeightLayout`); version −1 asks the producer to stop;
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

from scalerl.types import derive_seed

WEIGHTS_TAG, OBJECT_TAG = 11, 12
STOP = -1
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

    def pack(self, state: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """One contiguous CPU buffer per dtype, in dtype-first-seen order."""
        tensors = list(state.values())
        return [torch.cat([tensors[i].detach().reshape(-1).cpu() for i in idx]) for idx in self.groups().values()]

    def empty(self) -> list[torch.Tensor]:
        sizes = [sum(torch.Size(self.shapes[i]).numel() for i in idx) for idx in self.groups().values()]
        return [torch.empty(n, dtype=dtype) for n, dtype in zip(sizes, self.groups())]

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


class PairLink:
    """rank 0 (the learner) opens the store with `PairLink.open()`; rank 1 joins with `PairLink.join(port)`."""

    def __init__(self, store: dist.Store, rank: int):
        self.rank, self.peer, self.store = rank, 1 - rank, store
        self.group = dist.ProcessGroupGloo(dist.PrefixStore("scalerl-async", store), rank, 2, TIMEOUT)

    @classmethod
    def listen(cls) -> tuple[dist.TCPStore, int]:
        """The learner's store on a free port (for the producer to join) and that port."""
        store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=TIMEOUT, wait_for_workers=False)
        return store, store.port

    @classmethod
    def join(cls, port: int) -> "PairLink":
        return cls(dist.TCPStore("127.0.0.1", port, 2, False, timeout=TIMEOUT), rank=1)

    def _send(self, tensor: torch.Tensor, tag: int) -> None:
        self.group.send([tensor], self.peer, tag).wait()

    def _recv(self, tensor: torch.Tensor, tag: int) -> torch.Tensor:
        self.group.recv([tensor], self.peer, tag).wait()
        return tensor

    def send_weights(self, layout: WeightLayout, state: Mapping[str, torch.Tensor] | None, version: int) -> None:
        """Send `state` as policy `version` (None with version STOP: the stop message)."""
        self._send(torch.tensor([float(version), float(layout.digest)], dtype=torch.float64), WEIGHTS_TAG)
        if state is not None:
            for buffer in layout.pack(state):
                self._send(buffer, WEIGHTS_TAG)

    def recv_weights(self, layout: WeightLayout) -> tuple[int, list[torch.Tensor] | None]:
        """(version, buffers), or (STOP, None)."""
        version, digest = self._recv(torch.empty(2, dtype=torch.float64), WEIGHTS_TAG).tolist()
        if int(version) == STOP:
            return STOP, None
        if int(digest) != layout.digest:
            raise RuntimeError("the learner's weights do not match the producer's model (different keys, shapes or dtypes); "
                               "both must be built from the same config")
        return int(version), [self._recv(buffer, WEIGHTS_TAG) for buffer in layout.empty()]

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
