"""The `math` environment: math-verify equivalences, data loading and its errors, reward shaping,
pickling and thread safety, the shipped data set, and a short `scalerl train --set env.name=math`."""

import importlib.util
import json
import multiprocessing
import pickle
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, tiny_overrides

from scalerl.envs.arithmetic import ArithmeticEnv
from scalerl.types import Completion, Task
from scalerl.envs.math_answers import answers_match
from scalerl.envs.math_env import DEFAULT_DATA, MathConfig, MathEnv
from scalerl.envs.registry import build_env, validate_env_args
from scalerl.envs.shaping import ShapingConfig, shaped_reward, unshaped_score
from scalerl.errors import ScaleRLError
from scalerl.models.char_tokenizer import CHARS


def _c(text: str, finished: bool = True) -> Completion:
    return Completion(text=text, token_ids=(), finished=finished)


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _rows(n: int) -> list[dict]:
    return [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(n)]


@pytest.fixture(scope="module")
def env():
    return MathEnv()


@pytest.mark.parametrize("gold, text, expected", [
    ("3/4", "0.75", 1.0),                 # fraction vs decimal
    ("0.75", "3/4", 1.0),                 # decimal gold, fraction answer
    ("\\frac{3}{4}", "3/4", 1.0),         # LaTeX \frac gold
    ("1/2", "\\frac{1}{2}", 1.0),         # LaTeX \frac answer
    ("0.5", "\\boxed{\\frac12}", 1.0),    # boxed, short \frac form
    ("\\boxed{3/4}", "0.75", 1.0),        # boxed gold
    ("1/2", "2/4", 1.0),                  # unreduced fraction
    ("2/3", "0.666667", 1.0),             # equal to 6 decimals
    ("6", "6.0", 1.0),
    ("-4", "-4", 1.0),                    # negative numbers
    ("-3/4", "-0.75", 1.0),
    ("x=5", "5", 1.0),                    # equation gold, bare value
    ("5", "x=5", 1.0),
    ("5", "the answer is \\boxed{5}", 1.0),
    ("\\{1,2\\}", "\\{2,1\\}", 1.0),      # sets, order-free
    ("[0,1)", "[0,1)", 1.0),              # intervals
    ("-4", "4", 0.0),                     # wrong sign
    ("3/4", "0.7", 0.0),                  # wrong value
    ("2/3", "0.667", 0.0),                # too coarse
    ("[0,1)", "(0,1)", 0.0),              # different interval
    ("5", "\\boxed{4} 5", 0.0),           # the boxed answer wins
    ("3", "abc", 0.0),                    # no number
    ("3", "", 0.0),
    ("3", "9^9^9^9", 0.0),                # power tower: refused before sympy can stall
])
def test_math_verify_equivalences(env, gold, text, expected):
    assert env.correct(Task("q", gold), _c(text)) == expected
    assert env.score(Task("q", gold), _c(text)) == expected  # shaping is off by default


def test_a_cut_off_completion_is_wrong_unless_allowed(env):
    assert env.correct(Task("q", "3/4"), _c("0.75", finished=False)) == 0.0
    lenient = MathEnv(MathConfig(require_finished=False))
    assert lenient.correct(Task("q", "3/4"), _c("0.75", finished=False)) == 1.0


def test_scoring_off_the_main_thread_runs_without_signal_timeouts():
    # math-verify's signal.alarm raises ValueError off the main thread; the env must not.
    results = []
    worker = threading.Thread(target=lambda: results.extend(
        [answers_match("3/4", "0.75"), answers_match("3", "9^9^9^9"), answers_match("\\{1,2\\}", "\\{2,1\\}")]))
    worker.start()
    worker.join(timeout=30)
    assert results == [True, False, True]


# --- reward shaping ------------------------------------------------------------------------------

@pytest.mark.parametrize("correct, partial, weight, expected", [
    (1.0, 1.0, 0.1, 1.0),   # correct: exactly 1 whatever the partial credit
    (1.0, 0.0, 0.5, 1.0),
    (0.0, 1.0, 0.1, 0.1),   # wrong, full partial credit: the weight
    (0.0, 0.5, 0.2, 0.1),   # max(0, 0.2 * 0.5)
    (0.0, 3.0, 0.2, 0.2),   # partial clipped to 1
    (0.0, -1.0, 0.2, 0.0),  # ... and to 0
    (0.0, 1.0, 0.0, 0.0),   # weight 0: no shaping
])
def test_shaped_reward_is_max_of_correct_and_weighted_partial(correct, partial, weight, expected):
    assert shaped_reward(correct, partial, weight) == pytest.approx(expected)


def test_math_env_gives_format_credit_to_wrong_numeric_answers_only():
    shaped = MathEnv(MathConfig(shaping={"weight": 0.1}))
    task = Task("1/2+1/4=", "3/4")
    cases = {("0.75", True): 1.0, ("3/4", True): 1.0, ("7", True): 0.1, ("-2/3", True): 0.1, ("x=4", True): 0.1,
             ("abc", True): 0.0, ("", True): 0.0, ("x+1", True): 0.0, ("7", False): 0.0, ("0.75", False): 0.0}
    assert {k: shaped.score(task, _c(*k)) for k in cases} == pytest.approx(cases)
    # correctness (what pass rates average) never includes the partial credit
    assert shaped.correct(task, _c("7")) == 0.0 and unshaped_score(shaped, task, _c("7")) == 0.0
    assert unshaped_score(shaped, task, _c("0.75")) == 1.0
    # an environment without `correct` (no shaping) is scored by `score`
    assert unshaped_score(ArithmeticEnv(), Task("1+1=", "2"), _c("2")) == 1.0


def test_shaping_function_replaces_the_builtin_partial_credit(tmp_path, monkeypatch):
    (tmp_path / "my_credit.py").write_text(
        "def digits(task, completion):\n    return sum(ch.isdigit() for ch in completion.text) / 4\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    shaped = build_env("math", {"shaping": {"weight": 0.4, "function": "my_credit:digits"}})
    task = Task("q", "3/4")
    assert shaped.score(task, _c("12")) == pytest.approx(0.4 * 0.5)     # 2 digits / 4
    assert shaped.score(task, _c("12345")) == pytest.approx(0.4)        # clipped to 1
    assert shaped.score(task, _c("abc")) == 0.0
    assert shaped.score(task, _c("0.75")) == 1.0
    clone = pickle.loads(pickle.dumps(shaped))
    assert clone.score(task, _c("12")) == pytest.approx(0.2)


def test_shaping_config_is_checked():
    with pytest.raises(ValueError, match="less than 1"):
        ShapingConfig(weight=1.0)
    with pytest.raises(ValueError, match="module:function"):
        ShapingConfig(function="no_colon")
    with pytest.raises(ScaleRLError, match="env.args.shaping.function: cannot import module 'no_such_mod_xyz'"):
        MathEnv(MathConfig(shaping={"weight": 0.1, "function": "no_such_mod_xyz:f"}))
    with pytest.raises(ScaleRLError, match="module 'json' has no attribute 'nope'"):
        MathEnv(MathConfig(shaping={"weight": 0.1, "function": "json:nope"}))


# --- pickling: a worker pool sends the env to worker processes -----------------------------------

def _score_in_worker(env_blob: bytes, task: Task, text: str) -> float:
    return pickle.loads(env_blob).score(task, _c(text))


def test_env_is_picklable_and_scores_in_a_worker_process():
    shaped = MathEnv(MathConfig(shaping={"weight": 0.1}))
    clone = pickle.loads(pickle.dumps(shaped))
    assert clone.train_tasks() == shaped.train_tasks() and clone.eval_tasks() == shaped.eval_tasks()
    task = Task("q", "\\frac{3}{4}")
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method)) as pool:
        got = [pool.submit(_score_in_worker, pickle.dumps(shaped), task, t).result(timeout=60) for t in ("0.75", "2", "no")]
        bound = pool.submit(pickle.loads(pickle.dumps(shaped.score)), task, _c("3/4")).result(timeout=60)
    assert got == [1.0, pytest.approx(0.1), 0.0] and bound == 1.0


# --- data: the shipped set, JSONL and Hugging Face sources, and their errors ---------------------

def test_default_data_split_and_prompt_template(env):
    train, held_out = env.train_tasks(), env.eval_tasks()
    assert (len(train), len(held_out)) == (274, 50)
    assert not {t.prompt for t in train} & {t.prompt for t in held_out}
    assert MathEnv().eval_tasks() == held_out  # the split is seeded
    templated = MathEnv(MathConfig(prompt_template="Q: {prompt} A:"))
    assert templated.eval_tasks()[0].prompt == f"Q: {held_out[0].prompt} A:"
    assert held_out[0].meta["kind"] in {"frac_sum", "frac_product", "simplify", "decimal_as_fraction", "percentage",
                                        "linear_equation", "signed_expression", "mean", "half"}


def _load_script():
    spec = importlib.util.spec_from_file_location("make_math_data", ROOT / "scripts" / "make_math_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_data_is_the_script_output_and_fits_the_builtin_model():
    script = _load_script()
    rows = [json.loads(line) for line in DEFAULT_DATA.read_text().splitlines()]
    assert rows == script.make_rows(36, 0)  # deterministic and up to date
    assert len(rows) == 324 and len({r["prompt"] for r in rows}) == 324
    allowed = set(CHARS)
    assert all(len(r["prompt"]) <= 24 and set(r["prompt"]) <= allowed for r in rows)
    forms = {"\\frac" in r["answer"] or "\\boxed" in r["answer"] or "." in r["answer"] for r in rows}
    assert forms == {True, False}  # varied answer forms
    for q in (Fraction(3, 4), Fraction(-7, 8), Fraction(5, 3), Fraction(12), Fraction(-3)):
        plain = f"{q.numerator}/{q.denominator}" if q.denominator > 1 else str(q.numerator)
        assert all(answers_match(form, plain) for form in script.answer_forms(q)), q


def test_jsonl_data_with_custom_columns(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"question": f"{i}+{i}=", "solution": f"\\frac{{{2 * i}}}{{1}}", "id": i}
                                               for i in range(10)])
    env = MathEnv(MathConfig(data_path=path, prompt_column="question", answer_column="solution", eval_size=3))
    assert len(env.eval_tasks()) == 3 and len(env.train_tasks()) == 7
    task = env.train_tasks()[0]
    assert task.meta.keys() == {"id"} and env.score(task, _c(str(2 * task.meta["id"]))) == 1.0


@pytest.mark.parametrize("content, needles", [
    (None, ["env.args.data_file", "missing.jsonl", "does not exist"]),
    ([{"prompt": "1+1="}], ["env.args.answer_column", "column 'answer'", "d.jsonl:1", "it has: prompt"]),
    ([{"prompt": "1+1=", "answer": "2"}, {"answer": "3"}], ["env.args.prompt_column", "column 'prompt'", "d.jsonl:2"]),
    ([], ["env.args.data_file", "d.jsonl", "holds no rows"]),
    (["{not json"], ["env.args.data_file", "d.jsonl:1: not valid JSON"]),
    (["[1, 2]"], ["env.args.data_file", "d.jsonl:1: not a JSON object"]),
    (_rows(5), ["env.args.eval_size", "leaves no training problems out of 5"]),
])
def test_jsonl_errors_are_one_line_and_name_the_file(tmp_path, content, needles):
    path = tmp_path / "missing.jsonl" if content is None else _write_jsonl(tmp_path / "d.jsonl", content)
    with pytest.raises(ScaleRLError) as err:
        MathEnv(MathConfig(data_path=path, eval_size=5))
    message = str(err.value)
    assert "\n" not in message and all(n in message for n in needles), message


@pytest.mark.parametrize("args, needle", [
    ({"data_path": "a.jsonl", "hf_dataset": "x"}, "not both"),
    ({"eval_split": "test"}, "eval_split needs hf_dataset"),
    ({"prompt_template": "Solve:"}, "env.args.prompt_template"),
    ({"shaping": {"weight": 2}}, "env.args.shaping.weight"),
    ({"answer_col": "a"}, "env.args.answer_col"),
])
def test_config_errors_name_the_key(args, needle):
    with pytest.raises(ScaleRLError, match=needle):
        validate_env_args("math", args)


def test_missing_datasets_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(ScaleRLError, match=r"needs the optional 'datasets' package; pip install 'scalerl\[datasets\]'"):
        MathEnv(MathConfig(hf_dataset="some/dataset"))


def test_hf_dataset_from_a_save_to_disk_folder(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the optional 'datasets' package is not installed")
    make = lambda n, off: datasets.Dataset.from_dict(
        {"problem": [f"{i}*2=" for i in range(off, off + n)], "solution": [f"\\boxed{{{2 * i}}}" for i in range(off, off + n)]})
    folder = tmp_path / "ds"
    datasets.DatasetDict({"train": make(12, 0), "test": make(4, 100)}).save_to_disk(str(folder))
    config = {"hf_dataset": str(folder), "prompt_column": "problem", "answer_column": "solution"}

    env = MathEnv(MathConfig(**config, eval_split="test", eval_size=3))
    assert len(env.train_tasks()) == 12 and [t.prompt for t in env.eval_tasks()] == ["100*2=", "101*2=", "102*2="]
    assert env.score(env.eval_tasks()[0], _c("200")) == 1.0 and env.score(env.eval_tasks()[0], _c("201")) == 0.0
    carved = MathEnv(MathConfig(**config, eval_size=2))
    assert (len(carved.train_tasks()), len(carved.eval_tasks())) == (10, 2)

    with pytest.raises(ScaleRLError, match=r"env.args.answer_column: column 'answer' is missing from .*ds split 'train' \(it has: problem, solution\)"):
        MathEnv(MathConfig(hf_dataset=str(folder), prompt_column="problem"))
    with pytest.raises(ScaleRLError, match=r"env.args.split: .*ds has no split 'dev'; use one of \[train, test\]"):
        MathEnv(MathConfig(**config, split="dev"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ScaleRLError, match="env.args.hf_dataset: .*empty is not a save_to_disk folder"):
        MathEnv(MathConfig(hf_dataset=str(tmp_path / "empty")))
    single = tmp_path / "single"
    make(5, 0).save_to_disk(str(single))
    assert len(MathEnv(MathConfig(hf_dataset=str(single), prompt_column="problem", answer_column="solution",
                                  eval_size=1)).train_tasks()) == 4
    with pytest.raises(ScaleRLError, match="env.args.eval_split: .* holds a single split"):
        MathEnv(MathConfig(hf_dataset=str(single), prompt_column="problem", answer_column="solution", eval_split="test"))


# --- evaluation sees correctness only ------------------------------------------------------------

def test_pass_rate_averages_correctness_not_the_shaped_reward(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalerl.distributed.context import DistContext
    from scalerl.envs.scoring import completions_of
    from scalerl.models.paths import builtin_model_dir
    from scalerl.types import SamplingParams
    from scalerl.rollout.hf import HFSampler
    from scalerl.rollout.evaluation import pass_rate

    # sums the built-in model half knows: some greedy answers right, the rest wrong numbers
    path = _write_jsonl(tmp_path / "sums.jsonl", [{"prompt": f"{a}+{b}=", "answer": f"\\boxed{{{a + b}}}"}
                                                  for a in range(10, 90, 9) for b in range(5, 60, 13)])
    env = MathEnv(MathConfig(data_path=path, eval_size=16, shaping={"weight": 0.1}))
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    model = AutoModelForCausalLM.from_pretrained(builtin_model_dir(), dtype=torch.float32)
    sampler = HFSampler(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, device=torch.device("cpu"))
    tasks = env.eval_tasks()
    rate = pass_rate(env, tasks, sampler, tokenizer, SamplingParams(max_new_tokens=8, temperature=0.0), batch_size=16, ctx=DistContext())

    rollout = sampler.sample([tokenizer(t.prompt)["input_ids"] for t in tasks], SamplingParams(max_new_tokens=8, temperature=0.0))
    completions = completions_of(rollout, tokenizer)
    correct = sum(env.correct(t, c) for t, c in zip(tasks, completions)) / len(tasks)
    shaped = sum(env.score(t, c) for t, c in zip(tasks, completions)) / len(tasks)
    assert 0 < correct < 1 and shaped > correct  # the check below can tell the two apart
    assert rate == pytest.approx(correct)


# --- end to end ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_train_cli_runs_on_math_with_shaping_kept_out_of_the_pass_rate(runs):
    overrides = tiny_overrides(runs, "math", **{"env.name": "math", "train.steps": 2, "eval.every": 2})
    sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    proc = run_cli("-m", "scalerl.cli.main", "train", *sets, "--set", 'env.args={"shaping": {"weight": 0.1}}', timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in (runs / "math" / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((runs / "math" / "summary.json").read_text())
    assert [r["step"] for r in rows] == [1, 2]
    # 16 rewards per step, each in {0, 0.1, 1}: the mean times 16 is a sum of 0.1s and 1s
    for r in rows:
        tenths = r["reward_mean"] * 16 * 10
        assert tenths == pytest.approx(round(tenths), abs=1e-3) and 0 < r["reward_mean"] <= 1
    # the held-out pass rate is an exact-answer rate over 16 greedy answers (no 0.1 credits)
    for rate in (summary["pass_rate_before"], summary["pass_rate_after"], rows[-1]["eval/pass_rate"]):
        assert rate * 16 == pytest.approx(round(rate * 16))
