"""The producer process of an asynchronous run: samples, scores and sends batches while the learner learns.

    join the link → build policy, environment, sampler, rewards (the run's own RolloutWorker)
    → wait for the learner's first weights → for each step s:
        admission: wait until the newest weights are version >= s − 1 − max_staleness
        take the newest weights → produce batch s → queue it for sending

A third thread beats a heartbeat the learner watches (scalerl/distributed/watchdog.py): a batch
may take long, but a producer whose heartbeat is silent past `health.hang.deadline_s` is hung.
Two threads do the blocking transfers (scalerl/distributed/pair_link.py): an inbox that receives
every weights message and keeps the newest, and an outbox that sends the queued batches in order.
The staleness bound is enforced here, by admission: the producer never starts a batch whose weights
would be more than `max_staleness` versions behind the learner that will learn it, so nothing
finished is ever thrown away while the run goes on. Each batch travels with the producer's state
after it (prompt stream position, reward-pipeline state), which the learner checkpoints; a resumed
producer starts from that state, so the batches that were queued or being sampled when the run
stopped are sampled again from the same prompts and seeds (with the checkpoint's weights).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scalerl.config import Config
from scalerl.distributed.context import DistContext, resolve_device
from scalerl.distributed.pair_link import STOP, PairLink, WeightLayout, check_transport
from scalerl.distributed.watchdog import Heartbeat, beat_s
from scalerl.models.loading import load_tokenizer
from scalerl.precision.apply import autocast_context
from scalerl.distributed.context import seed_everything, set_threads
from scalerl.models.build import build_policy
from scalerl.rollout.build import build_rollout
from scalerl.types import derive_seed


@dataclass(frozen=True)
class ProducerSpec:
    config: Config
    host: str  # the learner's TCPStore: 127.0.0.1 beside it, its node's address under Ray
    port: int
    start_step: int  # the last step the learner has learned; the producer begins with start_step + 1
    state: dict[str, Any] | None  # the rollout side's state of the checkpoint resumed from (None: a new run)
    run_dir: Path
    threads: int
    device: str | None = None  # None: the config's train.device (a spawned producer under NCCL: the learner's next GPU)


class WeightInbox:
    """Receives every weights message on a thread of its own; the main thread takes the newest."""

    def __init__(self, link: PairLink, layout: WeightLayout):
        self.link, self.layout = link, layout
        self.cond = threading.Condition()
        self.newest: tuple[int, list[torch.Tensor]] | None = None
        self.version, self.stopped, self.error = -1, False, None  # the newest version received
        threading.Thread(target=self._run, name="weights-inbox", daemon=True).start()

    def _run(self) -> None:
        try:
            while True:
                version, buffers = self.link.recv_weights(self.layout)
                with self.cond:
                    if version == STOP:
                        self.stopped = True
                    else:
                        self.newest, self.version = (version, buffers), version
                    self.cond.notify_all()
                if version == STOP:
                    return
        except BaseException as err:  # the learner went away: wake the main thread, which exits
            with self.cond:
                self.error, self.stopped = err, True
                self.cond.notify_all()

    def wait_for(self, version: int) -> bool:
        """Block until weights of at least `version` arrived (True) or the learner stopped (False)."""
        with self.cond:
            self.cond.wait_for(lambda: self.version >= version or self.stopped)
            return not self.stopped

    def take(self) -> tuple[int, list[torch.Tensor]] | None:
        with self.cond:
            newest, self.newest = self.newest, None
            return newest


class BatchOutbox:
    """Sends queued objects in order on a thread of its own (a send blocks until the learner receives)."""

    def __init__(self, link: PairLink):
        self.link, self.items = link, queue.Queue()
        threading.Thread(target=self._run, name="batch-outbox", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                self.link.send_object(self.items.get())
            except BaseException:  # the learner went away; the main thread learns it from the inbox
                return

    def put(self, item: dict[str, Any]) -> None:
        self.items.put(item)


def producer_main(spec: ProducerSpec, errors) -> None:
    """The spawned process's entry point: run, report a failure's traceback on `errors`, exit."""
    try:
        produced = run_producer(spec)
        errors.put({"produced": produced})
    except BaseException:
        errors.put({"error": traceback.format_exc()})
        os._exit(1)
    os._exit(0)  # the outbox thread may still hold a batch the learner will never take: do not wait for it


def run_producer(spec: ProducerSpec) -> int:
    """Produce batches until the learner says stop or the last step is produced; returns the last step produced."""
    config = spec.config
    set_threads(spec.threads)
    device = torch.device(spec.device) if spec.device else resolve_device(config.train.device)
    check_transport(config.rollout.weight_transport, device, "producer")
    # first: the heartbeat the learner watches (a producer that stops answering is reported within
    # health.hang.deadline_s: scalerl/distributed/watchdog.py), then the link, so that if anything below
    # fails, the learner's receive fails at once
    Heartbeat(spec.host, spec.port, beat_s(config.health.hang.deadline_s))
    link = PairLink.join(spec.host, spec.port, config.rollout.weight_transport, device)
    seed_everything(derive_seed(config.train.seed, "producer"))
    ctx = DistContext(device=device)
    tokenizer = load_tokenizer(config.model)
    policy = build_policy(config, ctx.device)
    policy.eval()
    worker = build_rollout(config, ctx, spec.run_dir, policy, tokenizer, lambda: autocast_context(config.precision_policy, ctx.device),
                           announce=False)  # the trainer warned of cut prompts already
    if spec.state is not None:
        worker.load_state_dict(spec.state)
    weights = policy.state_dict()
    inbox, outbox = WeightInbox(link, WeightLayout.of(weights)), BatchOutbox(link)
    k, last = config.rollout.max_staleness, spec.start_step
    try:
        for step in range(spec.start_step + 1, config.train.steps + 1):
            wait_start = time.perf_counter()
            if not inbox.wait_for(max(step - 1 - k, 0)):  # admission: never more than k versions behind
                break
            waited = time.perf_counter() - wait_start
            if (newest := inbox.take()) is not None:
                version, buffers = newest
                inbox.layout.unpack_into(buffers, weights)
                worker.sync_weights(None if worker.shares_weights else weights, version)
            batch = worker.produce(step)
            batch.metrics["async/admission_wait_s"] = waited
            outbox.put({"step": step, "batch": batch, "state": worker.state_dict()})
            last = step
        inbox.wait_for(config.train.steps + 1)  # every batch is sent: wait for the stop (or the learner's exit)
    finally:
        worker.close()
    if inbox.error is not None and not isinstance(inbox.error, RuntimeError):
        raise inbox.error
    return last
