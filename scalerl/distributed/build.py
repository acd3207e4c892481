"""`parallel.strategy` → the strategy object (scalerl/distributed/parallel.py, dynamic_sharding.py)."""

from __future__ import annotations

from scalerl.config import ParallelConfig
from scalerl.distributed.context import DistContext
from scalerl.distributed.dynamic_sharding import DynamicSharding
from scalerl.distributed.parallel import STRATEGIES, DDPStrategy, FSDP2Strategy, Strategy
from scalerl.errors import ScaleRLError
from scalerl.config.plan import PrecisionPolicy


def build_strategy(config: ParallelConfig, ctx: DistContext, precision: PrecisionPolicy) -> Strategy:
    """The strategy of `parallel.strategy`; one process: every strategy is the plain model."""
    name = config.strategy
    if name not in STRATEGIES:
        raise ScaleRLError(f"parallel.strategy: unknown strategy {name!r}; use one of {', '.join(STRATEGIES)}")
    if name == "none" or not ctx.active:
        return Strategy(ctx, precision)
    if name == "dynamic":
        return DynamicSharding(ctx, precision, config.param_groups, sync_moments=config.sync_moments)
    return DDPStrategy(ctx, precision) if name == "ddp" else FSDP2Strategy(ctx, precision)
