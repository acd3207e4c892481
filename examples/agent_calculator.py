"""Agent code as a ScaleRL environment: a calculator tool loop written against the OpenAI API (docs/agents.md).

    PYTHONPATH=examples scalerl train --set env.name=agent --set env.args.episode=agent_calculator:episode \
        --set env.args.data_file=examples/agent_calculator_tasks.jsonl --set train.steps=3

Each episode gets the base URL of the endpoint serving the policy being trained and one task (`12*34=`). The
policy may answer at once, or call the calculator by replying `c:EXPR`; the agent then sends the prompt, the
reply and the tool's answer `=VALUE A:` back, and the next reply is the answer. The reward is 1 for the right
answer. The built-in model has no chat template, so this agent uses /v1/completions; with a chat model, send
`messages` and `tools` to /v1/chat/completions instead.
"""

from __future__ import annotations

import re

import openai

CALL = re.compile(r"c:(\d+)([+*-])(\d+)=?")


def calculator(reply: str) -> str:
    """The tool: `=VALUE A:` for a call `c:A*B` (or + and -), `=? A:` for one it cannot read."""
    call = CALL.fullmatch(reply)
    if call is None:
        return "=? A:"
    a, op, b = int(call.group(1)), call.group(2), int(call.group(3))
    return f"={a * b if op == '*' else a + b if op == '+' else a - b} A:"


def episode(base_url: str, task) -> float:
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    prompt = task.prompt
    reply = client.completions.create(model="policy", prompt=prompt).choices[0].text
    if reply.startswith("c:"):  # a tool call: the prompt grows by the reply and the tool's answer, and the policy goes on
        prompt += reply + calculator(reply)
        reply = client.completions.create(model="policy", prompt=prompt).choices[0].text
    return 1.0 if reply == task.answer else 0.0
