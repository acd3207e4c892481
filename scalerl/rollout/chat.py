"""How a task becomes prompt tokens: raw text, or the tokenizer's chat template (`env.chat_template`).

    auto   the tokenizer's own template when it has one, else the raw prompt (the built-in tokenizer has none)
    none   the raw prompt, tokenized as it is
    FILE   a Jinja chat template read from FILE

With a template, a task's prompt is a user message (or, when `task.meta["messages"]` holds a list
of `{role, content}` messages, TRL's conversational format, those), `env.system_prompt` is put
first unless the messages start with a system message, and the template's generation prompt is
appended. The template's end-of-turn token (the first token it writes after an assistant's
content, e.g. ChatML's `<|im_end|>`) stops a completion as EOS does.

Multi-turn episodes (scalerl/rollout/multiturn.py) grow the conversation a turn at a time. After the
policy's turn (its tokens as sampled, ending with the end-of-turn token) comes `continuation`: the
text the template writes between that token and the next assistant's content, i.e. the rendering of
messages + [assistant turn, observation message] with the generation prompt, less the rendering of
messages with it, less the turn and the end-of-turn token. The rendering before must be a prefix of
the one after; a template that rewrites earlier turns (one that drops past reasoning, say) fails
with an error rather than training on a sequence no rendered conversation contains.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalerl.errors import ScaleRLError
from scalerl.types import Task

LENGTH_BATCH = 256  # prompts tokenized at once when measuring lengths


@dataclass(frozen=True)
class PromptFormat:
    tokenizer: Any
    template: str | None = None  # None: raw prompts
    system: str | None = None
    max_tokens: int | None = None  # a longer prompt is refused or cut (`truncate`: scalerl/rollout/prompt_fit.py); None: any length
    truncate: str = "error"  # error, left (keep the end) or right (keep the start)
    cut: list[int] = field(default_factory=lambda: [0], compare=False, repr=False)  # prompts cut so far (a counter)

    def __call__(self, task: Task) -> list[int]:
        """A format is the `encode` callable of scalerl/rollout/multiturn.py, which also renders later turns with it."""
        return self.encode(task)

    def encode(self, task: Task) -> list[int]:
        """A task's prompt tokens, refused or cut when longer than `max_tokens`."""
        ids = self.encode_whole(task)
        if self.max_tokens is None or len(ids) <= self.max_tokens:
            return ids
        if self.truncate == "error":
            raise ScaleRLError(f"a prompt has {len(ids)} tokens, more than the {self.max_tokens} that fit with the completion "
                               f"(prompt {task.prompt[:40]!r}); set rollout.truncate_prompts=left or right, or shorten it")
        self.cut[0] += 1
        return ids[-self.max_tokens:] if self.truncate == "left" else ids[: self.max_tokens]

    def lengths(self, tasks) -> list[int]:
        """Each task's prompt length in tokens, uncut (raw prompts are tokenized in batches of LENGTH_BATCH: one batch
        of a whole dataset holds every prompt's encoding at once, ~17 MB of the reference task's 9,800 that the
        process keeps as resident memory after they are freed)."""
        if self.template is None and all(self.task_messages(t) is None for t in tasks):
            prompts = [t.prompt for t in tasks]
            return [len(ids) for i in range(0, len(prompts), LENGTH_BATCH)
                    for ids in self.tokenizer(prompts[i:i + LENGTH_BATCH], verbose=False)["input_ids"]]
        return [len(self.encode_whole(t)) for t in tasks]

    def encode_whole(self, task: Task) -> list[int]:
        if self.template is None:
            if self.task_messages(task) is not None:
                raise ScaleRLError("a task holds chat messages but env.chat_template=none (or the tokenizer has no template); "
                                   "set env.chat_template=auto with a tokenizer that has one, or env.chat_template=FILE")
            return self.tokenizer(task.prompt, verbose=False)["input_ids"]  # (a prompt too long is this module's to report)
        return self.render(self.conversation(task))

    @staticmethod
    def task_messages(task: Task) -> list[dict[str, str]] | None:
        return task.meta.get("messages") if isinstance(task.meta, dict) else None

    def conversation(self, task: Task) -> list[dict[str, str]]:
        """The messages a task's prompt renders: its own, or one user message, after the system prompt."""
        messages = self.task_messages(task)
        return self.with_system(list(messages) if messages is not None else [{"role": "user", "content": task.prompt}])

    def with_system(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        if self.system is not None and (not messages or messages[0].get("role") != "system"):
            return [{"role": "system", "content": self.system}, *messages]
        return messages

    def text(self, messages: list[dict[str, str]]) -> str:
        """The template's rendering of `messages` with the generation prompt."""
        return self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                  add_generation_prompt=True)

    def render(self, messages: list[dict[str, str]]) -> list[int]:
        return self.tokenizer(self.text(self.with_system(messages)), add_special_tokens=False, verbose=False)["input_ids"]

    def continuation(self, messages: list[dict[str, str]], turn: str, observation: dict[str, str]) -> list[int]:
        """The tokens that follow the policy's `turn` (its text) and the end-of-turn token after it, when
        `observation` (a message) comes next and then the next assistant turn (see the module docstring).
        `messages`: the conversation the turn answers, as rendered for it (`conversation`, later turns added)."""
        eot = self.end_of_turn_id()
        before = self.text(messages) + turn + ("" if eot is None else self.tokenizer.convert_ids_to_tokens(eot))
        after = self.text([*messages, {"role": "assistant", "content": turn}, observation])
        if not after.startswith(before):
            at = max(next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after))) - 30, 0)
            raise ScaleRLError(f"env.chat_template: the conversation with the next {observation['role']} message does not "
                               f"render as the one before it plus the policy's turn (they part at {before[at: at + 60]!r} "
                               f"vs {after[at: at + 60]!r}); multi-turn rollouts need a template that renders earlier "
                               "turns unchanged (not one that trims them or drops their reasoning), or env.chat_template=none")
        return self.tokenizer(after[len(before):], add_special_tokens=False)["input_ids"]

    def end_of_turn_id(self) -> int | None:
        """The special token the template writes right after an assistant's content (None: no template, or none)."""
        if self.template is None:
            return None
        marker = "SCALERL_TURN_END"
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": "x"}, {"role": "assistant", "content": marker}],
                                                  chat_template=self.template, tokenize=False)
        after = text.split(marker, 1)[1] if marker in text else ""
        ids = self.tokenizer(after, add_special_tokens=False)["input_ids"] if after.strip() else []
        special = set(self.tokenizer.all_special_ids) | set(getattr(self.tokenizer, "added_tokens_decoder", {}) or {})
        return next((i for i in ids if i in special), None)

    def stop_ids(self) -> list[int]:
        """EOS, and the end-of-turn token when the template has one."""
        eot = self.end_of_turn_id()
        eos = self.tokenizer.eos_token_id
        return [eos] + ([eot] if eot is not None and eot != eos else [])


def prompt_format(setting: str, system: str | None, tokenizer) -> PromptFormat:
    """`env.chat_template` (auto, none or a file) and `env.system_prompt` for this tokenizer."""
    if setting == "none":
        if system is not None:
            raise ScaleRLError("env.system_prompt needs a chat template; set env.chat_template=auto (a tokenizer with one) or FILE")
        return PromptFormat(tokenizer)
    if setting == "auto":
        template = getattr(tokenizer, "chat_template", None) or None
        if template is None and system is not None:
            raise ScaleRLError("env.system_prompt: the tokenizer has no chat template to put it in; set env.chat_template=FILE")
        return PromptFormat(tokenizer, template, system)
    path = Path(setting)
    if not path.is_file():
        raise ScaleRLError(f"env.chat_template: {setting} is not auto, none or a readable file (a Jinja chat template)")
    return PromptFormat(tokenizer, path.read_text(), system)
