"""`rollout.mode: async`: the learner's side of an asynchronous run (PipelineRL-k).

    learner process                                   producer process (producer.py)   
    ───────────────                                   ────────────────────────────────────
    produce(s)   ← batch s + the producer's state ←   samples batch s with weights v >= s − 1 − k
    learn(batch s)                                    samples batch s + 1, s + 2, … (admission)
    sync_weights → weights v = s, version →           takes the newest weights between batches

`AsyncRollout` implements the same `RolloutSide` interface as the `RolloutWorker`
(scalerl/rollout/base.py); its evaluation runs on a local RolloutWorker over the learner's own
modules (`local`), so held-out scores are of the learner's newest weights. Batches and weights move over a pair link (scalerl/distributed/pair_link.py): gloo, and
for the weights `rollout.weight_transport` (gloo, or NCCL between two GPUs).

Weights change between batches, not between the tokens of one generation: every row of a batch was
sampled by one version, `ScoredBatch.policy_version`, and the learner's off-policy path (π_old
recomputed, the sampler's log-probs through `algorithm.tis_cap` or `off_policy_mask`) corrects for
it. Checkpoints keep the producer's state after the last batch the learner took; batches queued or
in flight at a stop are sampled again on resume from the same prompts and seeds, so a resumed run
neither repeats nor skips prompts. Their number is said when the producer stops.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from scalerl.config import Config
from scalerl.distributed.pair_link import STOP, PairLink, WeightLayout
from scalerl.distributed.watchdog import HeartbeatWatch, Hung, wait_answered
from scalerl.errors import ScaleRLError
from scalerl.rollout.worker import RolloutWorker
from scalerl.rollout.producer import ProducerSpec, producer_main
from scalerl.types import ScoredBatch


class ProducerProcess(Protocol):
    """Where the producer runs: a process of this machine (`SpawnedProducer`) or a Ray actor
    (scalerl/rollout/ray_producer.py, `scalerl launch --ray`). `host` is the address the producer
    reaches the learner's store at."""

    host: str

    def threads(self, config: Config) -> int: ...
    def device(self, config: Config, learner: torch.device) -> str | None: ...  # None: the config's train.device
    def start(self, spec: ProducerSpec) -> None: ...
    def alive(self) -> bool: ...
    def join(self, timeout: float) -> None: ...
    def kill(self) -> None: ...
    def report(self) -> dict[str, Any]: ...  # {"produced": last step} or {"error": traceback}; {} when it died without one
    def describe_exit(self) -> str: ...
    def describe(self) -> str: ...  # where it runs, for the log


class SpawnedProducer:
    """The producer as a spawned process beside the learner."""

    host = "127.0.0.1"

    def __init__(self) -> None:
        self.process, self.errors = None, None

    def threads(self, config: Config) -> int:
        return config.rollout.producer_threads or max(1, (os.cpu_count() or 2) // 2)

    def device(self, config: Config, learner: torch.device) -> str | None:
        """NCCL joins two GPUs, never one with itself: the producer takes the GPU after the learner's."""
        if config.rollout.weight_transport != "nccl":
            return None
        index = (learner.index or 0) + 1
        if index >= torch.cuda.device_count():
            raise ScaleRLError(f"rollout.weight_transport=nccl with the producer beside the learner needs a second GPU (cuda:{index}; "
                               f"{torch.cuda.device_count()} visible); use rollout.weight_transport=gloo, or scalerl launch --ray "
                               "--rollout-gpus 1 to place it on a GPU of its own")
        return f"cuda:{index}"

    def start(self, spec: ProducerSpec) -> None:
        mp = multiprocessing.get_context("spawn")
        self.errors = mp.SimpleQueue()
        self.process = mp.Process(target=producer_main, args=(spec, self.errors), name="scalerl-producer", daemon=True)
        self.process.start()

    def alive(self) -> bool:
        return self.process.is_alive()

    def join(self, timeout: float) -> None:
        self.process.join(timeout)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def report(self) -> dict[str, Any]:
        return self.errors.get() if self.errors is not None and not self.errors.empty() else {}

    def describe_exit(self) -> str:
        return f"exit code {self.process.exitcode}"

    def describe(self) -> str:
        return f"process {self.process.pid} beside the learner"


class AsyncRollout:
    """The rollout side as the learner sees it in async mode: batches come from a producer process."""

    shares_weights = False  # the producer holds its own copy: publish_weights hands over state dicts

    def __init__(self, local: RolloutWorker, config: Config, run_dir: Path, producer: ProducerProcess | None = None):
        if local.ctx.active:
            raise ScaleRLError("rollout.mode=async runs one learner process for now (with its producer process); launch it "
                               "without torchrun (nproc 1), or use rollout.mode=sync for several ranks")
        self.local, self.config, self.run_dir = local, config, run_dir
        self.producer: ProducerProcess = producer or SpawnedProducer()
        self.started = False
        self.state = local.state_dict()  # the producer's state after the last batch taken (a new run: the start)
        self._version = 0
        self.weights: Mapping[str, torch.Tensor] | None = None
        self.link, self.layout = None, None
        self.watch: HeartbeatWatch | None = None  # the producer's heartbeat (scalerl/distributed/watchdog.py)
        self.hung: Hung | None = None  # the producer stopped answering (it was killed)
        self.hung_raised = False
        self.start_step, self.taken = 0, 0  # the producer's first step − 1; batches received since
        self.staleness_max = 0

    @property
    def version(self) -> int:
        return self._version

    def start(self, last_step: int) -> None:
        """Spawn the producer for the steps after `last_step` and hand it the current weights."""
        self.start_step = last_step
        store, port = PairLink.listen()
        spec = ProducerSpec(self.config, self.producer.host, port, last_step, self.state, self.run_dir,
                            self.producer.threads(self.config), self.producer.device(self.config, self.local.ctx.device))
        self.producer.start(spec)
        self.started = True
        self.watch = HeartbeatWatch(port)
        transport, device = self.config.rollout.weight_transport, self.local.ctx.device
        self.link = self._answered(lambda: PairLink(store, 0, transport, device), "joined no link")
        print(f"async: the rollout producer is {self.producer.describe()}", file=sys.stderr)
        self.layout = WeightLayout.of(self.weights)
        self._answered(lambda: self.link.send_weights(self.layout, self.weights, self._version), "took no weights")

    def _answered(self, transfer, waiting: str):
        """`transfer()` (a blocking exchange with the producer), given up when the producer dies (its traceback is the
        error) or its heartbeat is silent past the deadline (`health.hang`; before its first beat: `startup_s`)."""
        hang = self.config.health.hang
        return wait_answered(transfer, alive=self.producer.alive, silent_s=self.watch.silent_s,
                             limit_s=lambda: hang.deadline_s if self.watch.started else hang.startup_s,
                             on_death=lambda: self._fail(None), on_silence=lambda s: self._hung(s, waiting))

    def _hung(self, silent_s: float, waiting: str):
        """The producer stopped answering: it is killed (a stopped process too), and the run stops; a resume starts a
        fresh producer from the state after the last batch taken, as after any stop."""
        hang = self.config.health.hang
        setting = f"health.hang.deadline_s={hang.deadline_s:g}" if self.watch.started else f"health.hang.startup_s={hang.startup_s:g}"
        where = self.producer.describe() if self.watch.started else "starting"
        self.producer.kill()
        self.hung = Hung(f"the async rollout producer ({where}) sent no heartbeat for {silent_s:.0f} s ({setting}) and {waiting}; "
                         "it was killed", part="async rollout producer")
        self.hung_raised = True
        raise self.hung

    def _fail(self, err: BaseException | None):
        trace = self.producer.report().get("error")
        if trace:
            print(trace, file=sys.stderr)
            raise ScaleRLError(f"the async rollout producer failed: {trace.strip().splitlines()[-1]} (its traceback is above)")
        raise ScaleRLError(f"the async rollout producer stopped ({self.producer.describe_exit()}): {err}") from err

    def produce(self, step: int) -> ScoredBatch:
        """Batch `step`, from the producer (started on the first call, after a resume has set the state)."""
        if self.hung is not None:  # found while the weights of the step before were sent: that step is finished
            self.hung_raised = True
            raise self.hung
        if not self.started:
            self.start(step - 1)
        try:
            message = self._answered(self.link.recv_object, f"sent no batch for step {step}")
        except RuntimeError as err:
            self.producer.join(5)
            self._fail(err)
        if message["step"] != step:
            raise RuntimeError(f"async producer sent the batch of step {message['step']} for step {step}")
        batch, self.state = message["batch"], message["state"]
        self.taken += 1
        staleness = self._version - batch.policy_version
        self.staleness_max = max(self.staleness_max, staleness)
        batch.metrics["staleness_max"] = float(self.staleness_max)  # over the run so far; `staleness` is this batch's
        return batch

    def sync_weights(self, weights: Mapping[str, torch.Tensor] | None, version: int) -> None:
        """The learner's new weights: the local sampler shares them already; the producer receives a copy."""
        self.local.sync_weights(None, version)
        self.weights, self._version = weights, version
        if self.link is not None:
            try:
                self._answered(lambda: self.link.send_weights(self.layout, weights, version), f"did not take the weights of version {version}")
            except Hung:  # the step's update is applied: the step finishes, and the next batch's request raises it
                self.hung_raised = False
            except RuntimeError as err:
                self._fail(err)

    def evaluate(self, step: int) -> float:
        """On the local worker, which runs the learner's own modules: the newest weights, not the producer's."""
        return self.local.evaluate(step)

    @property
    def last_eval_samples(self) -> list[dict] | None:
        """A few completions of the last evaluation (the local worker's)."""
        return getattr(self.local, "last_eval_samples", None)

    def save_files(self, folder: Path, rank: int) -> None:
        """Nothing: the producer's state travels with each batch (`state_dict`); replay runs synchronously only."""

    def load_files(self, folder: Path, rank: int) -> None:
        """Nothing (see `save_files`)."""

    def state_dict(self) -> dict:
        return {**self.state, "policy_version": self._version}

    def load_state_dict(self, state: dict) -> None:
        self.local.load_state_dict(state)
        self.state, self._version = state, state.get("policy_version", 0)

    def close(self) -> None:
        """Stop the producer: the batches it had queued or was sampling are discarded (and counted)."""
        if self.started:
            if self.hung is None and self.link is not None:  # a hung producer is killed already: nothing to say to it
                try:
                    self._answered(lambda: self.link.send_weights(self.layout, None, STOP), "did not take the stop")
                except (RuntimeError, ScaleRLError):  # gone or silent: it is killed below either way
                    pass
            if self.hung is not None and not self.hung_raised:  # after the last step's weights: the run is complete
                print(f"async: {self.hung}", file=sys.stderr)
            self.producer.join(0 if self.hung is not None else 30)
            report = self.producer.report()
            self.producer.kill()
            if "produced" in report and (discarded := report["produced"] - (self.start_step + self.taken)) > 0:
                print(f"async: {discarded} batch(es) the producer had sampled ahead were discarded; a resume samples them again",
                      file=sys.stderr)
            self.started = False
        self.local.close()
