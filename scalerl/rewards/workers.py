"""Rewards and environment scores computed in a pool of worker processes (`reward.num_workers`,
source 002: "num_workers: number of parallel environments, set from the CPU core count").

Scoring functions are plain callables `fn(*item) -> float` over tuples of arguments, e.g. an
environment's bound `env.score` over `(task, completion)` pairs. Items are cut into contiguous
chunks (about `chunks_per_worker` per worker and job) and every chunk of every job is submitted at
once, so different jobs (the environment's score and each function reward component) run
concurrently with each other, not one after another. Results come back in item order.

Rules:
- `num_workers` 0 or 1 scores in this process (no pickling, no processes).
- Workers start with `forkserver` (Linux) or `spawn`: never `fork`, which would copy a process
  whose torch threads may hold locks. Each worker runs torch with one thread.
- Scorers registered by name at construction are pickled once and unpickled once per worker (an
  environment and its task pool cross the pipe once, not per chunk); any other picklable
  callable may be passed directly and travels with each chunk.
- An exception raised by a scorer propagates to the caller, as it would in-process.
- A worker that dies during a call (segfault, `os._exit`, killed for memory) breaks the pool: every
  item of the chunks that had not come back gets `fail_value` and is counted; the pool is rebuilt
  before the call returns, so the next call runs normally. `pop_metrics()` reports the counts.
- A worker that died between calls (killed while idle) has broken the pool before the next call
  (the executor notices a death at once): the call's first submission fails, so the pool is
  rebuilt (counted as a restart, logged) and the call runs on the fresh pool, losing nothing.
- A worker that stops answering (stopped with SIGSTOP, deadlocked, swapped out) neither dies nor
  answers, so nothing breaks the pool: `deadline_s` bounds the wait instead (`health.hang.deadline_s`).
  When no chunk of a call has come back for that long, the items still out get `fail_value` and are
  counted (`reward_hung_workers` counts the calls), every worker is SIGKILLed (a stopped process dies
  of it too) and the pool is rebuilt before the call returns.
- Workers ignore SIGINT and SIGTERM (scalerl/rewards/worker_process.py), and so does the forkserver
  that starts them: the trainer stops the run gracefully on these and then closes the pool; a
  Ctrl-C or scancel reaching every process must not break the pool mid-step. Because the executor
  stops the survivors of a broken pool with SIGTERM, the pool SIGKILLs them itself before it is
  rebuilt or closed.
- Workers exit when the trainer is gone, even SIGKILLed: each holds the reading end of a pipe whose
  only writer is the trainer and exits at its end-of-file.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Mapping, Sequence

from scalerl.errors import ScaleRLError
from scalerl.types import as_score
from scalerl.rewards.worker_process import exit_with_parent, ignore_stop_signals, protect_forkserver

log = logging.getLogger(__name__)

ScoreFn = Callable[..., float]

# Worker-process state: the registered scorers, installed once by `_init_worker`.
_WORKER_SCORERS: dict[str, ScoreFn] = {}


def _init_worker(scorers_blob: bytes, trainer_alive: Any = None) -> None:
    ignore_stop_signals()  # first: a Ctrl-C or scancel is the trainer's to handle (worker_process.py)
    if trainer_alive is not None:
        exit_with_parent(trainer_alive)  # the task queue never reports the trainer's death by itself
    os.environ["OMP_NUM_THREADS"] = "1"  # before unpickling, which may import torch
    _WORKER_SCORERS.update(pickle.loads(scorers_blob))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)  # one process per core: torch threads inside would oversubscribe


def _ready(seconds: float) -> int:
    time.sleep(seconds)  # long enough for the other workers to take the other tasks
    return os.getpid()


def _score_chunk(fn: str | ScoreFn, items: list[tuple]) -> list[float]:
    scorer = _WORKER_SCORERS[fn] if isinstance(fn, str) else fn
    return [as_score(scorer(*item)) for item in items]


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """[lo, hi) bounds cutting n items into min(n, chunks) contiguous chunks whose sizes differ by at most 1."""
    k = max(1, min(n, chunks))
    size, extra = divmod(n, k)
    bounds, lo = [], 0
    for i in range(k):
        hi = lo + size + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return [b for b in bounds if b[1] > b[0]]


def default_start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


class RewardPool:
    """`num_workers` processes that score items; see the module docstring for the rules."""

    def __init__(self, num_workers: int, scorers: Mapping[str, ScoreFn] | None = None, *, start_method: str | None = None,
                 chunks_per_worker: int = 4, fail_value: float = 0.0, deadline_s: float | None = None):
        if num_workers < 0 or chunks_per_worker < 1:
            raise ValueError(f"need num_workers >= 0 and chunks_per_worker >= 1, got {num_workers} and {chunks_per_worker}")
        if start_method == "fork":
            raise ValueError("start_method fork is unsafe after torch has started threads; use forkserver or spawn")
        self.num_workers, self.chunks_per_worker, self.fail_value = num_workers, chunks_per_worker, fail_value
        self.deadline_s = deadline_s  # None: wait for the workers as long as it takes
        self._hung = 0  # calls given up on a silent worker since the last pop_metrics()
        self._silent = False  # the pool holds a silent worker: SIGKILL them all when it is shut down
        self.scorers = dict(scorers or {})
        self.start_method = start_method or default_start_method()
        self.restarts = 0  # pools rebuilt after a worker died, over the pool's life
        self._failed = 0  # items lost to dead workers since the last pop_metrics()
        self._restarts_seen = 0
        self._executor: ProcessPoolExecutor | None = None
        self._trainer_alive: tuple[Any, Any] | None = None  # (reader for the workers, writer held here only)
        self._blob = b""
        if not self.in_process:
            try:
                self._blob = pickle.dumps(self.scorers)
            except (pickle.PicklingError, TypeError, AttributeError) as err:
                raise ScaleRLError(f"reward.num_workers: the scorers {sorted(self.scorers)} cannot be sent to worker processes "
                                   f"({err}); make them picklable (module-level functions, plain objects) or set reward.num_workers=0") from None

    @property
    def in_process(self) -> bool:
        return self.num_workers <= 1

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            ctx = multiprocessing.get_context(self.start_method)
            if self.start_method == "forkserver":
                protect_forkserver()  # a SIGTERM to the whole job must not kill it (worker_process.py)
            if self._trainer_alive is None:
                self._trainer_alive = ctx.Pipe(duplex=False)
            self._executor = ProcessPoolExecutor(self.num_workers, mp_context=ctx, initializer=_init_worker,
                                                 initargs=(self._blob, self._trainer_alive[0]))
        return self._executor

    def start(self, timeout_s: float = 120.0) -> list[int]:
        """Start every worker now (so the first step does not pay for it); returns their pids.

        The first round of tasks makes the executor launch all `num_workers` processes; rounds
        repeat until each has answered (a worker that came up first may take several tasks).
        """
        if self.in_process:
            return []
        pool, pids = self._pool(), set()
        deadline = time.monotonic() + timeout_s
        while len(pids) < self.num_workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(pids)} of {self.num_workers} reward workers started within {timeout_s} s")
            pids.update(f.result() for f in [pool.submit(_ready, 0.05) for _ in range(self.num_workers)])
        return sorted(pids)

    def map_scores(self, fn: str | ScoreFn, items: Sequence[tuple]) -> list[float]:
        """[float(fn(*item)) for item in items], computed across the workers. `fn`: a registered
        scorer's name or a picklable callable."""
        return self._run([(fn, items)])[0]

    def score_all(self, jobs: Mapping[str, Sequence[tuple]]) -> dict[str, list[float]]:
        """{name: map_scores(name, items)} for registered scorers, all jobs running concurrently."""
        unknown = sorted(set(jobs) - set(self.scorers))
        if unknown:
            raise KeyError(f"no scorer registered under {unknown}; registered: {sorted(self.scorers)}")
        return dict(zip(jobs, self._run(list(jobs.items()))))

    def _resolve(self, fn: str | ScoreFn) -> ScoreFn:
        return self.scorers[fn] if isinstance(fn, str) else fn

    def _run(self, jobs: list[tuple[str | ScoreFn, Sequence[tuple]]]) -> list[list[float]]:
        if self.in_process:
            return [[as_score(self._resolve(fn)(*item)) for item in items] for fn, items in jobs]
        results = [[self.fail_value] * len(items) for _, items in jobs]
        pool, broken = self._pool(), False
        pending: list[tuple[Future | None, int, int, int]] = []
        for j, (fn, items) in enumerate(jobs):
            for lo, hi in chunk_bounds(len(items), self.num_workers * self.chunks_per_worker):
                chunk = list(items[lo:hi])
                try:
                    future: Future | None = pool.submit(_score_chunk, fn, chunk)
                except BrokenProcessPool:
                    if pending:  # a worker died while we were still submitting: those items are lost
                        future = None
                    else:  # broken before this call (a worker died while idle): nothing lost yet
                        log.warning("a reward worker process died between calls; rebuilt the pool of %d workers, "
                                    "and the call runs on it", self.num_workers)
                        self._rebuild()
                        pool = self._pool()
                        try:
                            future = pool.submit(_score_chunk, fn, chunk)
                        except BrokenProcessPool:
                            future = None
                pending.append((future, j, lo, hi))
        try:
            broken = self._collect(pending, results)
        finally:  # also when a scorer's exception propagates: never leave a broken pool behind
            if broken:
                self._rebuild()
        return results

    def _collect(self, pending: list[tuple[Future | None, int, int, int]], results: list[list[float]]) -> bool:
        """Fill `results` as the chunks come back; whether the pool is broken (a worker died, or went silent for
        `deadline_s`: then the chunks still out keep fail_value)."""
        waiting: dict[Future, tuple[int, int, int]] = {}
        broken = False
        for future, j, lo, hi in pending:
            if future is None:  # not submitted: the pool was already broken
                self._failed += hi - lo
                broken = True
            else:
                waiting[future] = (j, lo, hi)
        while waiting:
            done, _ = wait(waiting, timeout=self.deadline_s, return_when=FIRST_COMPLETED)
            if not done:  # nothing came back for deadline_s: a worker is stopped or stuck
                lost = sum(hi - lo for _, lo, hi in waiting.values())
                log.warning("a reward worker process (of reward.num_workers=%d) answered nothing for %g s "
                            "(health.hang.deadline_s); its %d item(s) get the fallback %g and the pool is replaced",
                            self.num_workers, self.deadline_s, lost, self.fail_value)
                self._failed += lost
                self._hung += 1
                self._silent = True
                return True
            for future in done:
                j, lo, hi = waiting.pop(future)
                try:
                    results[j][lo:hi] = future.result()
                except BrokenProcessPool:  # contained by design: counted, the items keep fail_value
                    self._failed += hi - lo
                    broken = True
        return broken

    def _rebuild(self) -> None:
        assert self._executor is not None
        self._shutdown()
        self.restarts += 1
        self._pool()  # a fresh executor; its workers start with the next submission

    def _shutdown(self) -> None:
        """Shut the executor down and wait for it. A broken pool has asked its surviving workers to
        stop with SIGTERM, which they ignore (module docstring), and waits for them: SIGKILL them
        first (their queues may be in a dirty state, which is why the executor stops them)."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        silent, self._silent = self._silent, False
        if silent or getattr(executor, "_broken", False):  # a silent worker never exits by itself, a stopped one not even on SIGTERM
            for process in list((getattr(executor, "_processes", None) or {}).values()):
                process.kill()  # a no-op for one already reaped (no waitpid here: the executor's thread reaps)
        executor.shutdown(wait=True, cancel_futures=True)

    def pop_metrics(self) -> dict[str, float]:
        """Items lost to dead workers and pool rebuilds since the previous call (then reset)."""
        metrics = {"reward_failed_items": float(self._failed), "reward_pool_restarts": float(self.restarts - self._restarts_seen),
                   "reward_hung_workers": float(self._hung)}
        self._failed, self._restarts_seen, self._hung = 0, self.restarts, 0
        return metrics

    def close(self) -> None:
        self._shutdown()
        if self._trainer_alive is not None:
            for end in self._trainer_alive:
                end.close()
            self._trainer_alive = None

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
