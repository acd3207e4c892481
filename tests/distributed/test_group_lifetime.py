"""The process group ends with `shutdown`, not at interpreter exit.

A group that outlives destroy_process_group keeps gloo's worker threads until the interpreter finalizes, and a
worker still releasing a finished collective's tensor then needs the GIL it can no longer take: the process
aborts ("terminate called without an active exception") after its work is done. Before the fix 2 and 3 of 40
runs of `python scripts/torchrun_exit_stress.py --runs 40 --busy` failed (the 3 inspected: this abort), and once
the torchrun test in CI. What held the group: DDP's comm-hook state (the strategy, which leads back to the DDP
module through C++), FSDP2's mesh (kept by DTensor's caches), reference cycles through FSDP2's state, and
`dist.group.WORLD` bound as a default argument by a module imported after the group started. The workers look for
gloo's threads in /proc.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from conftest import tiny_overrides
from ranks import free_port
from scalerl.distributed.context import DistContext, shutdown, start_process_group

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc (Linux)")


def _gloo_threads() -> list[str]:
    names = ((task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir())
    return sorted(name for name in names if "gloo" in name)


def _train_ranks(rank: int, port: int, runs, strategy: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from scalerl.config import load_config
    from scalerl.trainer.loop import train

    train(load_config(overrides=tiny_overrides(runs, strategy, **{"train.steps": 1, "checkpoint.every": 1, "parallel.strategy": strategy})))
    assert not _gloo_threads(), f"rank {rank}: {_gloo_threads()} outlived train()"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_train_leaves_no_process_group_behind(tmp_path, strategy):
    """`train()` under 2 gloo ranks (a step, an evaluation, a checkpoint): no gloo thread is left when it returns."""
    mp.spawn(_train_ranks, args=(free_port(), tmp_path / "runs", strategy), nprocs=2, join=True)


def _import_after_start(rank: int, port: int, module: str) -> None:
    assert module not in sys.modules, f"the check needs a process that has not imported {module} yet"
    start_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    importlib.import_module(module)

    shutdown(DistContext(rank=rank, world_size=2))
    assert not _gloo_threads(), f"rank {rank}: {_gloo_threads()} outlived shutdown()"


@pytest.mark.parametrize("module", ["torch.distributed.fsdp", "torch.distributed.nn.functional"])
def test_a_module_imported_after_the_start_does_not_hold_the_group(module):
    """These bind `dist.group.WORLD` as a default argument when imported (transformers' models import FSDP when a model
    is first loaded): `start_process_group` imports them first, so the default is None and the group ends at
    `shutdown`."""
    mp.spawn(_import_after_start, args=(free_port(), module), nprocs=2, join=True)
