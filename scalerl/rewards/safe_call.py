"""Calling a user's reward function so that it can never crash or stall the run.

A function component (`function: module:function`, TRL's signature
`f(prompts, completions, **kwargs) -> list[float]`, sync or `async def`) runs in its own worker
process, started once and reused for every batch:

    parent ── (prompts, completions, kwargs, timeout) ──▶ worker: import once, call, floats back

Why a process and not a thread: a hung thread cannot be stopped, so it would keep its CPU and its
locks for the rest of the run. A worker that does not answer within `timeout_s` (plus a short
grace for the transfer) is killed and a fresh one is started for the next batch. `async def`
functions are additionally bounded inside the worker by `asyncio.wait_for`, so a coroutine that
overruns is cancelled without losing the worker.

A worker that dies between calls (a thread of the function calls `os._exit` after it returned,
the worker is killed for memory while idle) loses nothing: the worker acknowledges each request
("started") before it calls the function, so a worker found dead before that (not alive at
`submit`, the request could not be sent, or the pipe closed before the acknowledgement) is
replaced, counted in `restarts`, logged once per death with its exit code, and the same call goes
to the fresh worker. A worker that dies after acknowledging dies *during* the call: the call
fails with kind "died" and is not repeated (the function may be what kills it).

Worker processes follow scalerl/rewards/worker_process.py: they ignore SIGINT and SIGTERM (the
trainer stops the run gracefully and then closes them) and exit when the trainer is gone, even
SIGKILLed (an idle worker's `recv` also reports end-of-file then).

Everything that goes wrong becomes a `RewardCallError` with a `kind` (error, timeout, length,
type, died, startup) and a message naming the function; the caller decides the fallback. The
worker uses the `spawn` start method: forking a parent that holds torch's thread pools can
deadlock the child. Worker processes are daemonic (they die with the run), so a reward function
cannot itself start processes.

No torch import here: the config check (`resolve_function`) runs before torch is loaded.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import multiprocessing as mp
import os
import time
import traceback
from typing import Any, Callable

from scalerl.plugins import import_function
from scalerl.rewards.worker_process import exit_with_parent, ignore_stop_signals

log = logging.getLogger(__name__)

GRACE_S = 0.5  # beyond timeout_s: pickling the batch and the scores back
STARTUP_TIMEOUT_S = 120.0  # a fresh worker imports the user's module (which may import torch)


class RewardCallError(Exception):
    """One failed call of a reward function: `kind` names the failure, `message` explains it."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


def resolve_function(spec: str, where: str = "function") -> Callable[..., Any]:
    """The callable named by 'module:function' (dots allowed on both sides), or a one-line error."""
    return import_function(spec, where)

def as_scores(result: Any, spec: str) -> list[float]:
    """A function's result as floats; an entry that is None or not a number becomes NaN (the caller
    gives it the fallback). A result that is not a sequence is an error naming the function."""
    if isinstance(result, (str, bytes, dict)) or not hasattr(result, "__len__") or not hasattr(result, "__iter__"):
        raise RewardCallError("type", f"{spec} returned {type(result).__name__}; expected a list of floats, one per completion")
    scores = []
    for value in result:
        try:
            scores.append(math.nan if value is None else float(value))
        except (TypeError, ValueError):
            scores.append(math.nan)
    return scores


def check_length(scores: list[float], n: int, spec: str) -> list[float]:
    """A wrong-length result is an error, never broadcast or truncated."""
    if len(scores) != n:
        raise RewardCallError("length", f"{spec} returned {len(scores)} scores for {n} completions")
    return scores


def call_function(fn: Callable[..., Any], spec: str, prompts: list[str], completions: list[str],
                  kwargs: dict[str, Any], timeout_s: float) -> list[float]:
    """Call `fn` here (sync, or async under `asyncio.wait_for(timeout_s)`) and return its floats.
    This is what the worker runs; it has no protection against a blocking function by itself.
    By keyword, as TRL calls a reward function: `def f(completions, **kwargs)` takes what it names."""
    try:
        if inspect.iscoroutinefunction(fn):
            result = asyncio.run(asyncio.wait_for(fn(prompts=prompts, completions=completions, **kwargs), timeout_s))
        else:
            result = fn(prompts=prompts, completions=completions, **kwargs)
            if inspect.isawaitable(result):  # a sync wrapper that hands back a coroutine
                result = asyncio.run(asyncio.wait_for(result, timeout_s))
    except TypeError as err:
        if (hint := signature_hint(fn, spec, kwargs)) is None:  # raised inside the function: its own error
            raise
        raise TypeError(f"{err}; {hint}") from err
    return as_scores(result, spec)


def signature_hint(fn: Callable[..., Any], spec: str, kwargs: dict[str, Any]) -> str | None:
    """What to change in `fn`'s signature when it cannot take the call (prompts, completions and the columns by name),
    None when it can (a TypeError then came from inside it)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to read
        return None
    names = ["prompts", "completions", *kwargs]
    try:
        signature.bind(**dict.fromkeys(names))
    except TypeError as err:
        wanted = [p.name for p in signature.parameters.values() if p.default is p.empty
                  and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names]
        if wanted:
            return f"{spec} asks for {', '.join(map(repr, wanted))}, which the call does not pass: it passes {', '.join(names)}"
        return f"{spec} is called with {', '.join(names)} by name: add **kwargs to its signature to take only what it names ({err})"
    return None


PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # scalerl/


def user_traceback(err: BaseException) -> str:
    """The traceback from the first frame outside the scalerl package on: the reward function and what it called,
    without the frames of the worker or the in-process call (and the Python API's column wrapper) above it."""
    tb = err.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(PACKAGE + os.sep):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(err), err, tb if tb is not None else err.__traceback__))


def _worker_main(spec: str, conn) -> None:
    """Worker process: import the function once, then per request acknowledge it ("started"),
    call the function and answer (kind, payload)."""
    ignore_stop_signals()  # first: a Ctrl-C or scancel is the trainer's to handle (worker_process.py)
    parent = mp.parent_process()
    if parent is not None:
        exit_with_parent(parent.sentinel)  # a call in progress does not outlive a SIGKILLed trainer
    try:
        try:
            fn = resolve_function(spec)
        except BaseException:  # reported to the parent, which counts it; the worker then exits
            conn.send(("startup", traceback.format_exc()))
            return
        conn.send(("ready", None))
        while True:
            try:
                request = conn.recv()
            except EOFError:  # the parent is gone
                return
            if request is None:
                return
            conn.send(("started", None))  # from here on a death is a death during the call
            prompts, completions, kwargs, timeout_s = request
            try:
                reply = ("ok", call_function(fn, spec, prompts, completions, kwargs, timeout_s))
            except RewardCallError as err:
                reply = (err.kind, err.message)
            except (asyncio.TimeoutError, TimeoutError):
                reply = ("timeout", f"{spec} did not finish within {timeout_s:g} s (async, cancelled)")
            except BaseException as err:  # the user's function failed: its traceback goes back to the parent
                reply = ("error", user_traceback(err))
            conn.send(reply)
    except (BrokenPipeError, ConnectionResetError):  # the parent is gone: nobody to answer
        return


class FunctionWorker:
    """A reward function behind a process boundary: `call` returns one float per completion or
    raises `RewardCallError`; a worker that overruns `timeout_s` or dies is replaced."""

    def __init__(self, spec: str, timeout_s: float, *, startup_timeout_s: float = STARTUP_TIMEOUT_S):
        self.spec, self.timeout_s, self.startup_timeout_s = spec, timeout_s, startup_timeout_s
        self._ctx = mp.get_context("spawn")
        self._process = None
        self._conn = None
        self._ready = False
        self._pending: tuple[float, tuple] | None = None  # (time sent, request) of a submitted call
        self.restarts = 0  # workers replaced (timeout, death, failed start), over the worker's life
        self._start()

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._process = self._ctx.Process(target=_worker_main, args=(self.spec, child), daemon=True,
                                          name=f"reward:{self.spec}")
        self._process.start()
        child.close()
        self._conn, self._ready = parent, False

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
        if self._process is not None:
            self._process.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def _exit_code(self) -> int | None:
        self._process.join(timeout=5)  # the pipe closes a moment before the process is reaped
        return self._process.exitcode

    def _restart(self) -> None:
        self._kill()
        self.restarts += 1
        self._start()

    def wait_ready(self) -> None:
        """Block until the worker has imported the function (not counted against timeout_s)."""
        if self._ready:
            return
        if not self._conn.poll(self.startup_timeout_s):
            self._restart()
            raise RewardCallError("startup", f"{self.spec}: the worker did not start within {self.startup_timeout_s:g} s")
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):  # the pipe closed (or was reset): the worker is gone
            code = self._exit_code()
            self._restart()
            raise RewardCallError("startup", f"{self.spec}: the worker exited while starting (exit code {code})") from None
        if kind != "ready":
            self._restart()
            raise RewardCallError("startup", f"{self.spec}: the worker could not load the function:\n{payload}")
        self._ready = True

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def _replace_dead(self, code: int | None) -> None:
        """The worker died between calls: counted, logged once, replaced; the call it never took is not lost."""
        log.warning("reward function %s: its worker process died between calls (exit code %s); started a fresh "
                    "one, and the call goes to it", self.spec, code)
        self._restart()

    def submit(self, prompts: list[str], completions: list[str], kwargs: dict[str, Any]) -> None:
        """Send one call to the worker without waiting; `result` collects it. Several workers (and
        the trainer's own scoring) then run at the same time. A worker found dead is replaced first."""
        request = (prompts, completions, kwargs, self.timeout_s)
        fresh = False  # whether the worker was started for this call: one that dies too is not replaced again
        if self._ready and not self._process.is_alive():
            self._replace_dead(self._exit_code())
            fresh = True
        sent, fresh = self._send(request, fresh)
        self._pending = (sent, request, fresh)

    def _send(self, request: tuple, fresh: bool) -> tuple[float, bool]:
        """Send `request` once the worker is ready: (time sent, fresh). A pipe found closed means the
        worker died after the liveness check: replaced, and the request goes to the fresh worker."""
        self.wait_ready()
        try:
            self._conn.send(request)
        except (OSError, EOFError):
            code = self._exit_code()
            if fresh:
                self._restart()
                raise RewardCallError("died", f"{self.spec}: a fresh worker process died before taking the call "
                                              f"(exit code {code}); restarted") from None
            self._replace_dead(code)
            return self._send(request, True)
        return time.monotonic(), fresh

    def call(self, prompts: list[str], completions: list[str], kwargs: dict[str, Any]) -> list[float]:
        """One float (NaN for an unusable entry) per completion, within timeout_s, or RewardCallError."""
        self.submit(prompts, completions, kwargs)
        return self.result()

    def result(self) -> list[float]:
        """The submitted call's floats, waiting at most what is left of timeout_s since `submit`."""
        if self._pending is None:
            raise RuntimeError(f"{self.spec}: result() without a submitted call")
        (sent, request, fresh), self._pending = self._pending, None
        started = False
        while True:
            if not self._conn.poll(max(self.timeout_s + GRACE_S - (time.monotonic() - sent), 0.0)):
                self._restart()  # a blocked call cannot be interrupted: the process goes, a fresh one comes
                raise RewardCallError("timeout", f"{self.spec} did not return within {self.timeout_s:g} s; its worker was restarted")
            try:
                kind, payload = self._conn.recv()
            except (EOFError, OSError):  # closed; reset when it died with our request unread
                code = self._exit_code()
                if started or fresh:
                    self._restart()
                    when = "during the call" if started else "before taking the call"
                    raise RewardCallError("died", f"{self.spec}: the worker process died {when} (exit code {code}); "
                                                  "restarted") from None
                self._replace_dead(code)  # it died before taking the call: the call goes to the fresh worker
                sent, fresh = self._send(request, True)
                continue
            if kind == "started":
                started = True
                continue
            if kind != "ok":
                raise RewardCallError(kind, payload)
            return check_length(payload, len(request[1]), self.spec)

    def close(self) -> None:
        if self._conn is not None and self._process is not None and self._process.is_alive():
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass  # already gone: nothing to stop
            self._process.join(timeout=1)
        self._kill()
