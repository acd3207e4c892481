"""A verifiers (0.4.0, `verifiers.v1`) environment, and the ScaleRL episode function that runs it.

Run with the side venv of bench/setup_verifiers.sh (verifiers pins openai<3 and mcp==2.0.0, so it stays out of
the main venv). bench/verifiers_endpoint.py drives it; as a ScaleRL environment:

    env: {name: agent, args: {episode: vf_count_tool:episode, tasks: [...]}}      # PYTHONPATH=bench

The verifiers side is a plugin module, as verifiers loads them (`taskset.id: vf_count_tool` imports this module
and takes the Taskset and the Harness it exports in `__all__`):

- `CountTask`: the task is a prompt; its `@reward` is the share of digit characters in the assistant's replies
  of the trace verifiers recorded.
- `CountHarness`: the agent program. verifiers allows a harness to run its loop in-process as long as every model
  call goes through the interception `endpoint` with the rollout's `secret` (verifiers/v1/harness.py,
  `Harness.launch`). It sends the prompt with the tool `count` declared, runs the tool on the reply, sends the
  tool's answer as a tool message and asks again: two chat/completions calls. The built-in model cannot emit
  `tool_calls` (the ScaleRL endpoint does not parse them), so the harness calls the tool on every first reply,
  as tests/rollout/agent_episodes.py does.

verifiers' interception server receives those calls and relays them, native JSON with only `model` (and any
sampling the run sets: none here) overlaid, through its eval client (`EvalClientConfig`,
verifiers/v1/clients/eval.py) to `{base_url}/chat/completions` of the ScaleRL endpoint, where the episode's
calls are recorded as token ids and log-probs. `episode(base_url, task)` returns the verifiers trace's reward.
"""

from __future__ import annotations

from typing import Any

import openai
import verifiers.v1 as vf
from verifiers.v1.env import RunSlot
from verifiers.v1.types import content_text

__all__ = ["CountHarness", "CountTaskset"]

TASKSET_ID = "vf_count_tool"  # this module's name: verifiers imports a plugin by its id
TOOLS = [{"type": "function", "function": {"name": "count", "description": "the number of digits in its argument",
                                           "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}]
PROMPTS = [f"{i}*7=" for i in range(9)]

# base_url -> what verifiers recorded for that episode (its messages and reward), read by bench/verifiers_endpoint.py
RECORDED: dict[str, dict[str, Any]] = {}


def count_tool(text: str) -> str:
    return f"={sum(c.isdigit() for c in text)}"


def digit_share(replies: list[str]) -> float:
    text = "".join(replies)
    return sum(c.isdigit() for c in text) / max(len(text), 1)


class CountTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def digits(self, trace: vf.Trace) -> float:
        """The share of digits over the assistant's replies in verifiers' own record of the conversation."""
        return digit_share([content_text(m.content) or "" for m in trace.messages if m.role == "assistant"])


class CountTaskset(vf.Taskset[CountTask, vf.TasksetConfig]):
    def load(self):
        for prompt in PROMPTS:
            yield CountTask(vf.TaskData(prompt=prompt))


class CountHarness(vf.Harness[vf.HarnessConfig]):
    """Two chat/completions calls with a tool turn between them, in-process, through the interception endpoint."""

    EXECUTES_CODE = False  # the tool is a pure function: nothing of the model's runs
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        async with openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, timeout=60) as client:
            messages = [{"role": "user", "content": data.prompt}]
            first = (await client.chat.completions.create(model=ctx.model, messages=messages, tools=TOOLS)).choices[0].message.content or ""
            messages += [{"role": "assistant", "content": first},
                         {"role": "tool", "tool_call_id": "count", "content": count_tool(first)}]
            await client.chat.completions.create(model=ctx.model, messages=messages, tools=TOOLS)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


def build_env() -> vf.Env:
    """The single-agent env over this taskset, its harness on the host (subprocess runtime, no container)."""
    config = vf.SingleAgentEnvConfig(taskset={"id": TASKSET_ID}, agent={"runtime": {"type": "subprocess"}})
    return vf.load_environment(config)


def model_context(base_url: str) -> vf.ModelContext:
    """The run's model: the ScaleRL endpoint at `base_url`, reached through verifiers' eval client (chat/completions)."""
    client = vf.EvalClientConfig(base_url=base_url, api_key_var="SCALERL_ENDPOINT_KEY")  # not PRIME_API_KEY: no Prime lookup
    return vf.ModelContext(model="policy", client=client)


async def episode(base_url: str, task) -> float:
    """A ScaleRL agent episode: one verifiers episode of `task.prompt` against the endpoint at `base_url`; its reward."""
    env = build_env()  # one env per episode: `serving()` holds the interception on the env object
    async with env.serving():
        result = await env.run_slot(RunSlot(CountTask(vf.TaskData(prompt=task.prompt))), model_context(base_url))
    if not result.ok or len(result.traces) != 1:
        errors = [e.message for e in result.errors] + [e.message for t in result.traces for e in t.errors]
        raise RuntimeError(f"verifiers episode failed: {errors[:2]}")
    trace = result.traces[0]
    RECORDED[base_url] = {"messages": [{"role": m.role, "content": content_text(m.content) or ""} for m in trace.messages],
                          "reward": trace.reward, "calls": len(trace.calls)}
    return trace.reward
