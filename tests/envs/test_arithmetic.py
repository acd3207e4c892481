"""The built-in arithmetic environment, JSONL task files, and scoring a Rollout."""

import json
import random
import re

import pytest
import torch

from scalerl.envs.arithmetic import ArithmeticConfig, ArithmeticEnv
from scalerl.types import Completion, Task
from scalerl.envs.registry import build_env
from scalerl.envs.scoring import completions_of, score_rollout
from scalerl.errors import ScaleRLError
from scalerl.models.char_tokenizer import build_char_tokenizer
from scalerl.types import Rollout


@pytest.fixture(scope="module")
def env():
    return ArithmeticEnv()


def test_default_split_equals_reference_benchmark(env):
    # The CPU reference benchmark's split, written out independently of both code bases.
    pairs = [(a, b) for a in range(100) for b in range(100)]
    random.Random(0).shuffle(pairs)
    ref_eval = [f"{a}+{b}=" for a, b in pairs[:200]]
    ref_train = [f"{a}+{b}=" for a, b in pairs[200:]]
    assert [t.prompt for t in env.eval_tasks()] == ref_eval
    assert [t.prompt for t in env.train_tasks()] == ref_train
    assert [t.answer for t in env.eval_tasks()] == [str(a + b) for a, b in pairs[:200]]


def test_train_and_eval_are_disjoint_and_cover_everything(env):
    train = {t.prompt for t in env.train_tasks()}
    held_out = {t.prompt for t in env.eval_tasks()}
    assert not train & held_out
    assert len(train) == 9800 and len(held_out) == 200


def _c(text, finished=True):
    return Completion(text=text, token_ids=(), finished=finished)


@pytest.mark.parametrize(
    "text, finished, reward",
    [
        ("42", True, 1.0),  # exact answer, then EOS
        ("42 junk!", True, 1.0),  # answer, space, anything
        ("42 ", False, 1.0),  # the space ends the answer even when cut off later
        ("42", False, 0.0),  # cut off right after the digits: not finished
        ("420", True, 0.0),  # extra digit
        ("4", True, 0.0),  # prefix of the answer
        ("41", True, 0.0),  # wrong
        (" 42", True, 0.0),  # leading space
        ("42x", True, 0.0),  # no space after the answer
        ("", True, 0.0),
    ],
)
def test_reward_rule(env, text, finished, reward):
    assert env.score(Task(prompt="40+2=", answer="42"), _c(text, finished)) == reward


def test_minus_and_times_answers_are_correct():
    env = ArithmeticEnv(ArithmeticConfig(operators=["-", "*"], max_operand=9, num_eval=10))
    tasks = env.train_tasks() + env.eval_tasks()
    assert len(tasks) == 2 * 10 * 10 and len(env.eval_tasks()) == 10
    ops = set()
    for t in tasks:
        a, op, b = re.fullmatch(r"(\d+)([-*])(\d+)=", t.prompt).groups()
        ops.add(op)
        assert t.answer == str(int(a) - int(b) if op == "-" else int(a) * int(b))
    assert ops == {"-", "*"}
    assert env.score(Task("3-7=", "-4"), _c("-4")) == 1.0


def test_operand_range_and_split_seed():
    c = ArithmeticConfig(min_operand=5, max_operand=7, num_eval=2, split_seed=3)
    env = ArithmeticEnv(c)
    # 3 x 3 = 9 triples (a outer, b inner), shuffled once with Random(3).
    triples = [(a, b) for a in range(5, 8) for b in range(5, 8)]
    random.Random(3).shuffle(triples)
    assert [t.prompt for t in env.eval_tasks()] == [f"{a}+{b}=" for a, b in triples[:2]]
    assert [t.prompt for t in env.train_tasks()] == [f"{a}+{b}=" for a, b in triples[2:]]


def test_config_rejects_bad_ranges():
    with pytest.raises(ValueError, match="max_operand"):
        ArithmeticConfig(min_operand=5, max_operand=4)
    with pytest.raises(ValueError, match="leaves no training prompts"):
        ArithmeticConfig(max_operand=1, num_eval=4)  # 2 x 2 = 4 triples


def _write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_task_files(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": 2, "level": "easy"}, "",
                                                     {"prompt": "2+2=", "answer": "4"}])
    held = _write_jsonl(tmp_path / "eval.jsonl", [{"prompt": "3+3=", "answer": "6"}])
    env = build_env("arithmetic", {"train_file": str(train), "eval_file": str(held)})
    # The blank line is skipped, a numeric answer becomes a string, other fields go to meta.
    assert env.train_tasks() == [Task("1+1=", "2", {"level": "easy"}), Task("2+2=", "4", {})]
    assert env.eval_tasks() == [Task("3+3=", "6", {})]
    assert env.score(env.train_tasks()[0], _c("2")) == 1.0


def test_train_file_only_keeps_generated_eval(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    env = ArithmeticEnv(ArithmeticConfig(train_file=train))
    assert len(env.train_tasks()) == 1
    assert len(env.eval_tasks()) == ArithmeticConfig().eval_size  # still generated


def test_missing_task_file(tmp_path):
    path = tmp_path / "missing.jsonl"
    with pytest.raises(ScaleRLError, match="does not exist") as info:
        ArithmeticEnv(ArithmeticConfig(train_file=path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("bad_line", [
    '{"prompt": "1+1="}',
    '{"answer": "2"}',
    "not json",
    '"just a string"',
    "[1, 2]",
])
def test_bad_task_line_names_file_and_line(tmp_path, bad_line):
    path = _write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}, bad_line])
    with pytest.raises(ScaleRLError) as info:
        ArithmeticEnv(ArithmeticConfig(train_file=path))
    msg = str(info.value)
    assert f"{path}:2" in msg and "'prompt' and 'answer'" in msg


def test_empty_task_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(ScaleRLError, match="holds no rows"):
        ArithmeticEnv(ArithmeticConfig(eval_file=path))


# --- scoring a Rollout with the built-in character tokenizer -----------------------------------

@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _row(tok, text, end, width):
    ids = tok.convert_tokens_to_ids(list(text)) + ([tok.eos_token_id] if end else [])
    mask = [1] * len(ids)
    return ids + [tok.pad_token_id] * (width - len(ids)), mask + [0] * (width - len(ids))


def _rollout(tok, rows, group_ids, width=4):
    """rows: (completion text, ends with EOS), each at most `width` tokens with its EOS."""
    built = [_row(tok, text, end, width) for text, end in rows]
    ids = torch.tensor([r[0] for r in built])
    mask = torch.tensor([r[1] for r in built])
    B = len(rows)
    return Rollout(
        prompt_ids=torch.ones(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.long),
        completion_ids=ids,
        completion_mask=mask,
        sampler_logprobs=torch.zeros(B, width),
        truncated=torch.tensor([not end for _, end in rows]),
        group_ids=torch.tensor(group_ids),
    )


def test_completions_and_rewards_from_rollout(tok):
    tasks = [Task("1+2=", "3"), Task("10+5=", "15")]
    rollout = _rollout(tok, [
        ("3", True),  # "3" EOS pad pad: EOS-terminated, padded after EOS  -> 1
        ("1515", False),  # no EOS within 4 tokens: truncated, wrong          -> 0
        ("15", True),  # "1" "5" EOS pad                                       -> 1
        ("15 ", True),  # EOS in the last column, answer then space            -> 1
        ("5", True),  # wrong answer for task 0                                 -> 0
    ], group_ids=[0, 1, 1, 1, 0])
    assert rollout.completion_ids[0].tolist() == [tok.convert_tokens_to_ids("3"), tok.eos_token_id,
                                                  tok.pad_token_id, tok.pad_token_id]

    completions = completions_of(rollout, tok)
    assert [c.text for c in completions] == ["3", "1515", "15", "15 ", "5"]
    assert [c.finished for c in completions] == [True, False, True, True, True]
    # token_ids stop before EOS and never include padding.
    assert completions[0].token_ids == (tok.convert_tokens_to_ids("3"),)
    assert completions[1].token_ids == tuple(tok.convert_tokens_to_ids(list("1515")))
    assert all(tok.eos_token_id not in c.token_ids and tok.pad_token_id not in c.token_ids for c in completions)

    rewards = score_rollout(ArithmeticEnv(), tasks, rollout, tok)
    assert rewards.dtype == torch.float32
    assert rewards.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0]


def test_truncated_exact_answer_scores_zero(tok):
    # Width 2: row 0 is "15" cut off (no EOS: not finished -> 0); row 1 is "1" EOS (wrong -> 0).
    # Width 3: "15 " cut off after the space still scores 1 (the space ends the answer).
    rollout = _rollout(tok, [("15", False), ("1", True)], group_ids=[0, 0], width=2)
    completions = completions_of(rollout, tok)
    assert [(c.text, c.finished) for c in completions] == [("15", False), ("1", True)]
    assert score_rollout(ArithmeticEnv(), [Task("10+5=", "15")], rollout, tok).tolist() == [0.0, 0.0]
    spaced = _rollout(tok, [("15 ", False)], group_ids=[0], width=3)
    assert score_rollout(ArithmeticEnv(), [Task("10+5=", "15")], spaced, tok).tolist() == [1.0]


def test_rollout_select_keeps_rows_and_groups(tok):
    rollout = _rollout(tok, [("3", True), ("15", True), ("7", False)], group_ids=[0, 1, 0])
    sub = rollout.select(slice(1, 3))
    assert len(sub) == 2
    assert [c.text for c in completions_of(sub, tok)] == ["15", "7"]
    assert sub.group_ids.tolist() == [1, 0]
