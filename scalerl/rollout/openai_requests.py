"""The request bodies the OpenAI-compatible endpoint (scalerl/rollout/openai_server.py) accepts, checked.

The subset agent frameworks use, and nothing that would silently sample something else than asked:

    /v1/chat/completions   messages, tools (rendered by the chat template), tool_choice auto or none,
                           temperature, top_p, max_tokens (or max_completion_tokens), stop, n, seed, logprobs, stream
    /v1/completions        prompt (text, or token ids), temperature, top_p, max_tokens, stop, n, seed, logprobs, stream

`stream: true` is answered as server-sent events, the whole reply in one chunk per choice once it is sampled
(the engine samples a batch at a time, not token by token), then `[DONE]`; `stream_options.include_usage` adds
the usage chunk.

Fields the server cannot honour are refused with `BadRequest` (HTTP 400 naming the field and why) unless they
hold their neutral value (`presence_penalty: 0`, `logit_bias: {}`, ...); an unknown field is refused too, so a
client's option is never dropped without a word. `model` may be any name: the endpoint serves one policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_STOPS = 4  # as OpenAI's API
ROLES = {"system", "developer", "user", "assistant", "tool"}

# field -> the values that mean "not used" (accepted and ignored); any other value is refused
NEUTRAL: dict[str, tuple] = {
    "presence_penalty": (0, 0.0, None), "frequency_penalty": (0, 0.0, None),
    "logit_bias": (None, {}), "top_logprobs": (None, 0), "echo": (False, None), "best_of": (None, 1), "suffix": (None, ""),
    "response_format": (None, {"type": "text"}), "service_tier": (None, "auto", "default"),
}
IGNORED = {"user", "parallel_tool_calls", "metadata", "store"}  # bookkeeping fields with no effect on sampling
SAMPLING = {"model", "temperature", "top_p", "max_tokens", "n", "stop", "seed", "stream", "stream_options"}
CHAT_FIELDS = SAMPLING | {"messages", "tools", "tool_choice", "max_completion_tokens", "logprobs"}
COMPLETION_FIELDS = SAMPLING | {"prompt", "logprobs"}


class BadRequest(Exception):
    """A request the endpoint does not serve: answered with HTTP 400 and this message; the server goes on."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": None}}


@dataclass(frozen=True)
class Sampling:
    """A request's sampling fields; None: the episode's default (the run's rollout settings)."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    stream: bool = False  # answer as server-sent events
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[dict, ...]  # normalised: role, content (text), and tool_calls / tool_call_id / name where given
    tools: tuple[dict, ...] | None
    sampling: Sampling


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompt: str | tuple[int, ...]  # text, or token ids (read as they are)
    sampling: Sampling


def _number(body: dict, key: str, low: float, high: float, *, low_open: bool = False) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low < value if low_open else low <= value) or value > high:
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise BadRequest(f"{key} must be a number in {bound}, got {value!r}", key)
    return float(value)


def _int(body: dict, key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        raise BadRequest(f"{key} must be an integer >= {low}" + (f" and <= {high}" if high is not None else "") + f", got {value!r}", key)
    return value


def _check_fields(body: Any, allowed: set[str], route: str) -> dict:
    if not isinstance(body, dict):
        raise BadRequest(f"the body of {route} must be a JSON object")
    for key, value in body.items():
        if key in allowed or key in IGNORED:
            continue
        if key in NEUTRAL:
            if value not in NEUTRAL[key]:
                raise BadRequest(f"{key}={value!r} is not supported by this endpoint (it serves the policy being trained; "
                                 f"leave {key} unset)", key)
            continue
        raise BadRequest(f"unsupported field '{key}' for {route}; supported: {', '.join(sorted(allowed))}", key)
    if not isinstance(body.get("model", ""), str):
        raise BadRequest("model must be a string (any name: the endpoint serves one policy)", "model")
    return body


def _sampling(body: dict, max_n: int, logprobs: bool) -> Sampling:
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest(f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them, got {stop!r}", "stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"seed must be an integer, got {seed!r}", "seed")
    max_tokens = _int(body, "max_tokens", 1)
    if "max_completion_tokens" in body:
        if max_tokens is not None:
            raise BadRequest("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
        max_tokens = _int(body, "max_completion_tokens", 1)
    stream, options = body.get("stream"), body.get("stream_options")
    if stream not in (None, True, False):
        raise BadRequest(f"stream must be true or false, got {stream!r}", "stream")
    if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise BadRequest(f"stream_options must be {{\"include_usage\": true|false}} with stream: true, got {options!r}", "stream_options")
    return Sampling(temperature=_number(body, "temperature", 0.0, 2.0), top_p=_number(body, "top_p", 0.0, 1.0, low_open=True),
                    max_tokens=max_tokens, n=_int(body, "n", 1, max_n) or 1, stop=stops, seed=seed, logprobs=logprobs,
                    stream=bool(stream), include_usage=bool((options or {}).get("include_usage")))


def _content(message: dict, i: int) -> str:
    """A message's text: a string, null (an assistant turn that only calls tools), or a list of text parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                         for p in content):
        return "".join(p["text"] for p in content)
    raise BadRequest(f"messages[{i}].content must be text (a string or a list of text parts); images and audio are not supported",
                     f"messages[{i}].content")


def _message(message: Any, i: int) -> dict:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise BadRequest(f"messages[{i}] must be an object with a role in {sorted(ROLES)}", f"messages[{i}]")
    out = {"role": message["role"], "content": _content(message, i)}
    for key in ("tool_calls", "tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def parse_chat(body: Any, max_n: int) -> ChatRequest:
    body = _check_fields(body, CHAT_FIELDS, "/v1/chat/completions")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools)):
        raise BadRequest("tools must be a list of {\"type\": \"function\", \"function\": {\"name\": ..., ...}}", "tools")
    if body.get("tool_choice") not in (None, "auto", "none"):
        raise BadRequest(f"tool_choice={body['tool_choice']!r} is not supported (the endpoint does not constrain decoding); "
                         "use auto or none", "tool_choice")
    logprobs = body.get("logprobs")
    if logprobs not in (None, True, False):
        raise BadRequest(f"logprobs must be true or false, got {logprobs!r}", "logprobs")
    return ChatRequest(model=body.get("model", ""), messages=tuple(_message(m, i) for i, m in enumerate(messages)),
                       tools=tuple(tools) if tools else None, sampling=_sampling(body, max_n, bool(logprobs)))


def parse_completion(body: Any, max_n: int, vocab_size: int) -> CompletionRequest:
    body = _check_fields(body, COMPLETION_FIELDS, "/v1/completions")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in a list: as the client sends a batch of one
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(0 <= t < vocab_size for t in prompt):
            raise BadRequest(f"prompt token ids must be in [0, {vocab_size})", "prompt")
        prompt = tuple(prompt)
    elif not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt must be one non-empty string or one list of token ids (batches of prompts are not supported: "
                         "send one request each, they are batched on the server)", "prompt")
    logprobs = body.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs not in (0, 1)):
        raise BadRequest(f"logprobs must be 0 or 1 (the sampled token's log-prob; top alternatives are not returned), got {logprobs!r}",
                         "logprobs")
    return CompletionRequest(model=body.get("model", ""), prompt=prompt, sampling=_sampling(body, max_n, logprobs is not None))
