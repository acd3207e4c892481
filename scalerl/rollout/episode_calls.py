"""An agent episode's calls to the endpoint, and how they join into one trajectory without re-tokenising.

Agent code sends the whole conversation with every call: the earlier messages, the policy's reply as an
assistant message (its text), then what happened next (a tool result, a user message). Re-tokenising that
text would not give back the tokens the policy sampled (a BPE tokenizer splits "408" one way when sampling
and another when reading it back; special tokens vanish from the text), and the learner would train on
tokens the sampler never produced, with log-probs that belong to others. So the endpoint recognises a call
that continues an earlier one of the same episode and builds its prompt from token ids:

    prompt(k+1) = prompt(k) + completion(k) as sampled + joint(k+1)

where `joint` is the end-of-turn token (when the completion did not end with a stop token) and the tokens of
what the template writes after the assistant's turn: the rendering of the new messages (with the generation
prompt) less the rendering of the earlier ones plus the reply and its end-of-turn token, as
`PromptFormat.continuation` does for the built-in multi-turn environments. A chat call continues an earlier
chat call when its messages start with that call's messages, then an assistant message whose content is the
text of one of its choices, and the tools are the same; a completions call continues one when its prompt
starts with that call's prompt and choice (text, or token ids). Anything else is rendered afresh.

An episode's trajectory is the chain of its calls: its last call (one choice), the call and choice that one
continues, and so on back to the first. An episode whose calls are not one such chain (a second, separate
conversation; history the agent rewrote) has no trajectory: `EpisodeError`, counted as a reward failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from scalerl.rollout.openai_requests import BadRequest, ChatRequest, CompletionRequest


class EpisodeError(Exception):
    """An episode whose calls give no trajectory (the message says why)."""


@dataclass(frozen=True)
class Choice:
    ids: tuple[int, ...]  # the completion's tokens as sampled: up to and including its stop token or stop string
    logprobs: tuple[float, ...]  # the sampler's log-prob of each
    text: str  # what the client got: decoded without special tokens, stop token or stop string
    finish_reason: str  # "stop" (a stop token or string) or "length" (max_tokens)


@dataclass
class Call:
    kind: str  # "chat" or "completion"
    prompt_ids: list[int]
    messages: tuple[dict, ...] | None = None  # chat: the request's messages (normalised)
    tools: tuple[dict, ...] | None = None
    prompt: str | tuple[int, ...] | None = None  # completions: the request's prompt
    parent: tuple[int, int] | None = None  # (call, choice) this call continues; None: rendered afresh
    joint: list[int] = field(default_factory=list)  # the tokens between the parent's completion and the new prompt's end
    choices: list[Choice] = field(default_factory=list)
    version: int = 0  # the policy version that sampled it


class PromptBuilder:
    """A request's prompt tokens: continuing an earlier call of the episode (see the module docstring) or rendered."""

    def __init__(self, tokenizer, template: str | None, stop_ids: Sequence[int], end_of_turn: int | None):
        self.tokenizer, self.template, self.stop_ids, self.eot = tokenizer, template, set(stop_ids), end_of_turn
        self.eot_text = "" if end_of_turn is None else tokenizer.convert_ids_to_tokens(end_of_turn)

    def tokens(self, text: str, special: bool = False) -> list[int]:
        return self.tokenizer(text, add_special_tokens=special, verbose=False)["input_ids"]

    def text(self, messages: Sequence[dict], tools: Sequence[dict] | None) -> str:
        if self.template is None:
            raise BadRequest("this model's tokenizer has no chat template: use /v1/completions, or give the run a template "
                             "(env.chat_template=FILE)", "messages")
        try:
            return self.tokenizer.apply_chat_template(list(messages), tools=list(tools) if tools else None, chat_template=self.template,
                                                      tokenize=False, add_generation_prompt=True)
        except Exception as err:  # the template's own checks (roles that must alternate, say): the request's fault
            raise BadRequest(f"the chat template refused these messages: {type(err).__name__}: {str(err).splitlines()[0][:200]}",
                             "messages") from None

    def chat(self, calls: Sequence[Call], req: ChatRequest) -> Call:
        for index in reversed(range(len(calls))):
            call = calls[index]
            k = len(call.messages or ())
            if call.kind != "chat" or call.tools != req.tools or len(req.messages) <= k or req.messages[:k] != call.messages:
                continue
            reply = req.messages[k]
            for c, choice in enumerate(call.choices):
                if reply["role"] != "assistant" or reply["content"] != choice.text:
                    continue
                before = self.text(call.messages, call.tools) + choice.text + self.eot_text
                after = self.text(req.messages, req.tools)
                if after.startswith(before):
                    ends = bool(choice.ids) and choice.ids[-1] in self.stop_ids  # a sampled stop token stands for the end-of-turn
                    joint = ([] if ends or self.eot is None else [self.eot]) + self.tokens(after[len(before):])
                    return Call("chat", call.prompt_ids + list(choice.ids) + joint, messages=req.messages, tools=req.tools,
                                parent=(index, c), joint=joint)
        return Call("chat", self.tokens(self.text(req.messages, req.tools)), messages=req.messages, tools=req.tools)

    def completion(self, calls: Sequence[Call], req: CompletionRequest) -> Call:
        text = isinstance(req.prompt, str)
        for index in reversed(range(len(calls))):
            call = calls[index]
            if call.kind != "completion" or isinstance(call.prompt, str) != text:
                continue
            for c, choice in enumerate(call.choices):
                if text and req.prompt.startswith(call.prompt + choice.text):
                    joint = self.tokens(req.prompt[len(call.prompt) + len(choice.text):])
                elif not text and req.prompt[: len(call.prompt_ids) + len(choice.ids)] == tuple(call.prompt_ids) + choice.ids:
                    joint = list(req.prompt[len(call.prompt_ids) + len(choice.ids):])
                else:
                    continue
                return Call("completion", call.prompt_ids + list(choice.ids) + joint, prompt=req.prompt, parent=(index, c), joint=joint)
        ids = self.tokens(req.prompt, special=True) if text else list(req.prompt)
        return Call("completion", ids, prompt=req.prompt)


def chain(calls: Sequence[Call]) -> list[tuple[Call, Choice]]:
    """The episode's calls from first to last, each with the choice the next one continues; EpisodeError when its
    calls are not one conversation."""
    if not calls:
        raise EpisodeError("the episode made no call to the endpoint")
    if len(calls[-1].choices) != 1:
        raise EpisodeError(f"its last call asked for n={len(calls[-1].choices)} completions: the trajectory needs one "
                           "(which of them the reward is for is unknown)")
    links, index, choice = [], len(calls) - 1, 0
    while True:
        links.append((calls[index], calls[index].choices[choice]))
        if calls[index].parent is None:
            break
        index, choice = calls[index].parent
    if len(links) != len(calls):
        in_chain = {id(call) for call, _ in links}
        stray = next(i for i, call in enumerate(calls) if id(call) not in in_chain)
        raise EpisodeError(f"its {len(calls)} calls are not one conversation: call {stray + 1} is not continued by the calls "
                           "after it (a separate conversation, or history the agent rewrote); one episode is one conversation")
    return links[::-1]


def trajectory(calls: Sequence[Call], decode: Callable[[list[int]], str]) -> tuple[list[int], list[int], list[int], list[float], bool, list[str]]:
    """(prompt ids, completion-side ids, trained mask, sampler log-probs, finished, turns) of an episode: its first
    prompt, then every reply as sampled (trained) with the joints between them (not trained); `turns` alternates
    the replies' texts and the joints' text (`decode`). EpisodeError when the calls are not one conversation."""
    links = chain(calls)
    ids: list[int] = []
    trained: list[int] = []
    logprobs: list[float] = []
    turns: list[str] = []
    for k, (call, choice) in enumerate(links):
        if k > 0:
            ids += call.joint
            trained += [0] * len(call.joint)
            logprobs += [0.0] * len(call.joint)
            turns.append(decode(call.joint))
        ids += choice.ids
        trained += [1] * len(choice.ids)
        logprobs += choice.logprobs
        turns.append(choice.text)
    return links[0][0].prompt_ids, ids, trained, logprobs, links[-1][1].finish_reason == "stop", turns
