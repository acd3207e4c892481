"""Conversational JSONL rows (a list of {role, content} messages, TRL's format) in the arithmetic and code task files."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from scalerl.envs.arithmetic import ArithmeticConfig, ArithmeticEnv
from scalerl.envs.code import CodeConfig, CodeEnv
from scalerl.errors import ScaleRLError
from scalerl.models.paths import builtin_model_dir
from scalerl.rollout.chat import PromptFormat
from scalerl.types import Completion

CHAT = [{"role": "system", "content": "add"}, {"role": "user", "content": "1+1="}]
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}A: {% endif %}"


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_arithmetic_task_files_take_messages(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", [{"prompt": CHAT, "answer": 2, "level": 1}, {"messages": CHAT[1:], "answer": "2"},
                                              {"prompt": "2+2=", "answer": "4"}])
    env = ArithmeticEnv(ArithmeticConfig(train_file=train))
    first, second, plain = env.train_tasks()
    assert (first.prompt, first.answer, first.meta) == ("1+1=", "2", {"level": 1, "messages": CHAT})
    assert second.meta == {"messages": CHAT[1:]} and plain.meta == {}  # a string prompt stays a string prompt
    tok = AutoTokenizer.from_pretrained(builtin_model_dir())
    assert tok.decode(PromptFormat(tok, TEMPLATE).encode(first)) == "system: add user: 1+1= A: "
    assert env.score(first, Completion("2", (), finished=True)) == 1.0
    for bad, match in [({"prompt": [{"role": "user"}], "answer": "2"}, "a list of"),
                       ({"prompt": "1+1=", "messages": CHAT, "answer": "2"}, "not both"),
                       ({"messages": "1+1=", "answer": "2"}, "'prompt' and 'answer'")]:
        with pytest.raises(ScaleRLError, match=match):
            ArithmeticEnv(ArithmeticConfig(train_file=_jsonl(tmp_path / "bad.jsonl", [bad])))


def test_code_task_files_take_messages_without_the_suffix(tmp_path):
    chat = [{"role": "user", "content": "write f"}]
    rows = [{"prompt": chat, "tests": ["assert True"]}, {"messages": chat, "tests": ["assert True"]},
            {"prompt": "write g", "tests": ["assert True"]}, {"prompt": "write h", "tests": ["assert True"]}]
    env = CodeEnv(CodeConfig(data_path=_jsonl(tmp_path / "tasks.jsonl", rows), eval_fraction=0.5, prompt_suffix="#"))
    tasks = sorted(env.train_tasks() + env.eval_tasks(), key=lambda t: t.prompt)
    assert [t.prompt for t in tasks] == ["write f", "write f", "write g#", "write h#"]  # the suffix only ends string prompts
    assert all(t.meta["messages"] == chat and t.meta["tests"] == ["assert True"] for t in tasks[:2])
    assert "messages" not in tasks[2].meta
    assert env.score(tasks[0], Completion("", (), finished=True)) == 1.0
    with pytest.raises(ScaleRLError, match="a list of"):
        CodeEnv(CodeConfig(data_path=_jsonl(tmp_path / "bad.jsonl", [{"prompt": [{"content": "x"}], "tests": ["assert True"]}] * 2)))
