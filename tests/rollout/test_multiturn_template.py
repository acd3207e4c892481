"""Multi-turn episodes through a chat template: each observation is the template's next message plus the
generation prompt, the policy's turns end with its end-of-turn token, and only the policy's tokens train."""

from __future__ import annotations

import pytest
import torch
from chat_models import TEMPLATE, chat_llama, chat_tokenizer
from test_chat_template import steer_head
from test_multiturn import TASKS, LengthEcho, _setup

from scalerl.envs.scoring import completions_of
from scalerl.errors import ScaleRLError
from scalerl.models.logprobs import completion_forward
from scalerl.rollout.chat import PromptFormat, prompt_format
from scalerl.rollout.hf import HFSampler
from scalerl.rollout.multiturn import sample_episodes
from scalerl.types import SamplingParams, Task


class ToolEcho(LengthEcho):
    """LengthEcho whose observations are tool messages."""

    observation_role = "tool"


@pytest.fixture(scope="module")
def policy():
    """The chat tokenizer, a random Llama whose head favours <|im_end|> (turns of a few tokens) and a little
    </s> (some turns end the episode that way) and never writes <|im_start|>, <s>, <unk> or <pad>, and its sampler."""
    tok = chat_tokenizer()
    model = chat_llama(tok).eval()
    fmt = prompt_format("auto", "be brief", tok)
    steer_head(model, tok, {fmt.end_of_turn_id(): 3.0, tok.eos_token_id: 1.5},
               [tok.convert_tokens_to_ids("<|im_start|>"), tok.bos_token_id, tok.unk_token_id, tok.pad_token_id])
    sampler = HFSampler(model, pad_id=tok.pad_token_id, eos_id=fmt.stop_ids(), device=torch.device("cpu"))
    return tok, model, fmt, sampler


def _conversation(fmt: PromptFormat, task: Task, turns: tuple[str, ...], role: str) -> list[dict[str, str]]:
    """[system, user prompt, assistant turn₁, `role` observation₁, assistant turn₂, ...] of a transcript."""
    later = [{"role": "assistant" if i % 2 == 0 else role, "content": text} for i, text in enumerate(turns)]
    return fmt.conversation(task) + later


def _assistant_mask(ids: list[int], tok) -> list[int]:
    """1 from each `<|im_start|>assistant ` header (the completion starts after one) through the end-of-turn token
    or </s> that closes the turn: read off the tokens, independently of how the rollout built them."""
    header = tok("<|im_start|>assistant ", add_special_tokens=False)["input_ids"]
    closers = {tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id}
    mask, inside = [], True
    for t, token in enumerate(ids):
        mask.append(int(inside))
        if inside and token in closers:
            inside = False
        elif not inside and ids[max(t + 1 - len(header), 0): t + 1] == header:
            inside = True
    return mask


@pytest.mark.parametrize("env_class, role", [(LengthEcho, "user"), (ToolEcho, "tool")])  # LengthEcho names no role
def test_episode_is_the_rendered_conversation(policy, env_class, role):
    tok, _, fmt, sampler = policy
    im_end, env = fmt.end_of_turn_id(), env_class()
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=4, min_new_tokens=1)
    batch, completions = sample_episodes(sampler, env, TASKS, tok, params, [3, 4, 5], max_turns=3, encode=fmt)
    extent, seen_ends = batch.completion_extent().sum(1).tolist(), {"im_end": 0, "eos": 0, "cut": 0, "three_turns": 0}
    for b, completion in enumerate(completions):
        task = TASKS[b // params.n]
        prompt = batch.prompt_ids[b][batch.prompt_mask[b].bool()].tolist()
        ids = batch.completion_ids[b, : extent[b]].tolist()
        rendered = tok.apply_chat_template(_conversation(fmt, task, completion.turns, role))["input_ids"]
        episode, last = prompt + ids, ids[-1]
        assert prompt == fmt.encode(task) and rendered[: len(prompt)] == prompt
        if bool(batch.truncated[b]):  # the rendering closes the cut-off turn, the episode does not
            assert episode == rendered[: len(episode)] and rendered[len(episode)] == im_end
            seen_ends["cut"] += 1
        elif last == im_end:  # exactly the rendering, but for the space the template writes after every message
            assert episode == rendered[: len(episode)] and tok.decode(rendered[len(episode):]) == " "
            seen_ends["im_end"] += 1
        else:  # </s> instead of the end-of-turn token: the last turn, whatever the environment would say
            assert last == tok.eos_token_id and episode[:-1] == rendered[: len(episode) - 1] and rendered[len(episode) - 1] == im_end
            seen_ends["eos"] += 1
        seen_ends["three_turns"] += len(completion.turns) == 5
        assert batch.completion_mask[b, : extent[b]].tolist() == _assistant_mask(ids, tok)
        assert f"<|im_start|>{role} =" in tok.decode(ids) or len(completion.turns) == 1
    assert all(seen_ends.values()), seen_ends  # every way a turn ends, and whole 3-turn episodes, were sampled
    assert (batch.sampler_logprobs[batch.completion_mask == 0] == 0).all()
    assert [(c.text, c.token_ids, c.finished) for c in completions_of(batch, tok)] == \
        [(c.text, c.token_ids, c.finished) for c in completions]


def test_sampler_logprobs_equal_the_training_forward_over_the_rendered_episode(policy):
    """The sampler read exactly the rows the learner trains on: prompt, turns and rendered observations."""
    tok, model, fmt, sampler = policy
    batch, _ = sample_episodes(sampler, LengthEcho(), TASKS, tok, SamplingParams(max_new_tokens=8, n=2),
                               [7, 8, 9], max_turns=3, encode=fmt)
    policy_tokens = batch.completion_mask.bool()
    assert (batch.completion_attention_mask - batch.completion_mask).bool().any()  # later turns exist
    with torch.no_grad():
        logprobs = completion_forward(model, batch).logprobs
    assert torch.allclose(logprobs[policy_tokens], batch.sampler_logprobs[policy_tokens], atol=1e-4)


def test_continuation_is_the_rendering_difference_and_needs_a_prefix_template():
    tok = chat_tokenizer()
    fmt = PromptFormat(tok, TEMPLATE, "sys")
    messages = fmt.conversation(Task("1+1="))
    tail = fmt.continuation(messages, "c:1+1", {"role": "tool", "content": "=2 A:"})
    assert tok.decode(tail) == " <|im_start|>tool =2 A:<|im_end|> <|im_start|>assistant "
    # A template that rewrites earlier assistant turns renders no conversation the episode could extend.
    rewriting = TEMPLATE.replace("{{ m['content'] }}", "{{ '(earlier)' if m['role'] == 'assistant' and not loop.last else m['content'] }}")
    with pytest.raises(ScaleRLError, match="renders earlier turns unchanged"):
        PromptFormat(tok, rewriting, None).continuation(messages, "c:1+1", {"role": "user", "content": "=2 A:"})


def test_without_a_template_observations_stay_raw():
    """chat_template none (a format without a template) gives exactly the raw episodes of no format at all."""
    tok, _, sampler = _setup()
    params = SamplingParams(max_new_tokens=6, n=2)
    raw, raw_completions = sample_episodes(sampler, LengthEcho(), TASKS, tok, params, [1, 2, 3], max_turns=3)
    plain, completions = sample_episodes(sampler, LengthEcho(), TASKS, tok, params, [1, 2, 3], max_turns=3,
                                         encode=prompt_format("none", None, tok))
    assert (raw.completion_attention_mask - raw.completion_mask).bool().any()
    for name, value in vars(raw).items():
        assert torch.equal(value, getattr(plain, name)), name
    assert completions == raw_completions
