"""The built-in `calculator` environment: tool calls, observations, reward, split."""

from __future__ import annotations

import pytest

from scalerl.types import Completion, Task
from scalerl.envs.calculator import (
    CalculatorConfig,
    CalculatorEnv,
    evaluate,
    tool_result,
)
from scalerl.envs.registry import build_env, validate_env_args
from scalerl.errors import ScaleRLError
from scalerl.models.char_tokenizer import VOCAB


def test_evaluate_applies_products_before_sums():
    assert evaluate("12*34") == 408
    assert evaluate("12*34+5-6*2") == 408 + 5 - 12  # 401
    assert evaluate("7") == 7 and evaluate("3-10") == -7


def test_tool_calls_get_a_result_and_answers_end_the_episode():
    assert tool_result("c:12*34") == "=408 A:"
    assert tool_result("c:12*34=") == "=408 A:"
    assert tool_result("c:12**3") == "=? A:" and tool_result("c:") == "=? A:" and tool_result("c:1a") == "=? A:"
    assert tool_result("408") is None and tool_result("") is None
    env = CalculatorEnv()
    task = Task("12*34=", "408")
    assert env.step(task, ("c:12*34",)) == "=408 A:"
    assert env.step(task, ("c:12*34", "=408 A:", "408")) is None  # only the latest turn counts


def test_reward_is_the_final_turn_answered_with_eos():
    env, task = CalculatorEnv(), Task("12*34=", "408")
    episode = Completion("c:12*34</s>=408 A:408", (), finished=True, turns=("c:12*34", "=408 A:", "408"))
    assert env.score(task, episode) == 1.0
    assert env.score(task, Completion("408", (), finished=True)) == 1.0  # answered directly, one turn
    assert env.score(task, Completion("408", (), finished=False)) == 0.0  # cut off: never said it was done
    assert env.score(task, Completion("x", (), finished=True, turns=("c:12*34", "=408 A:", "407"))) == 0.0
    assert env.score(task, Completion("x", (), finished=True, turns=("c:12*34",))) == 0.0  # still calling at the end


def test_split_vocabulary_and_registration():
    env = build_env("calculator", {"num_eval": 50, "max_operand": 20})
    train, held_out = env.train_tasks(), env.eval_tasks()
    assert len(held_out) == 50 and len(train) == 11 * 11 - 50
    assert not {t.prompt for t in train} & {t.prompt for t in held_out}
    assert all(int(a) * int(b) == int(t.answer) for t in train for a, b in [t.prompt[:-1].split("*")])
    # Prompts, tool calls and observations stay inside the built-in character vocabulary.
    assert set("".join(t.prompt for t in train) + "c:12*34=" + tool_result("c:99*99") + "=? A:") <= set(VOCAB)
    with pytest.raises(ScaleRLError, match="env.args: .*eval_size \\(8100\\)"):
        validate_env_args("calculator", {"num_eval": 8100})
    assert CalculatorConfig().operators == ["*"]
