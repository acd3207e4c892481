"""The OpenAI-compatible endpoint and `env.name: agent`, for real: a uvicorn server on 127.0.0.1 driven by the
`openai` client. Episodes' token ids are the rendered conversation, their log-probs the policy's; nothing is
re-tokenised; bad requests are one 400 each; failing episodes are reward failures; and 10 steps learn a tool task."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from agent_episodes import TOOLS, TOOLS_TEMPLATE
from chat_models import chat_llama, chat_tokenizer
from test_chat_template import steer_head

from scalerl.envs.agent import AgentConfig, AgentEnv
from scalerl.models.logprobs import completion_forward
from scalerl.rollout.agents import agent_episodes, endpoint_for
from scalerl.rollout.chat import prompt_format
from scalerl.rollout.hf import HFSampler
from scalerl.types import SamplingParams

PARAMS = SamplingParams(max_new_tokens=8, temperature=1.0, n=4)
PROMPTS = ["12*34=", "7*5=", "99*9="]


def agent_env(episode: str, **args) -> AgentEnv:
    return AgentEnv(AgentConfig(episode=f"agent_episodes:{episode}", tasks=[{"prompt": p} for p in PROMPTS], eval_size=0, **args))


@pytest.fixture(scope="module")
def served():
    """A random chat Llama whose head favours <|im_end|> (turns of a few tokens), writes <s> now and then (a
    token its reply's text does not give back) and never <|im_start|>, </s>, <unk> or <pad>; the endpoint serving it."""
    tok = chat_tokenizer(TOOLS_TEMPLATE)
    model = chat_llama(tok).eval()
    fmt = prompt_format("auto", None, tok)
    steer_head(model, tok, {fmt.end_of_turn_id(): 2.5, tok.bos_token_id: 1.5},
               [tok.convert_tokens_to_ids("<|im_start|>"), tok.eos_token_id, tok.unk_token_id, tok.pad_token_id])
    sampler = HFSampler(model, pad_id=tok.pad_token_id, eos_id=fmt.stop_ids(), device=torch.device("cpu"))
    with endpoint_for(sampler, tok, fmt, PARAMS, max_len=128) as endpoint:
        batch, completions = agent_episodes(endpoint, agent_env("tool_episode"), [t for t in agent_env("tool_episode").train_tasks()],
                                            tok, PARAMS, [11, 12, 13], encode=fmt)
        yield tok, model, fmt, endpoint, batch, completions


def rendered(tok, messages) -> list[int]:
    return tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=False)["input_ids"]


def test_a_two_turn_tool_episode_is_the_rendered_conversation_with_the_policys_logprobs(served):
    tok, model, fmt, endpoint, batch, completions = served
    bos = tok.bos_token_id
    extent = batch.completion_extent().sum(1).tolist()
    plain = 0
    for b, completion in enumerate(completions):
        assert completion.reward is not None and len(completion.turns) == 3  # reply, tool answer, reply
        prompt = batch.prompt_ids[b][batch.prompt_mask[b].bool()].tolist()
        ids = batch.completion_ids[b, : extent[b]].tolist()
        first, observation, second = completion.turns
        conversation = [{"role": "user", "content": PROMPTS[b // PARAMS.n]}, {"role": "assistant", "content": first},
                        {"role": "tool", "content": observation_text(observation)}, {"role": "assistant", "content": second}]
        assert prompt == rendered(tok, conversation)[: len(prompt)] and tok.decode(prompt).endswith("<|im_start|>assistant ")
        mask = batch.completion_mask[b, : extent[b]].tolist()
        replies, joint = [t for t, m in zip(ids, mask) if m], [t for t, m in zip(ids, mask) if not m]
        assert tok.decode(replies, skip_special_tokens=True) == first + second  # trained: exactly the policy's two replies
        assert tok.decode(joint).removeprefix("<|im_end|>") == observation.removeprefix("<|im_end|>")  # read: the tool turn (and <|im_end|> after a cut reply)
        if bos not in ids:  # the whole row is the template's rendering of the conversation (less what closes the last turn)
            plain += 1
            assert prompt + ids == rendered(tok, conversation)[: len(prompt) + len(ids)]
            closing = "<|im_end|> " if batch.truncated[b] else " "  # a reply cut at max_tokens has no <|im_end|> of its own
            assert tok.decode(rendered(tok, conversation)[len(prompt) + len(ids):]) == closing
        assert completion.reward == pytest.approx(sum(c.isdigit() for c in first + second) / max(len(first + second), 1))
    assert 0 < plain < len(completions)  # both kinds of episode were sampled
    trained = batch.completion_mask.bool()
    with torch.no_grad():
        logprobs = completion_forward(model, batch).logprobs  # (B, T), teacher-forced over the rows
    assert (logprobs[trained] - batch.sampler_logprobs[trained]).abs().max().item() < 1e-5
    assert (batch.sampler_logprobs[~trained] == 0).all() and (batch.completion_attention_mask - batch.completion_mask).bool().any()
    assert max(endpoint.batches) > 1  # the episodes' concurrent requests went to the engine together


def observation_text(joint: str) -> str:
    """The tool's answer inside the template's text between the turns."""
    return joint.split("<|im_start|>tool ")[1].split("<|im_end|>")[0]


def test_the_sampled_ids_are_kept_where_re_tokenising_the_text_would_change_them(served):
    """<s> in a reply: the client's text drops it, so the text re-tokenised differs from what was sampled. The row
    keeps the sampled token, and turn 2 was sampled after it: its log-probs equal the forward over the row."""
    tok, model, fmt, endpoint, batch, completions = served
    bos = tok.bos_token_id
    rows = [b for b in range(len(completions)) if bos in batch.completion_ids[b][batch.completion_mask[b].bool()].tolist()]
    assert rows
    with torch.no_grad():
        logprobs = completion_forward(model, batch).logprobs
    for b in rows:
        completion = completions[b]
        prompt = batch.prompt_ids[b][batch.prompt_mask[b].bool()].tolist()
        ids = batch.completion_ids[b][batch.completion_attention_mask[b].bool()].tolist()
        first, observation, second = completion.turns
        conversation = [{"role": "user", "content": PROMPTS[b // PARAMS.n]}, {"role": "assistant", "content": first},
                        {"role": "tool", "content": observation_text(observation)}, {"role": "assistant", "content": second}]
        retokenised = rendered(tok, conversation)
        assert prompt + ids != retokenised[: len(prompt) + len(ids)] and bos not in retokenised[len(prompt):]
        trained = batch.completion_mask[b].bool()
        assert (logprobs[b][trained] - batch.sampler_logprobs[b][trained]).abs().max().item() < 1e-5


def test_bad_requests_get_one_400_and_the_server_goes_on(served):
    tok, _, _, endpoint, _, _ = served
    client = openai.OpenAI(base_url=endpoint.base_url(), api_key="none", max_retries=0)
    user = [{"role": "user", "content": "1+1="}]
    bad = [
        ({"messages": user, "stream": "yes"}, "stream"),
        ({"messages": user, "top_logprobs": 3, "logprobs": True}, "top_logprobs"),
        ({"messages": user, "tool_choice": "required", "tools": TOOLS}, "tool_choice"),
        ({"messages": user, "temperature": 5}, "temperature"),
        ({"messages": user, "n": 0}, "n"),
        ({"messages": [], "model": "policy"}, "messages"),
        ({"messages": user, "logit_bias": {"5": 10}}, "logit_bias"),
        ({"messages": user, "frobnicate": 1}, "frobnicate"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "images"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ]
    with httpx.Client(base_url=endpoint.base_url(), timeout=30) as http:
        for body, word in bad:
            answer = http.post("/chat/completions", json={"model": "policy", **body})
            assert answer.status_code == 400 and word in answer.json()["error"]["message"], (body, answer.text)
        answer = http.post("/completions", json={"model": "policy", "prompt": ["1+1=", "2+2="]})
        assert answer.status_code == 400 and "one request each" in answer.json()["error"]["message"]
        answer = http.post("/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert answer.status_code == 400 and "JSON" in answer.json()["error"]["message"]
        assert http.post("/chat/completions", json={"model": "p", "messages": [{"role": "user", "content": "9" * 200}]}).status_code == 400
    with pytest.raises(openai.BadRequestError, match="stop"):
        client.chat.completions.create(model="policy", messages=user, stop=["a", "b", "c", "d", "e"])
    reply = client.chat.completions.create(model="policy", messages=user, max_tokens=3, logprobs=True, stop=["9"])
    assert reply.choices[0].finish_reason in ("stop", "length") and len(reply.choices[0].logprobs.content) <= 3
    assert "9" not in reply.choices[0].message.content
    whole = client.chat.completions.create(model="policy", messages=user, max_tokens=4, seed=7, n=2)
    chunks = list(client.chat.completions.create(model="policy", messages=user, max_tokens=4, seed=7, n=2, stream=True,
                                                 stream_options={"include_usage": True}))
    streamed = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i) for i in (0, 1)]
    assert streamed == [c.message.content for c in whole.choices] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_completions_continue_from_the_sampled_ids(served):
    """/v1/completions in an episode: a prompt that extends the last prompt and reply continues from its token ids."""
    tok, _, _, endpoint, _, _ = served
    eid = endpoint.open_episode(seed=5, defaults=PARAMS)
    client = openai.OpenAI(base_url=endpoint.base_url(eid), api_key="none", max_retries=0)
    first = client.completions.create(model="policy", prompt="12*34=", max_tokens=4, logprobs=1)
    second = client.completions.create(model="policy", prompt="12*34=" + first.choices[0].text + " =3", max_tokens=4)
    calls = endpoint.close_episode(eid)
    sampled = first.choices[0].model_extra["token_ids"]
    assert calls[1].prompt_ids == calls[0].prompt_ids + sampled + tok(" =3", add_special_tokens=False)["input_ids"]
    assert second.model_extra["prompt_token_ids"] == calls[1].prompt_ids and calls[1].parent == (0, 0)
    assert first.choices[0].logprobs.token_logprobs == list(calls[0].choices[0].logprobs)
    plain = openai.OpenAI(base_url=endpoint.base_url(), api_key="none", max_retries=0)
    whole = plain.completions.create(model="policy", prompt="12*34=", max_tokens=4, seed=3)
    assert "".join(c.choices[0].text for c in plain.completions.create(model="policy", prompt="12*34=", max_tokens=4, seed=3,
                                                                       stream=True)) == whole.choices[0].text
    with pytest.raises(openai.NotFoundError):  # the episode is over
        client.completions.create(model="policy", prompt="1", max_tokens=1)


@pytest.mark.parametrize("episode, why", [("raising_episode", "raised ValueError: the agent broke"),
                                          ("slow_episode", "timed out"), ("async_slow_episode", "timed out"),
                                          ("no_number_episode", "not a finite number"),
                                          ("two_conversations_episode", "not one conversation")])
def test_a_failing_episode_is_a_reward_failure(served, episode, why, tmp_path, caplog):
    from scalerl.config import load_config
    from scalerl.distributed.context import DistContext
    from scalerl.errors import RewardsFailing
    from scalerl.rewards.pipeline import build_reward_pipeline

    tok, model, fmt, endpoint, _, _ = served
    # the slow episodes sleep 3 and 30 s; the others' real chat calls took over 0.5 s once on a loaded 2-core machine
    env, params = agent_env(episode, timeout_s=1.5), SamplingParams(max_new_tokens=4, n=2)
    batch, completions = agent_episodes(endpoint, env, env.train_tasks()[:1], tok, params, [3], encode=fmt)
    assert all(c.reward is None for c in completions) and batch.completion_mask.sum() == 0 and why in caplog.text
    def score(**failures):
        pipeline = build_reward_pipeline(load_config(overrides=failures).reward, env, group_size=2, policy=model, ctx=DistContext(),
                                         autocast=lambda: torch.autocast("cpu", enabled=False), run_dir=tmp_path)
        try:
            return pipeline(1, env.train_tasks()[:1], batch, completions)
        finally:
            pipeline.close()

    with pytest.raises(RewardsFailing, match="reward component 'env' failed on every item: 2 of 2"):
        score()  # reward.failures stops a run whose episodes all fail, as for any failing reward
    rewards, _, metrics = score(**{"reward.failures.stop_when_all_fail": False})
    assert metrics["reward/env_failures"] == 2 and rewards.tolist() == [0.0, 0.0]


def test_ten_steps_of_agent_episodes_raise_the_reward_on_a_tool_task(tmp_path):
    """The training job with env.name=agent: async episodes through the openai client, the tool's answer in between;
    the reward (the share of digits the policy writes) rises over 10 steps."""
    from conftest import tiny_overrides

    from scalerl.config import load_config
    from scalerl.distributed.context import DistContext
    from scalerl.trainer.setup import build_roles
    from scalerl.trainer.step import train_step

    tok = chat_tokenizer(TOOLS_TEMPLATE)
    tok.save_pretrained(tmp_path / "model")
    chat_llama(tok).save_pretrained(tmp_path / "model")
    args = {"episode": "agent_episodes:async_tool_episode", "tasks": [{"prompt": f"{i}*7="} for i in range(9)], "eval_size": 1}
    config = load_config(overrides=tiny_overrides(tmp_path / "runs", "agent", **{
        "model.path": str(tmp_path / "model"), "env.name": "agent", "env.args": args, "rollout.max_new_tokens": 6,
        "train.steps": 10, "eval.every": 0, "optim.lr": 1e-2}))
    rollout, learner, _ = build_roles(config, DistContext(), resume=False)
    try:
        rewards = [train_step(rollout, learner, step, learner.ctx)[1]["reward_mean"] for step in range(1, 11)]
        assert rollout.sampler.version == learner.version == 10  # the endpoint took each step's weights (their version)
    finally:
        rollout.close()
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards  # measured: 0.22 → 0.53


def test_without_the_serve_extra_one_line_names_it(monkeypatch):
    import sys

    from scalerl.errors import ScaleRLError
    from scalerl.rollout.openai_server import OpenAIEndpoint

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if not installed: `import uvicorn` raises ImportError
    with pytest.raises(ScaleRLError, match=r"^the OpenAI-compatible endpoint \(env.name=agent\) needs fastapi and uvicorn: "
                                           r"pip install 'scalerl\[serve\]'$"):
        OpenAIEndpoint(None, None, template=None, stop_ids=[2], defaults=PARAMS)


def test_an_agent_environment_that_cannot_run_fails_when_built():
    from scalerl.envs.registry import build_env
    from scalerl.errors import ScaleRLError

    with pytest.raises(ScaleRLError, match="env.args.episode: cannot import module 'no_such_agent'"):
        build_env("agent", {"episode": "no_such_agent:episode", "tasks": [{"prompt": "1"}, {"prompt": "2"}]})
    with pytest.raises(ScaleRLError, match="give data_file or tasks"):
        build_env("agent", {"episode": "agent_episodes:tool_episode"})
