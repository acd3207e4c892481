"""The reasoning_gym environment: its split, its mixture, the dataset's own verifier, answer extraction, and the
one-line errors (unknown dataset, a config key the dataset does not take, the extra missing)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from scalerl.envs.registry import build_env, validate_env_args
from scalerl.errors import ScaleRLError
from scalerl.types import Completion

HAVE_RG = importlib.util.find_spec("reasoning_gym") is not None
# every test but the missing extra's needs the package (CI installs it with the test extra)
needs_rg = pytest.mark.skipif(not HAVE_RG, reason="needs the optional reasoning-gym package: pip install 'scalerl[reasoning-gym]'")

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"], "allow_negation": False,
         "allow_parentheses": False}  # 100 questions: a training pool of 30 repeats some of them in the held-out seeds


def done(text: str) -> Completion:
    return Completion(text=text, token_ids=(), finished=True)


@needs_rg
def test_split_uses_disjoint_seeds_and_unseen_questions():
    env = build_env("reasoning_gym", {"datasets": [{"name": "basic_arithmetic", "size": 30, "seed": 5, "eval_size": 10, "config": SMALL}]})
    train, held = env.train_tasks(), env.eval_tasks()
    assert len(train) == 30 and len(held) == 10
    import reasoning_gym as rg

    # item i of a dataset of seed s is Random(s + i): training seeds 5..34, held-out from 35 on
    expected = rg.create_dataset("basic_arithmetic", seed=5, size=30, **SMALL)
    assert [t.meta["question"] for t in train] == [expected[i]["question"] for i in range(30)]
    seen = {t.meta["question"] for t in train}
    assert not seen & {t.meta["question"] for t in held}  # 1-digit sums repeat questions: eval_unseen skipped those
    following = rg.create_dataset("basic_arithmetic", seed=35, size=100, **SMALL)
    unseen = [following[i]["question"] for i in range(100) if following[i]["question"] not in seen]
    assert [t.meta["question"] for t in held] == unseen[:10]
    assert held[-1].meta["entry"]["metadata"]["source_index"] > 9  # some seeds were skipped
    assert train[0].prompt.endswith("Give your final answer inside <answer></answer> tags.")  # answer_tag's template


@needs_rg
def test_mixture_follows_the_weights():
    env = build_env("reasoning_gym", {"datasets": [{"name": "basic_arithmetic", "weight": 3, "size": 300, "config": SMALL},
                                                   {"name": "leg_counting", "weight": 1, "size": 100, "eval_size": 5}],
                                      "prompt_template": "{question}"})
    pool = env.train_tasks()
    share = sum(t.meta["dataset"] == 0 for t in pool) / len(pool)
    assert len(pool) == 400 and abs(share - 0.75) < 0.06  # 400 draws at p = 0.75: sd 0.022
    assert len(env.eval_tasks()) == 100 + 5


@needs_rg
def test_score_is_the_datasets_own_score_answer():
    env = build_env("reasoning_gym", {"datasets": [{"name": "basic_arithmetic", "size": 20, "config": SMALL}]})
    task = env.eval_tasks()[0]
    answer = task.answer
    assert env.score(task, done(f"thinking... <answer> {answer} </answer>")) == 1.0
    assert env.correct(task, done(f"<answer>{answer}</answer>")) == 1.0
    assert env.score(task, done(answer)) == 0.0  # answer_tag: no tag, no answer
    # reasoning-gym's default scorer: partial credit len(oracle) / len(answer) when the answer contains the oracle
    padded = answer + "00"
    assert env.score(task, done(f"<answer>{padded}</answer>")) == pytest.approx(len(answer) / len(padded))
    assert env.correct(task, done(f"<answer>{padded}</answer>")) == 0.0  # the pass rate counts full credit only
    cut = Completion(text=f"<answer>{answer}</answer>", token_ids=(), finished=False)
    assert env.score(task, cut) == 0.0  # require_finished


@needs_rg
def test_last_line_extraction():
    env = build_env("reasoning_gym", {"datasets": [{"name": "basic_arithmetic", "size": 20, "config": SMALL}], "extract": "last_line"})
    task = env.eval_tasks()[0]
    assert env.train_tasks()[0].prompt.endswith("Give only the final answer on the last line.")
    assert env.score(task, done(f"let me add\n{task.answer}\n\n")) == 1.0
    assert env.score(task, done(f"{task.answer}\nwrong")) == 0.0


@needs_rg
@pytest.mark.parametrize("args, message", [
    ({"datasets": ["basic_arithmatic"]},
     "env.args.datasets.0.name: unknown reasoning-gym dataset 'basic_arithmatic'; did you mean `basic_arithmetic`?"),
    ({"datasets": [{"name": "gcd", "config": {"max_valu": 5}}]},
     "env.args.datasets.0.config.max_valu: gcd takes no option 'max_valu' (did you mean `max_value`?)"),
    ({"datasets": [{"name": "gcd", "config": {"seed": 5}}]}, "env.args.datasets.0.config.seed: set it as env.args.datasets.0.seed"),
    ({"datasets": [{"name": "gcd", "eval_seed": 10}]}, "env.args.datasets.0.eval_seed: the held-out seeds 10..109 overlap"),
    ({"datasets": [{"name": "basic_arithmetic", "config": {"min_terms": 5, "max_terms": 2}}]},
     "env.args.datasets.0.config: basic_arithmetic refused it (AssertionError: max_terms must be >= min_terms)"),
])
def test_bad_input_is_one_line_naming_the_key(args, message):
    with pytest.raises(ScaleRLError) as err:
        validate_env_args("reasoning_gym", args) if "refused" not in message else build_env("reasoning_gym", args)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    with pytest.raises(ScaleRLError, match=r"pip install 'scalerl\[reasoning-gym\]'"):
        validate_env_args("reasoning_gym", {"datasets": ["basic_arithmetic"]})
