"""A real verifiers environment (0.4.0, `verifiers.v1`) driving ScaleRL's OpenAI-compatible endpoint.

    bash bench/setup_verifiers.sh                           # .bench/vf-venv: ScaleRL[serve] + verifiers, beside the main venv
    OMP_NUM_THREADS=1 .bench/vf-venv/bin/python bench/verifiers_endpoint.py [--steps 10] [--plain] [--save]

The environment is bench/vf_count_tool.py: a verifiers Taskset, Task (`@reward`: the share of digits in the
replies) and in-process Harness (two chat/completions calls with the tool `count` between them), loaded by
verifiers' own loader into a `SingleAgentEnv`; verifiers' interception server relays the harness's calls through
its eval client to the episode's `base_url`. ScaleRL runs it as `env.name: agent` with
`episode: vf_count_tool:episode`.

(a) One batch of 2-turn tool episodes (3 tasks x 4) on a random-init chat Llama of the built-in character
    vocabulary (tests/rollout/test_openai_endpoint.py's model: its head favours <|im_end|>; here <s> is ruled
    out as well, so every reply's text gives its tokens back). For each row: verifiers' trace holds 4 messages
    (user, assistant, tool, assistant) from 2 calls; the row the endpoint recorded (prompt + completion ids) is
    the tokenizer's rendering of the conversation verifiers recorded, up to what closes the last turn; the
    trained tokens decode to the two replies; ScaleRL's reward is verifiers' trace reward; and the learner's
    log-probs over the rows equal the sampler's (max |diff| < 1e-5).
(b) `--steps` training steps of the training job (`build_roles` + `train_step`, what `scalerl train` runs) with
    that env: 9 tasks (1 held out), 4 x 4 episodes a step, lr 1e-2, rollout.max_new_tokens 6; reward per step.
    `--plain` trains the same run again with the same two calls made by the openai client directly
    (tests/rollout/agent_episodes.py:async_tool_episode): with the same seeds, the rewards are expected to match
    step for step if verifiers' proxy forwards the calls unchanged.

`--save` writes bench/results/verifiers_endpoint_<date>.json. The figures are from whatever machine runs it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
sys.path[:0] = [str(ROOT), str(Path(__file__).parent), str(ROOT / "tests" / "rollout")]

# bench/vf_count_tool.py: the verifiers plugin and the episode function; tests/rollout/agent_episodes.py: TOOLS_TEMPLATE,
# ChatML made of the built-in vocabulary's characters
import vf_count_tool
from agent_episodes import TOOLS_TEMPLATE
from chat_models import chat_llama, chat_tokenizer

from scalerl.envs.agent import AgentConfig, AgentEnv
from scalerl.models.logprobs import completion_forward
from scalerl.rollout.agents import agent_episodes, endpoint_for
from scalerl.rollout.chat import prompt_format
from scalerl.rollout.hf import HFSampler
from scalerl.types import SamplingParams

EPISODE = "vf_count_tool:episode"


def rendered(tok, messages) -> list[int]:
    return tok.apply_chat_template(messages, tools=vf_count_tool.TOOLS, add_generation_prompt=False)["input_ids"]


def check_episodes() -> dict:
    """(a): one batch of verifiers episodes through the endpoint; the recorded rows against verifiers' conversations."""
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=4)
    prompts = vf_count_tool.PROMPTS[:3]
    tok = chat_tokenizer(TOOLS_TEMPLATE)
    model = chat_llama(tok).eval()
    fmt = prompt_format("auto", None, tok)
    bias = torch.zeros(len(tok))
    bias[fmt.end_of_turn_id()] = 2.5  # short turns
    bias[[tok.convert_tokens_to_ids("<|im_start|>"), tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.pad_token_id]] = -1e4
    head = torch.nn.Linear(model.config.hidden_size, len(tok), bias=True)
    head.weight.data, head.bias.data = model.lm_head.weight.data.clone(), bias
    model.lm_head = head
    sampler = HFSampler(model, pad_id=tok.pad_token_id, eos_id=fmt.stop_ids(), device=torch.device("cpu"))
    env = AgentEnv(AgentConfig(episode=EPISODE, tasks=[{"prompt": p} for p in prompts], eval_size=0))
    vf_count_tool.RECORDED.clear()
    start = time.perf_counter()
    with endpoint_for(sampler, tok, fmt, params, max_len=128) as endpoint:
        batch, completions = agent_episodes(endpoint, env, env.train_tasks(), tok, params, [11, 12, 13], encode=fmt)
    seconds = time.perf_counter() - start
    recorded = list(vf_count_tool.RECORDED.values())
    extent = batch.completion_extent().sum(1).tolist()
    rows = []
    for b, completion in enumerate(completions):
        assert completion.reward is not None and len(completion.turns) == 3, (b, completion)
        first, _, second = completion.turns
        prompt_text = prompts[b // params.n]
        # verifiers' record of this episode: the same prompt and the same two replies
        trace = next(r for r in recorded if [m["content"] for m in r["messages"] if m["role"] != "tool"] == [prompt_text, first, second])
        messages = trace["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"] and trace["calls"] == 2, trace
        prompt = batch.prompt_ids[b][batch.prompt_mask[b].bool()].tolist()
        ids = batch.completion_ids[b, : extent[b]].tolist()
        whole = rendered(tok, messages)
        same = prompt + ids == whole[: len(prompt) + len(ids)]
        closing = tok.decode(whole[len(prompt) + len(ids):])
        mask = batch.completion_mask[b, : extent[b]].tolist()
        replies = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True)
        rows.append({"prompt": prompt_text, "replies": [first, second], "tool": messages[2]["content"], "tokens": len(prompt) + len(ids),
                     "row_is_rendering": same, "rest_of_rendering": closing, "trained_text_is_replies": replies == first + second,
                     "scalerl_reward": completion.reward, "verifiers_reward": trace["reward"]})
        assert same and closing in (" ", "<|im_end|> "), (b, prompt + ids, whole)
        assert replies == first + second and completion.reward == trace["reward"] == vf_count_tool.digit_share([first, second])
    trained = batch.completion_mask.bool()
    with torch.no_grad():
        logprobs = completion_forward(model, batch).logprobs  # (B, T), teacher-forced over the recorded rows
    diff = (logprobs[trained] - batch.sampler_logprobs[trained]).abs().max().item()
    assert diff < 1e-5, diff
    return {"episodes": len(completions), "verifiers_episodes_recorded": len(recorded), "seconds": round(seconds, 2),
            "max_abs_logprob_diff": diff, "trained_tokens": int(trained.sum()), "rows": rows}


def train(steps: int, episode: str = EPISODE) -> dict:
    """(b): `steps` steps of the training job with env.name=agent and the verifiers episode (or `episode`)."""
    from scalerl.config import load_config
    from scalerl.distributed.context import DistContext
    from scalerl.trainer.setup import build_roles
    from scalerl.trainer.step import train_step

    with tempfile.TemporaryDirectory() as tmp:
        tok = chat_tokenizer(TOOLS_TEMPLATE)
        tok.save_pretrained(Path(tmp) / "model")
        chat_llama(tok).save_pretrained(Path(tmp) / "model")
        args = {"episode": episode, "tasks": [{"prompt": p} for p in vf_count_tool.PROMPTS], "eval_size": 1}
        overrides = {"model.path": str(Path(tmp) / "model"), "env.name": "agent", "env.args": args, "rollout.max_new_tokens": 6,
                     "rollout.prompts_per_step": 4, "rollout.group_size": 4, "train.steps": steps, "train.threads": 1,
                     "eval.every": 0, "optim.lr": 1e-2, "log.run_dir": str(Path(tmp) / "runs"), "log.name": "vf", "log.console": "none"}
        config = load_config(overrides=overrides)
        rollout, learner, _ = build_roles(config, DistContext(), resume=False)
        per_step = []
        try:
            for step in range(1, steps + 1):
                start = time.perf_counter()
                metrics = train_step(rollout, learner, step, learner.ctx)[1]
                per_step.append({"step": step, "reward_mean": metrics["reward_mean"], "env_failures": metrics.get("reward/env_failures", 0),
                                 "seconds": round(time.perf_counter() - start, 2)})
                print(json.dumps(per_step[-1]), flush=True)
        finally:
            rollout.close()
    rewards = [s["reward_mean"] for s in per_step]
    k = min(3, len(rewards))
    return {"overrides": {k_: v for k_, v in overrides.items() if not k_.startswith(("log.", "model."))}, "steps": per_step,
            "first_3_mean": sum(rewards[:k]) / k, "last_3_mean": sum(rewards[-k:]) / k}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--plain", action="store_true", help="also train the same run with the plain openai-client episode "
                        "(tests/rollout/agent_episodes.py:async_tool_episode, the same two calls without verifiers)")
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {"date": datetime.date.today().isoformat(), "verifiers": version("verifiers"), "openai": version("openai"),
              "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
              "command": " ".join(["python", *sys.argv])}
    result["episodes"] = check_episodes()
    print(json.dumps({k: v for k, v in result["episodes"].items() if k != "rows"}), flush=True)
    if args.steps:
        result["training"] = train(args.steps)
        print(json.dumps({k: result["training"][k] for k in ("first_3_mean", "last_3_mean")}), flush=True)
    if args.steps and args.plain:
        plain = train(args.steps, "agent_episodes:async_tool_episode")
        same = [a["reward_mean"] == b["reward_mean"] for a, b in zip(result["training"]["steps"], plain["steps"])]
        result["training_plain_openai"] = {**plain, "same_reward_each_step_as_verifiers": all(same)}
        print(json.dumps({"plain": {k: plain[k] for k in ("first_3_mean", "last_3_mean")}, "same_rewards": all(same)}), flush=True)
    if args.save:
        out = RESULTS / f"verifiers_endpoint_{result['date']}.json"
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
