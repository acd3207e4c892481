"""An OpenAI-compatible endpoint in front of a rollout engine, so agent code can drive the policy being trained.

    endpoint = OpenAIEndpoint(sampler, tokenizer, template=..., stop_ids=..., defaults=SamplingParams(...)).start()
    client = openai.OpenAI(base_url=endpoint.base_url(), api_key="none")
    client.chat.completions.create(model="policy", messages=[...], tools=[...])

It serves `/v1/chat/completions` and `/v1/completions` (the subset of scalerl/rollout/openai_requests.py; anything
else is one HTTP 400 naming the field, and the server goes on) from any `Sampler` (the Hugging Face engine or
vLLM), in a uvicorn thread on 127.0.0.1. The endpoint is itself a `Sampler` that passes `sample` and
`sync_weights` on to the engine, so the rollout side hands it weights between steps as it would the engine.

Concurrent requests are batched: a request waits up to `batch_wait_s` for others, and requests with the same
sampling settings go to the engine as one `sample` call (per-request seeds keep each one's draws its own).

Episodes: agent code given `base_url(episode)` (`.../episodes/<id>/v1`) has its calls recorded for that episode:
each call's prompt token ids, and each choice's completion ids and the sampler's log-probs, exactly as sampled.
A call that continues an earlier one of the episode gets its prompt from token ids, not from re-tokenised text
(scalerl/rollout/episode_calls.py), so the episode becomes one training row (scalerl/rollout/agents.py).
Requests to the plain `base_url()` are served with the endpoint's defaults and not recorded.

Responses are OpenAI's, plus `prompt_token_ids` and each choice's `token_ids` (as vLLM returns them on request);
with `stream: true`, the same as server-sent events (one chunk per choice once sampled, then `[DONE]`).
"""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations (`Request`, imported in build_app)

import asyncio
import itertools
import logging
import queue
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import torch

from scalerl.errors import ScaleRLError
from scalerl.rollout.base import Sampler
from scalerl.rollout.episode_calls import Call, Choice, PromptBuilder
from scalerl.rollout.openai_requests import BadRequest, Sampling, parse_chat, parse_completion
from scalerl.types import SamplingParams, derive_seed

log = logging.getLogger(__name__)


def require_serve_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ScaleRLError("the OpenAI-compatible endpoint (env.name=agent) needs fastapi and uvicorn: "
                           "pip install 'scalerl[serve]'") from None


class UnknownEpisode(Exception):
    pass


@dataclass
class Stream:
    """A reply to send as server-sent events: these chunks, then `[DONE]`."""

    chunks: list[dict]


def stream_chunks(response: dict, include_usage: bool) -> Stream:
    """A whole response as the chunks OpenAI streams: each choice's text at once, its finish reason, the usage."""
    head = {k: response[k] for k in ("id", "created", "model")}
    chat = response["object"] == "chat.completion"
    kind = "chat.completion.chunk" if chat else "text_completion"
    chunks = []
    for c in response["choices"]:
        if chat:
            delta = {"index": c["index"], "delta": {"role": "assistant", "content": c["message"]["content"]}, "logprobs": c["logprobs"],
                     "finish_reason": None, "token_ids": c["token_ids"]}
            chunks += [{**head, "object": kind, "choices": [delta]},
                       {**head, "object": kind, "choices": [{"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"]}]}]
        else:
            chunks.append({**head, "object": kind, "choices": [c]})
    if include_usage:
        chunks.append({**head, "object": kind, "choices": [], "usage": response["usage"]})
    return Stream(chunks)


@dataclass
class _Episode:
    seed: int | None  # None: draws come from each request's own seed or from the episode id
    defaults: SamplingParams  # temperature, top_p, top_k and the max_tokens cap for requests that do not say
    calls: list[Call] = field(default_factory=list)
    open: bool = True


@dataclass
class _Job:
    prompt: list[int]
    params: SamplingParams
    seed: int | None
    future: Future


class OpenAIEndpoint:
    def __init__(self, sampler: Sampler, tokenizer, *, template: str | None, stop_ids: Sequence[int], defaults: SamplingParams,
                 end_of_turn: int | None = None, max_len: int | None = None, max_n: int = 16, batch_wait_s: float = 0.01,
                 host: str = "127.0.0.1", port: int = 0, device: torch.device | None = None):
        """`template`: the chat template (None: /v1/completions only); `stop_ids`: the tokens that end a completion
        (EOS, and the template's `end_of_turn` token); `defaults`: sampling for requests that do not say, and the cap
        on max_tokens; `max_len`: the model's positions (a prompt plus its completion must fit); `device`: where the
        engine's batches live (the episodes' rows are put there too)."""
        require_serve_extra()
        self.sampler, self.tokenizer, self.defaults, self.max_len, self.max_n = sampler, tokenizer, defaults, max_len, max_n
        self.stop_ids, self.batch_wait_s, self.host, self.port = set(stop_ids), batch_wait_s, host, port
        self.device = device or torch.device("cpu")
        self.prompts = PromptBuilder(tokenizer, template, stop_ids, end_of_turn)
        self._lock = threading.Lock()  # one engine call at a time: the batcher's and the rollout side's own
        self._episodes: dict[str, _Episode] = {}
        self._count = itertools.count()
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._server = self._thread = self._batcher = None
        self.batches: deque[int] = deque(maxlen=1000)  # requests per recent engine call, for a reader (tests, diagnostics)

    # The Sampler protocol: the engine's, under the lock.
    @property
    def version(self) -> int:
        return self.sampler.version

    def sample(self, prompt_ids, params: SamplingParams, seeds=None):
        with self._lock:
            return self.sampler.sample(prompt_ids, params, seeds)

    def sync_weights(self, weights: Mapping[str, torch.Tensor] | None, version: int) -> None:
        with self._lock:
            self.sampler.sync_weights(weights, version)

    # Lifecycle.
    def start(self) -> "OpenAIEndpoint":
        import uvicorn

        self._batcher = threading.Thread(target=self._serve_jobs, daemon=True, name="scalerl-endpoint-batcher")
        self._batcher.start()
        config = uvicorn.Config(build_app(self), host=self.host, port=self.port, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="scalerl-endpoint")
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise ScaleRLError(f"the OpenAI-compatible endpoint did not start on {self.host}:{self.port} (see the log above)")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._jobs.put(None)
            self._batcher.join(timeout=10)
            self._server = None

    def __enter__(self) -> "OpenAIEndpoint":
        return self if self._server is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def base_url(self, episode: str | None = None) -> str:
        root = f"http://{self.host}:{self.port}"
        return f"{root}/v1" if episode is None else f"{root}/episodes/{episode}/v1"

    # Episodes.
    def open_episode(self, seed: int | None, defaults: SamplingParams | None = None) -> str:
        """A new episode's id; its calls sample with `defaults` (default: the endpoint's) and seeds from `seed`."""
        eid = uuid.uuid4().hex[:16]
        self._episodes[eid] = _Episode(seed, defaults or self.defaults)
        return eid

    def close_episode(self, eid: str) -> list[Call]:
        """End the episode (its later calls get 404) and return its calls."""
        episode = self._episodes.pop(eid)
        episode.open = False
        return episode.calls

    def _episode(self, eid: str | None) -> _Episode:
        if eid is None:
            return _Episode(None, self.defaults)
        episode = self._episodes.get(eid)
        if episode is None:
            raise UnknownEpisode(f"episode {eid} is over (its code returned, raised or timed out) or never existed")
        return episode

    # Requests (in the server's event loop).
    async def chat(self, eid: str | None, body) -> dict | Stream:
        episode = self._episode(eid)
        req = parse_chat(body, self.max_n)
        call = self.prompts.chat(episode.calls, req)
        await self._sample(episode, eid, call, req.sampling)
        choices = [{"index": i, "message": {"role": "assistant", "content": c.text}, "finish_reason": c.finish_reason,
                    "logprobs": {"content": self._token_logprobs(c)} if req.sampling.logprobs else None, "token_ids": list(c.ids)}
                   for i, c in enumerate(call.choices)]
        response = self._response("chat.completion", req.model, call, choices)
        return stream_chunks(response, req.sampling.include_usage) if req.sampling.stream else response

    async def complete(self, eid: str | None, body) -> dict | Stream:
        episode = self._episode(eid)
        req = parse_completion(body, self.max_n, len(self.tokenizer))
        call = self.prompts.completion(episode.calls, req)
        await self._sample(episode, eid, call, req.sampling)
        choices = [{"index": i, "text": c.text, "finish_reason": c.finish_reason, "token_ids": list(c.ids),
                    "logprobs": {"tokens": [e["token"] for e in self._token_logprobs(c)], "token_logprobs": list(c.logprobs),
                                 "top_logprobs": None} if req.sampling.logprobs else None}
                   for i, c in enumerate(call.choices)]
        response = self._response("text_completion", req.model, call, choices)
        return stream_chunks(response, req.sampling.include_usage) if req.sampling.stream else response

    def _response(self, kind: str, model: str, call: Call, choices: list[dict]) -> dict:
        generated = sum(len(c.ids) for c in call.choices)
        return {"id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}", "object": kind,
                "created": int(time.time()), "model": model or "policy", "choices": choices, "prompt_token_ids": call.prompt_ids,
                "usage": {"prompt_tokens": len(call.prompt_ids), "completion_tokens": generated,
                          "total_tokens": len(call.prompt_ids) + generated}}

    def _token_logprobs(self, choice: Choice) -> list[dict]:
        tokens = self.tokenizer.convert_ids_to_tokens(list(choice.ids))
        return [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []} for t, lp in zip(tokens, choice.logprobs)]

    def _params(self, episode: _Episode, sampling: Sampling, prompt_len: int) -> SamplingParams:
        d = episode.defaults
        max_new = min(sampling.max_tokens or d.max_new_tokens, d.max_new_tokens)  # capped by the run's rollout.max_new_tokens
        if self.max_len is not None:
            if prompt_len >= self.max_len:
                raise BadRequest(f"the prompt has {prompt_len} tokens and the model has {self.max_len} positions: no room for a "
                                 "completion; shorten the conversation", "messages")
            max_new = min(max_new, self.max_len - prompt_len)
        temperature = d.temperature if sampling.temperature is None else sampling.temperature
        return replace(d, max_new_tokens=max_new, temperature=temperature, top_p=d.top_p if sampling.top_p is None else sampling.top_p,
                       n=sampling.n, min_new_tokens=min(d.min_new_tokens, max_new))

    async def _sample(self, episode: _Episode, eid: str | None, call: Call, sampling: Sampling) -> None:
        """Sample the call's choices through the batcher and record the call in its episode."""
        params = self._params(episode, sampling, len(call.prompt_ids))
        k = len(episode.calls)
        if sampling.seed is not None:
            seed = sampling.seed
        elif episode.seed is not None:
            seed = derive_seed(episode.seed, k)
        else:
            seed = derive_seed("endpoint", eid or "free", next(self._count), k)
        future: Future = Future()
        self._jobs.put(_Job(call.prompt_ids, params, seed, future))
        rows = await asyncio.wrap_future(future)
        call.choices = [self._choice(ids, logprobs, truncated, sampling.stop) for ids, logprobs, truncated in rows]
        call.version = self.version
        if eid is not None:
            if not episode.open:
                raise UnknownEpisode(f"episode {eid} ended while this call was sampled")
            episode.calls.append(call)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _choice(self, ids: list[int], logprobs: list[float], truncated: bool, stops: tuple[str, ...]) -> Choice:
        """A sampled row as the client sees it: cut after the token that completes a stop string (the string itself
        left out of the text), else ended by its stop token (not in the text) or cut at max_tokens."""
        if stops and any(s in self._decode(ids) for s in stops):
            for t in range(1, len(ids) + 1):
                text = self._decode(ids[:t])
                at = min((text.find(s) for s in stops if s in text), default=-1)
                if at >= 0:
                    return Choice(tuple(ids[:t]), tuple(logprobs[:t]), text[:at], "stop")
        if truncated:
            return Choice(tuple(ids), tuple(logprobs), self._decode(ids), "length")
        return Choice(tuple(ids), tuple(logprobs), self._decode(ids[:-1]), "stop")

    def _serve_jobs(self) -> None:
        """The batcher thread: gather the requests that arrive within `batch_wait_s` of the first, one engine call per
        group of equal sampling settings, each request's rows back to it."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            jobs, deadline = [job], time.monotonic() + self.batch_wait_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    nxt = self._jobs.get(timeout=left)
                except queue.Empty:
                    break
                if nxt is None:
                    self._jobs.put(None)  # stop after this batch
                    break
                jobs.append(nxt)
            groups: dict[SamplingParams, list[_Job]] = {}
            for j in jobs:
                groups.setdefault(j.params, []).append(j)
            for params, group in groups.items():
                self._run_group(params, group)

    def _run_group(self, params: SamplingParams, group: list[_Job]) -> None:
        try:
            seeds = None if params.temperature == 0 else [j.seed for j in group]
            rollout = self.sample([j.prompt for j in group], params, seeds)
        except Exception as err:  # the requests fail with it (HTTP 500); the server goes on
            for j in group:
                j.future.set_exception(err)
            return
        self.batches.append(len(group))
        lengths = rollout.completion_mask.sum(1).tolist()
        ids, logprobs, cut = rollout.completion_ids.tolist(), rollout.sampler_logprobs.tolist(), rollout.truncated.tolist()
        n = params.n
        for i, j in enumerate(group):
            rows = range(i * n, i * n + n)
            j.future.set_result([(ids[r][: lengths[r]], logprobs[r][: lengths[r]], cut[r]) for r in rows])


def build_app(endpoint: OpenAIEndpoint):
    """The FastAPI app: the two routes, plain and per episode, and /v1/models."""
    import json

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="ScaleRL policy endpoint")

    async def respond(handler, eid: str | None, request: Request):
        try:
            body = await request.json()
        except Exception:
            return JSONResponse(BadRequest("the request body is not valid JSON").body(), status_code=400)
        try:
            reply = await handler(eid, body)
            if isinstance(reply, Stream):
                events = [f"data: {json.dumps(chunk)}\n\n" for chunk in reply.chunks] + ["data: [DONE]\n\n"]
                return StreamingResponse(iter(events), media_type="text/event-stream")
            return JSONResponse(reply)
        except BadRequest as err:
            return JSONResponse(err.body(), status_code=400)
        except UnknownEpisode as err:
            return JSONResponse({"error": {"message": str(err), "type": "not_found", "param": None, "code": None}}, status_code=404)
        except Exception as err:
            log.exception("the endpoint failed on a request")
            message = f"sampling failed: {type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"
            return JSONResponse({"error": {"message": message, "type": "server_error", "param": None, "code": None}}, status_code=500)

    @app.post("/v1/chat/completions")
    @app.post("/episodes/{eid}/v1/chat/completions")
    async def chat(request: Request, eid: str | None = None):
        return await respond(endpoint.chat, eid, request)

    @app.post("/v1/completions")
    @app.post("/episodes/{eid}/v1/completions")
    async def complete(request: Request, eid: str | None = None):
        return await respond(endpoint.complete, eid, request)

    @app.get("/v1/models")
    @app.get("/episodes/{eid}/v1/models")
    async def models(eid: str | None = None):
        return {"object": "list", "data": [{"id": "policy", "object": "model", "created": 0, "owned_by": "scalerl"}]}

    return app
