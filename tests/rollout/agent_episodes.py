"""Agent episodes for tests/rollout/test_openai_endpoint.py (importable as `agent_episodes:NAME`, for env.args.episode).

The toy tool task: the policy's first reply is a call of the tool `count`, which answers with the number of digits
in it; the policy then replies once more. The reward is the share of digit characters over both replies, so a
policy learns it by writing digits (a random policy writes ~1 in 6)."""

from __future__ import annotations

import asyncio
import time

import openai

# ChatML's shape with spaces for newlines (the character vocabulary has no newline), and the tools' names in a
# system turn first: every character of it is in the built-in vocabulary
TOOLS_TEMPLATE = ("{% if tools %}<|im_start|>system tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}<|im_end|> {% endif %}"
                  "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")
TOOLS = [{"type": "function", "function": {"name": "count", "description": "the number of digits in its argument",
                                           "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}]


# one HTTP client for every synchronous episode: a client of its own would load the system's CA certificates each time
# (~70 ms) for a plain-HTTP server on 127.0.0.1
HTTP = openai.DefaultHttpxClient(verify=False)


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=60, http_client=HTTP)


def count_tool(text: str) -> str:
    return f"={sum(c.isdigit() for c in text)}"


def digit_share(replies: list[str]) -> float:
    text = "".join(replies)
    return sum(c.isdigit() for c in text) / max(len(text), 1)


def tool_episode(base_url: str, task) -> float:
    """Two turns through the `openai` client: the reply, the tool's answer as a tool message, the second reply."""
    policy = client(base_url)
    messages = [{"role": "user", "content": task.prompt}]
    first = policy.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message.content
    messages += [{"role": "assistant", "content": first}, {"role": "tool", "content": count_tool(first)}]
    second = policy.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message.content
    return digit_share([first, second])


async def async_tool_episode(base_url: str, task) -> float:
    """`tool_episode` with the asynchronous client."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=60,
                                http_client=openai.DefaultAsyncHttpxClient(verify=False))
    messages = [{"role": "user", "content": task.prompt}]
    first = (await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)).choices[0].message.content
    messages += [{"role": "assistant", "content": first}, {"role": "tool", "content": count_tool(first)}]
    second = (await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)).choices[0].message.content
    return digit_share([first, second])


def raising_episode(base_url: str, task) -> float:
    client(base_url).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task.prompt}])
    raise ValueError("the agent broke")


def slow_episode(base_url: str, task) -> float:
    time.sleep(3)
    return 1.0


async def async_slow_episode(base_url: str, task) -> float:
    await asyncio.sleep(30)
    return 1.0


def no_number_episode(base_url: str, task):
    client(base_url).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task.prompt}])
    return "yes"


def two_conversations_episode(base_url: str, task) -> float:
    """Two separate conversations in one episode: no single trajectory."""
    policy = client(base_url)
    policy.chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}])
    policy.chat.completions.create(model="policy", messages=[{"role": "user", "content": "other"}])
    return 1.0
