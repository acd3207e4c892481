"""scalerl.Trainer: a model object, a dataset of your own and reward callables, through the job `scalerl train` runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from conftest import run_cli
from scalerl import Config, Trainer
from scalerl.errors import ScaleRLError
from scalerl.models.paths import builtin_model_dir

WORDS = "one two three four five six seven eight nine ten eleven twelve".split()
ROWS = [{"prompt": f"spell {w}", "target": len(w), "word": w} for w in WORDS]


def tiny(runs: Path, name: str, **extra) -> dict:
    """Two prompts x four completions of at most 6 tokens per step; 2 held-out prompts."""
    return {"rollout.prompts_per_step": 2, "rollout.group_size": 4, "rollout.max_new_tokens": 6, "train.steps": 5,
            "train.threads": 1, "eval.every": 0, "log.run_dir": str(runs), "log.name": name, "log.console": "none",
            "log.tensorboard": False, **extra}


def random_qwen2():
    """A random-init two-layer Qwen2 with the built-in character tokenizer: nothing downloaded."""
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_dir())
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return Qwen2ForCausalLM(config), tokenizer


def test_model_object_rows_and_a_column_reward_train_evaluate_and_save(runs, tmp_path):
    model, tokenizer = random_qwen2()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    calls = []

    def length_reward(prompts, completions, target, word, **kwargs):
        calls.append((list(prompts), list(target), list(word)))
        return [-abs(len(c) - t) for c, t in zip(completions, target)]

    trainer = Trainer(model=model, tokenizer=tokenizer, reward_funcs=length_reward, train_dataset=ROWS,
                      config=tiny(runs, "api"), overrides={"optim.lr": 1e-3})
    summary = trainer.train()
    assert summary["steps"] == 5
    assert summary["eval_metric"] == "mean reward"  # no verifier: the console calls it a mean reward, not a pass rate
    assert trainer.config.optim.lr == 1e-3  # overrides on top of the config dict
    by_prompt = {f"spell {r['word']}": r for r in ROWS}
    training_calls = [c for c in calls if len(c[0]) == 8]  # 2 prompts x 4 completions per step
    assert len(training_calls) == 5
    for prompts, target, word in calls:  # every completion's own row: the columns arrive by name, row-aligned
        assert target == [by_prompt[p]["target"] for p in prompts] and word == [by_prompt[p]["word"] for p in prompts]
    metrics = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["reward/length_reward_failures"] for m in metrics if "reward/length_reward_failures" in m] == [0.0] * 5
    score = trainer.evaluate()
    assert isinstance(score, float) and score <= 0  # -|len - target| averaged over the held-out prompts
    assert score == pytest.approx(summary["pass_rate_after"])  # the run's own final evaluation, measured again
    out = trainer.save(tmp_path / "hf")
    saved = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(saved, Qwen2ForCausalLM)
    changed = [k for k, v in saved.state_dict().items() if not torch.equal(v, initial[k])]
    assert changed, "the saved weights are the initial ones: nothing was trained"
    assert AutoTokenizer.from_pretrained(out).get_vocab() == tokenizer.get_vocab()


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("form", ["datasets", "jsonl"])
def test_a_datasets_dataset_and_a_jsonl_path_train_with_their_columns(runs, tmp_path, form):
    from datasets import Dataset

    data = Dataset.from_list(ROWS) if form == "datasets" else _jsonl(tmp_path / "rows.jsonl", ROWS)
    seen = set()

    def first_letter(prompts, completions, word, **kwargs):
        seen.update(word)
        return [float(c[:1] == w[:1]) for c, w in zip(completions, word)]

    eval_rows = [{"prompt": "spell zero", "word": "zero"}]
    trainer = Trainer(model="builtin", reward_funcs=[first_letter], train_dataset=data, eval_dataset=eval_rows,
                      config=tiny(runs, form, **{"train.steps": 2}))
    assert trainer.train()["steps"] == 2
    assert "zero" in seen and 2 <= len(seen - {"zero"}) and seen - {"zero"} <= set(WORDS)  # training rows and the eval row
    assert trainer.evaluate() in (0.0, 1.0)  # one held-out prompt, a 0/1 reward
    config = yaml.safe_load((trainer.run_dir / "config.yaml").read_text())
    assert config["env"]["name"] == "reward_model"
    assert config["reward"]["components"][0]["function"] == "python:first_letter"
    if form == "jsonl":
        assert config["env"]["args"]["data_file"] == str(data)  # a file is read where it is, not copied


def test_chat_message_prompts_reach_the_reward_as_messages(runs, tmp_path):
    """TRL's conversational format: prompts as message lists in, completions as [{"role": "assistant", ...}] out."""
    template = tmp_path / "chat.jinja"  # the built-in tokenizer has no chat template: a minimal one it can encode
    template.write_text("{% for m in messages %}{{ m['content'] }}: {% endfor %}")
    rows = [{"prompt": [{"role": "user", "content": f"spell {w}"}], "word": w} for w in WORDS]
    got = {}

    def reward(prompts, completions, **kwargs):
        got["prompt"], got["completion"] = prompts[0], completions[0]
        return [1.0] * len(completions)

    Trainer(reward_funcs=reward, train_dataset=rows, config=tiny(runs, "chat", **{"train.steps": 1, "env.chat_template": str(template)})).train()
    assert got["prompt"][-1]["role"] == "user" and got["prompt"][-1]["content"].startswith("spell ")
    assert got["completion"][0]["role"] == "assistant" and isinstance(got["completion"][0]["content"], str)


def test_reward_weights_fuse_several_callables(runs, capsys):
    rewards = [lambda prompts, completions, **kw: [1.0] * len(completions), lambda prompts, completions, **kw: [2.0] * len(completions)]
    trainer = Trainer(reward_funcs=rewards, reward_weights=[0.5, 2.0], train_dataset=ROWS, config=tiny(runs, "weights", **{"train.steps": 1}))
    assert [c.name for c in trainer.config.reward.components] == ["_lambda_", "_lambda__1"]
    assert trainer.evaluate() == pytest.approx(0.5 * 1.0 + 2.0 * 2.0)  # before training: the starting model
    trainer.train()
    assert trainer.evaluate() == pytest.approx(0.5 * 1.0 + 2.0 * 2.0)
    capsys.readouterr()
    # a new Trainer under the same log.name, before its train(): the earlier run's checkpoint, and it says so
    Trainer(reward_funcs=rewards, reward_weights=[0.5, 2.0], train_dataset=ROWS, config=tiny(runs, "weights")).evaluate()
    assert "evaluate: scoring " in (err := capsys.readouterr().err) and "step_0000001, of an earlier run under log.name 'weights'" in err


def test_a_config_object_or_a_yaml_path_is_the_base(runs, tmp_path):
    base = Config.model_validate({"rollout": {"group_size": 2}, "log": {"run_dir": str(runs), "name": "base"}})
    assert Trainer(config=base, overrides={"optim.lr": 3e-5}).config.optim.lr == 3e-5
    path = tmp_path / "run.yaml"
    path.write_text("rollout:\n  group_size: 3\n")
    assert Trainer(config=path).config.rollout.group_size == 3


def test_one_line_errors(runs):
    with pytest.raises(ScaleRLError, match="row 1 has no 'prompt' column"):
        Trainer(reward_funcs=len, train_dataset=[{"prompt": "a"}, {"question": "b"}], config=tiny(runs, "e1"))
    with pytest.raises(ScaleRLError, match="row 0 has a column 'answers', a name reward functions already receive"):
        Trainer(reward_funcs=len, train_dataset=[{"prompt": "a", "answers": 1}, {"prompt": "b", "answers": 2}], config=tiny(runs, "e4"))
    with pytest.raises(ScaleRLError, match="reward_weights: 1 weights for 2 reward functions"):
        Trainer(reward_funcs=[len, len], reward_weights=[1.0], train_dataset=ROWS, config=tiny(runs, "e2"))
    with pytest.raises(ScaleRLError, match="rollout.mode=async .* cannot call the reward functions"):
        Trainer(reward_funcs=len, train_dataset=ROWS, config=tiny(runs, "e3", **{"rollout.mode": "async", "algorithm.tis_cap": 2.0})).train()


def test_the_cli_refuses_a_python_callable_by_name_in_one_line(runs):
    """The API's config.yaml names its callables `python:NAME`; the CLI, which cannot hold them, says so."""
    def rw(prompts, completions, **kw):
        return [0.0] * len(completions)

    trainer = Trainer(reward_funcs=rw, train_dataset=ROWS, config=tiny(runs, "api-run", **{"train.steps": 1}))
    trainer.train()
    out = run_cli("-m", "scalerl.cli.main", "train", "--config", str(trainer.run_dir / "config.yaml"), "--name", "cli-run",
                  timeout=240)
    assert out.returncode == 2, out.stderr[-2000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and "python:rw" in line and "module:function" in line and "`trainer.evaluate()` there" in line
    assert not (runs / "cli-run").exists()  # refused with the config's checks, before anything loaded or was written


@pytest.mark.slow
def test_the_example_script_runs_and_learns(tmp_path):
    """examples/python_api.py as a user runs it (from their own folder): it trains, and the held-out reward rises."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "python_api.py")], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("held-out reward:"))
    before, after = (float(x) for x in line.split("|")[0].split(":")[1].split("->"))
    assert after > before
    assert (tmp_path / "runs" / "python-api-model" / "config.json").is_file()
