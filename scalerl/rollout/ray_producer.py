"""The async producer as a Ray actor (`scalerl launch --ray`): the same `run_producer` as the spawned
process, placed in its bundle of the launch's placement group, on whichever node Ray puts it.

The learner (itself an actor, scalerl/cli/launch.py) creates it when the run's first batch is asked
for and reaches it over the same gloo pair link as a spawned producer, at the learner node's
address. Ray is imported only here and only under `scalerl launch --ray`.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.config import Config
from scalerl.errors import ScaleRLError
from scalerl.rollout.producer import ProducerSpec, run_producer


STARTUP_S = 300  # a new worker process on a busy node, importing torch


class ProducerActor:
    """Made a Ray actor class by `RayProducer.start` (`ray.remote(ProducerActor)`), so that this module imports without Ray."""

    def where(self) -> str:
        import ray

        return f"Ray actor {ray.get_runtime_context().get_actor_id()[:12]} on node {ray.util.get_node_ip_address()} (pid {os.getpid()})"

    def run(self, spec: ProducerSpec, cwd: str) -> dict[str, Any]:
        """Produce until the learner says stop; what `AsyncRollout` reads: the last step produced, or the traceback."""
        try:
            os.chdir(cwd)  # the run's relative paths mean what they mean to the learner
            return {"produced": run_producer(spec)}
        except BaseException:
            return {"error": traceback.format_exc()}


@dataclass
class RayProducer:
    """A `ProducerProcess` (scalerl/rollout/async_rollout.py) that is a Ray actor in bundle `bundle` of `placement_group`."""

    placement_group: Any
    bundle: int
    cpus: float
    gpus: float
    host: str  # the learner node's address, where the producer reaches the learner's store

    def __post_init__(self) -> None:
        self.actor, self.result, self.place = None, None, ""

    def threads(self, config: Config) -> int:
        return config.rollout.producer_threads or max(1, int(self.cpus))

    def device(self, config: Config, learner) -> None:
        return None  # the config's train.device: Ray shows the actor its own GPU(s) (--rollout-gpus), cuda:0 of them

    def start(self, spec: ProducerSpec) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=self.bundle)
        actor_class = ray.remote(ProducerActor)
        self.actor = actor_class.options(num_cpus=self.cpus, num_gpus=self.gpus, scheduling_strategy=strategy,
                                         name=f"scalerl-producer-{os.getpid()}-{spec.start_step}").remote()
        try:  # asked before `run`: the actor serves one call at a time
            self.place = ray.get(self.actor.where.remote(), timeout=STARTUP_S)
        except ray.exceptions.GetTimeoutError:
            raise ScaleRLError(f"the Ray actor of the async producer did not start within {STARTUP_S} s (see `ray status`)") from None
        self.result = self.actor.run.remote(spec, str(Path.cwd()))

    def describe(self) -> str:
        return self.place

    def alive(self) -> bool:
        import ray

        ready, _ = ray.wait([self.result], timeout=0)
        return not ready

    def join(self, timeout: float) -> None:
        import ray

        ray.wait([self.result], timeout=timeout)

    def kill(self) -> None:
        import ray

        ray.kill(self.actor)

    def report(self) -> dict[str, Any]:
        import ray

        if self.alive():
            return {}
        try:
            return ray.get(self.result)
        except ray.exceptions.RayError as err:  # the actor died (killed, out of memory, its node lost)
            return {"error": f"the Ray actor of the producer died: {err}"}

    def describe_exit(self) -> str:
        return "its Ray actor ended" if not self.alive() else "its Ray actor is still running"
