"""Multi-turn episodes on top of any `Sampler`: policy turn, observation, policy turn, ...

The episode loop only calls `Sampler.sample`, so any engine (the Hugging Face one, vLLM later)
runs it. Turn 1 samples `params.n` completions per prompt as usual; each later turn samples one
completion for every episode still going, with the prompt, the earlier turns and the observations
as its prompt (each turn re-reads the whole context: no cache survives between turns, which an
engine with prefix caching makes cheap). A policy turn ends at EOS; one cut off at
`max_new_tokens` ends the episode as truncated. After every turn but the last allowed one the
environment's `step(task, transcript)` returns an observation to append, or None to stop.

Raw prompts (no chat template): the observation's tokens are appended as they are, after the turn's
EOS. With a chat template (`encode` a `PromptFormat` with one, scalerl/rollout/chat.py) the episode
is the rendered conversation [system?, prompt, assistant turn₁, observation₁, assistant turn₂, …]:
each observation is a message of role `env.observation_role` (default `user`; an environment whose
observations are tool results may say `tool`), and what is appended after the policy's turn and its
end-of-turn token is the template's text up to the next assistant's content (`PromptFormat.
continuation`: the rendering with the new message and the generation prompt, less the one without).
A turn that ends with EOS where the template's end-of-turn token is another token ends the episode:
no rendered conversation goes on after it.

Seeds are per request, as the `Sampler` contract wants: turn 1 samples task i with `seeds[i]`;
a later turn k of episode j of task i (its j-th completion) samples with
`derive_seed(seeds[i], j, k)`, so every turn's draws depend on that episode alone, not on which
other episodes are still going. Greedy decoding (temperature 0) takes `seeds` None.

The episode comes back as ONE `Rollout` row: `completion_ids` = turn₁ obs₁ turn₂ … (right-padded),
`completion_mask` 1 exactly on the policy's sampled tokens, its EOS or end-of-turn token included
(observations and the template's tokens are 0, so never trained on), `completion_attention_mask` 1
on all of them (the training forward reads observations as context), `sampler_logprobs` the
sampler's log-probs on policy tokens and 0 elsewhere. Length bound: T ≤ max_turns · max_new_tokens
+ (max_turns − 1) · (max_observation_tokens + the template's tokens around one observation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from scalerl.envs.agent import AgentEnv
from scalerl.envs.base import Environment, MultiTurnEnvironment
from scalerl.envs.scoring import completions_of
from scalerl.errors import ScaleRLError
from scalerl.rollout.agents import agent_episodes
from scalerl.rollout.base import Sampler
from scalerl.rollout.chat import PromptFormat
from scalerl.types import Completion, Rollout, SamplingParams, Task, derive_seed


@dataclass
class Episode:
    """One row's completion side while it is being built."""

    tokens: list[int] = field(default_factory=list)  # policy turns and observations, in order
    trained: list[int] = field(default_factory=list)  # 1 on the policy's tokens, 0 on observations
    logprobs: list[float] = field(default_factory=list)  # sampler log-probs, 0.0 on observations
    transcript: list[str] = field(default_factory=list)  # policy turn, observation, ..., policy turn
    finished: bool = False  # the latest policy turn ended with a stop token (EOS or the end-of-turn token)
    messages: list[dict[str, str]] | None = None  # with a chat template: the conversation the next turn answers


def sample_episodes(sampler: Sampler, env: Environment, tasks: Sequence[Task], tokenizer, params: SamplingParams,
                    seeds: Sequence[int] | None, *, max_turns: int = 1, encode: Callable[[Task], list[int]] | None = None,
                    ) -> tuple[Rollout, list[Completion]]:
    """Sample `params.n` completions per task and decode them: one `sampler.sample` call for a
    single turn (`max_turns` 1), or whole episodes (`multi_turn_rollout`) for an environment with
    a `step` method. `seeds`: one per task (None for greedy decoding); `encode`: a task's prompt
    tokens, a `PromptFormat` (scalerl/rollout/chat.py) to render later turns through its template
    too (default: the raw prompt). An agent environment (scalerl/envs/agent.py) runs its own episodes against the
    OpenAI-compatible endpoint instead, whatever `max_turns` is (scalerl/rollout/agents.py)."""
    if isinstance(env, AgentEnv):
        return agent_episodes(sampler, env, tasks, tokenizer, params, seeds, encode)
    encode = encode or (lambda task: tokenizer(task.prompt)["input_ids"])
    if max_turns == 1:
        batch = sampler.sample([encode(task) for task in tasks], params, seeds)
        return batch, completions_of(batch, tokenizer)
    if not callable(getattr(env, "step", None)):
        raise ScaleRLError(f"rollout.max_turns: {max_turns} needs a multi-turn environment (one with a step method, see "
                           f"scalerl/envs/base.py), and {type(env).__name__} has none; set rollout.max_turns=1")
    return multi_turn_rollout(sampler, env, tasks, tokenizer, params, seeds, max_turns=max_turns, encode=encode)


def multi_turn_rollout(sampler: Sampler, env: MultiTurnEnvironment, tasks: Sequence[Task], tokenizer,
                       params: SamplingParams, seeds: Sequence[int] | None, *, max_turns: int,
                       max_observation_tokens: int | None = None, encode: Callable[[Task], list[int]] | None = None,
                       ) -> tuple[Rollout, list[Completion]]:
    """Run `params.n` episodes per task for up to `max_turns` policy turns, seeded per task by `seeds`
    (None for greedy decoding; see the module docstring).

    An observation longer than `max_observation_tokens` (default `params.max_new_tokens`) tokens is
    cut to that many, so the completion side stays within the bound above.
    """
    obs_cap = params.max_new_tokens if max_observation_tokens is None else max_observation_tokens
    chat = encode if isinstance(encode, PromptFormat) and encode.template is not None else None
    encode = encode or (lambda task: tokenizer(task.prompt)["input_ids"])
    prompts = [encode(task) for task in tasks]
    first = sampler.sample(prompts, params, seeds)
    group = first.group_ids.tolist()
    episodes = [Episode(messages=None if chat is None else chat.conversation(tasks[g])) for g in group]
    role = getattr(env, "observation_role", "user")  # optional (scalerl/envs/base.py)
    eot = None if chat is None else chat.end_of_turn_id()
    closing = tokenizer.eos_token_id if eot not in (None, tokenizer.eos_token_id) else None  # ends the episode
    rows, turn = list(range(len(group))), first  # the episodes that `turn` continues, in its row order
    for k in range(1, max_turns + 1):
        _append_turn(episodes, rows, turn, tokenizer)
        if k == max_turns:
            break
        going = []
        for b in rows:  # a truncated turn ends its episode; otherwise the environment decides
            ep = episodes[b]
            observation = env.step(tasks[group[b]], tuple(ep.transcript)) if ep.finished and ep.tokens[-1] != closing else None
            if observation is not None:
                _append_observation(ep, observation, tokenizer, obs_cap, chat, role)
                going.append(b)
        rows = going
        if not rows:
            break
        # Episode b is completion b % n of task group[b] (rows are grouped per task, in order).
        turn_seeds = None if seeds is None else [derive_seed(seeds[group[b]], b % params.n, k + 1) for b in rows]
        turn = sampler.sample([prompts[group[b]] + episodes[b].tokens for b in rows], replace(params, n=1), turn_seeds)
    return _assemble(first, episodes, pad_id=tokenizer.pad_token_id), _completions(episodes, tokenizer)


def _append_turn(episodes: list[Episode], rows: list[int], turn: Rollout, tokenizer) -> None:
    """Append each row's sampled turn (up to and including its EOS) to its episode."""
    lengths = turn.completion_mask.sum(1).tolist()
    ids = turn.completion_ids.tolist()
    logps = turn.sampler_logprobs.tolist()
    cut = turn.truncated.tolist()
    texts = tokenizer.batch_decode([row[: n - (0 if c else 1)] for row, n, c in zip(ids, lengths, cut)],
                                   skip_special_tokens=False, clean_up_tokenization_spaces=False)
    for j, b in enumerate(rows):
        ep, n = episodes[b], lengths[j]
        ep.tokens += ids[j][:n]
        ep.trained += [1] * n
        ep.logprobs += logps[j][:n]
        ep.transcript.append(texts[j])
        ep.finished = not cut[j]


def _append_observation(ep: Episode, observation: str, tokenizer, cap: int, chat: PromptFormat | None, role: str) -> None:
    """Append the environment's observation, cut to its first `cap` tokens: raw, or with a chat template
    as a `role` message in the template's turn markup, up to the next assistant's content."""
    ids = tokenizer(observation, add_special_tokens=False)["input_ids"]
    if len(ids) > cap:
        ids = ids[:cap]
        observation = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if ep.messages is not None:
        message = {"role": role, "content": observation}
        ids = chat.continuation(ep.messages, ep.transcript[-1], message)
        ep.messages = [*ep.messages, {"role": "assistant", "content": ep.transcript[-1]}, message]
    ep.tokens += ids
    ep.trained += [0] * len(ids)
    ep.logprobs += [0.0] * len(ids)
    ep.transcript.append(observation)


def _assemble(first: Rollout, episodes: list[Episode], *, pad_id: int) -> Rollout:
    """One right-padded `Rollout` over the episodes; prompts and groups are turn 1's."""
    B, T, device = len(episodes), max(len(ep.tokens) for ep in episodes), first.completion_ids.device
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    trained = torch.zeros((B, T), dtype=torch.long)
    extent = torch.zeros((B, T), dtype=torch.long)
    logprobs = torch.zeros((B, T), dtype=torch.float32)
    for b, ep in enumerate(episodes):
        n = len(ep.tokens)
        ids[b, :n] = torch.tensor(ep.tokens, dtype=torch.long)
        trained[b, :n] = torch.tensor(ep.trained, dtype=torch.long)
        extent[b, :n] = 1
        logprobs[b, :n] = torch.tensor(ep.logprobs, dtype=torch.float32)
    return Rollout(
        prompt_ids=first.prompt_ids,
        prompt_mask=first.prompt_mask,
        completion_ids=ids.to(device),
        completion_mask=trained.to(device),
        sampler_logprobs=logprobs.to(device),
        truncated=torch.tensor([not ep.finished for ep in episodes], device=device),
        group_ids=first.group_ids,
        completion_attention_mask=extent.to(device),
    )


def _completions(episodes: list[Episode], tokenizer) -> list[Completion]:
    """What `completions_of` gives for the assembled rollout, plus each episode's transcript."""
    ids = [ep.tokens[: len(ep.tokens) - (1 if ep.finished else 0)] for ep in episodes]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return [Completion(text=text, token_ids=tuple(i), finished=ep.finished, turns=tuple(ep.transcript))
            for text, i, ep in zip(texts, ids, episodes)]
