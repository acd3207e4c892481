"""Agent episodes (`env.name: agent`, scalerl/envs/agent.py): run the user's episode function against the
OpenAI-compatible endpoint, `params.n` episodes per task, and turn each episode's recorded calls into one row.

Seeds are per request, as everywhere: episode j of task i samples its k-th call with
`derive_seed(derive_seed(seeds[i], j), k)` (a request's own `seed` wins), so a resumed run draws the same
tokens for the same calls. Greedy evaluation (`seeds` None) leaves temperature 0 as the episodes' default.

The rows are those of the built-in multi-turn environments (scalerl/rollout/multiturn.py): the first call's
prompt; then the policy's replies (`completion_mask` 1, the sampler's log-probs) with the tokens between them
(mask 0, log-prob 0); `completion_attention_mask` 1 on all of them. A failed episode (it raised, timed out,
returned no number, or its calls are not one conversation) keeps its row with the task's own prompt and no
trained token; its `Completion.reward` is None, which the environment's score turns into a reward failure.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from scalerl.envs.agent import AgentEnv
from scalerl.rollout.base import Sampler
from scalerl.rollout.chat import PromptFormat
from scalerl.rollout.episode_calls import Call, EpisodeError, trajectory
from scalerl.rollout.hf import left_pad
from scalerl.rollout.openai_server import OpenAIEndpoint
from scalerl.types import Completion, Rollout, SamplingParams, Task, as_score, derive_seed

log = logging.getLogger(__name__)


@dataclass
class EpisodeResult:
    calls: list[Call]
    reward: float | None  # None: the episode failed (`error` says how)
    error: str | None = None


def endpoint_for(sampler: Sampler, tokenizer, fmt: PromptFormat | None, params: SamplingParams,
                 device: torch.device | None = None, max_len: int | None = None) -> OpenAIEndpoint:
    """An endpoint (not started) serving `sampler` with `fmt`'s chat template and stop tokens."""
    template = fmt.template if fmt is not None else None
    stops = fmt.stop_ids() if fmt is not None else [tokenizer.eos_token_id]
    return OpenAIEndpoint(sampler, tokenizer, template=template, stop_ids=stops, defaults=params, device=device,
                          end_of_turn=fmt.end_of_turn_id() if fmt is not None else None, max_len=max_len)


def agent_episodes(sampler: Sampler, env: AgentEnv, tasks: Sequence[Task], tokenizer, params: SamplingParams,
                   seeds: Sequence[int] | None, encode: Callable[[Task], list[int]] | None = None) -> tuple[Rollout, list[Completion]]:
    """`params.n` episodes per task (rows grouped per task, in order) and their completions, each holding its reward.
    `sampler` is the run's endpoint, or an engine that is served for the length of this call."""
    fmt = encode if isinstance(encode, PromptFormat) else None
    if isinstance(sampler, OpenAIEndpoint):
        endpoint = sampler
        results = run_episodes(endpoint, env, tasks, params, seeds)
    else:
        with endpoint_for(sampler, tokenizer, fmt, params) as endpoint:
            results = run_episodes(endpoint, env, tasks, params, seeds)
    encode = encode or (lambda task: tokenizer(task.prompt)["input_ids"])
    return assemble(results, tasks, params.n, tokenizer, encode, endpoint.device, endpoint.stop_ids)


def run_episodes(endpoint: OpenAIEndpoint, env: AgentEnv, tasks: Sequence[Task], params: SamplingParams,
                 seeds: Sequence[int] | None) -> list[EpisodeResult]:
    """Run the episode function `params.n` times per task against the endpoint, concurrently; in row order."""
    fn, timeout, limit = env.episode_function(), env.config.timeout_s, env.config.max_concurrency
    defaults = replace(params, n=1)
    jobs = [(task, None if seeds is None else derive_seed(seeds[i], j)) for i, task in enumerate(tasks) for j in range(params.n)]

    async def main() -> list[EpisodeResult]:
        gate, loop = asyncio.Semaphore(limit), asyncio.get_running_loop()
        threads = None if inspect.iscoroutinefunction(fn) else ThreadPoolExecutor(max_workers=max(1, min(limit, len(jobs))),
                                                                                   thread_name_prefix="scalerl-episode")

        async def one(task: Task, seed: int | None) -> EpisodeResult:
            async with gate:
                eid = endpoint.open_episode(seed, defaults)
                url = endpoint.base_url(eid)
                try:
                    running = fn(url, task) if threads is None else loop.run_in_executor(threads, fn, url, task)
                    value = await asyncio.wait_for(running, timeout)
                    reward = as_score(value)
                    error = None if reward == reward and abs(reward) != float("inf") else f"returned {value!r}, not a finite number"
                except TimeoutError:
                    reward, error = None, f"timed out after {timeout:g} s (env.args.timeout_s)"
                except Exception as err:
                    reward, error = None, f"raised {type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"
                finally:
                    calls = endpoint.close_episode(eid)  # an episode still running (timed out) gets 404 from now on
                return EpisodeResult(calls, None if error else reward, error)

        try:
            return await asyncio.gather(*(one(task, seed) for task, seed in jobs))
        finally:
            if threads is not None:
                threads.shutdown(wait=False, cancel_futures=True)  # a timed-out sync episode is left to end on its own

    return asyncio.run(main())


def assemble(results: list[EpisodeResult], tasks: Sequence[Task], n: int, tokenizer, encode: Callable[[Task], list[int]],
             device: torch.device, stop_ids: set[int]) -> tuple[Rollout, list[Completion]]:
    """One row per episode (see the module docstring) and its `Completion`."""
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)  # noqa: E731
    prompts, rows, completions, failures = [], [], [], []
    for b, result in enumerate(results):
        task = tasks[b // n]
        try:
            if result.error is not None:
                raise EpisodeError(result.error)
            prompt, ids, trained, logprobs, finished, turns = trajectory(result.calls, decode)
        except EpisodeError as err:
            failures.append(f"{err} (task {task.prompt[:40]!r})")
            prompt, ids, trained, logprobs, finished, turns = encode(task), [], [], [], False, []
            result.reward = None
        prompts.append(prompt)
        rows.append((ids, trained, logprobs, finished))
        text = decode(ids[:-1] if ids and ids[-1] in stop_ids else ids)  # as `completions_of`: without the final stop token
        completions.append(Completion(text=text, token_ids=tuple(ids), finished=finished, turns=tuple(turns), reward=result.reward))
    if failures:
        log.warning("%d of %d agent episodes failed (reward failures, see reward/env_failures); the first: %s",
                    len(failures), len(results), failures[0])
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id)
    T = max(1, max(len(r[0]) for r in rows))
    ids = torch.full((len(rows), T), tokenizer.pad_token_id, dtype=torch.long)
    trained = torch.zeros((len(rows), T), dtype=torch.long)
    extent = torch.zeros((len(rows), T), dtype=torch.long)
    logprobs = torch.zeros((len(rows), T), dtype=torch.float32)
    for b, (row, mask, lps, _) in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        trained[b, : len(row)] = torch.tensor(mask, dtype=torch.long)
        extent[b, : len(row)] = 1
        logprobs[b, : len(row)] = torch.tensor(lps, dtype=torch.float32)
    rollout = Rollout(prompt_ids=prompt_ids.to(device), prompt_mask=prompt_mask.to(device), completion_ids=ids.to(device),
                      completion_mask=trained.to(device), sampler_logprobs=logprobs.to(device),
                      truncated=torch.tensor([not r[3] for r in rows], device=device),
                      group_ids=torch.arange(len(tasks), device=device).repeat_interleave(n), completion_attention_mask=extent.to(device))
    return rollout, completions

