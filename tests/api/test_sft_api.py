"""`scalerl.sft` / `scalerl sft`: the job resumes bitwise, its output folder trains with `scalerl train` as it is,
chat rows go through the template, and bad input is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import scalerl
from scalerl.errors import ScaleRLError
from tests.conftest import tiny_overrides

ROWS = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a in range(3, 9) for b in range(10, 14)]  # 24 rows


def settings(runs: Path, name: str, **extra) -> dict:
    return {"log.run_dir": str(runs), "log.name": name, "train.threads": 1, "sft.steps": 4, "sft.batch_size": 8,
            "sft.micro_batch_size": 4, "sft.lr": 1e-3, "checkpoint.every": 2, "checkpoint.keep_last": 5, **extra}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, dict]:
    runs = tmp_path_factory.mktemp("sft") / "runs"
    summary = scalerl.sft(model="builtin", train_dataset=ROWS, config=settings(runs, "whole"))
    return runs, summary


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_it_learns_and_writes_a_model_folder(finished):
    runs, summary = finished
    assert summary["steps"] == 4 and summary["examples"] == 24 and Path(summary["model"]) == runs / "whole" / "model"
    losses = [json.loads(line)["loss"] for line in (runs / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 4 and all(0 < loss < 5 for loss in losses)  # the token mean of −log p over a 55-token vocabulary
    base = weights(Path(scalerl.__file__).parent / "models" / "builtin")
    assert any(not torch.equal(base[k], v) for k, v in weights(Path(summary["model"])).items())


def test_resume_is_bitwise(finished):
    """Stop after step 2 (the step-4 checkpoint and the model never written), resume: the same weights as the whole run."""
    runs, summary = finished
    run = runs / "whole"
    cut = runs / "cut"
    shutil.copytree(run, cut, ignore=shutil.ignore_patterns("step_0000004", "model", "summary.json"))
    config = scalerl.Config.model_validate({**yaml_tree(cut), "log": {**yaml_tree(cut)["log"], "name": "cut"}})
    resumed = scalerl.sft(config=config, resume=True)
    assert resumed["steps"] == 4
    whole, again = weights(run / "model"), weights(cut / "model")
    assert whole.keys() == again.keys() and all(torch.equal(whole[k], again[k]) for k in whole)


def test_stop_reason_is_the_window_mean():
    from scalerl.jobs.sft import stop_reason

    assert stop_reason([0.9, 0.5, 0.3], None, 2) is None  # no stop_at_loss: never
    assert stop_reason([0.3], 0.4, 2) is None  # fewer losses than the window
    assert stop_reason([0.9, 0.5, 0.35], 0.4, 2) is None  # (0.5 + 0.35) / 2 = 0.425 > 0.4
    assert stop_reason([0.9, 0.5, 0.3], 0.4, 2) == "sft.stop_at_loss: mean loss of the last 2 updates 0.4000 <= 0.4"  # (0.5 + 0.3) / 2


def test_stop_at_loss_ends_early_and_resumes_to_the_same_update(finished):
    """The whole run's losses l1..l4 (1.05, 1.82, 1.75, ...: lr 1e-3 on 8 rows jumps about). stop_at_loss = (l1 + l2) / 2
    over a window of 2 stops after update 2 with update 2's weights (the runs are bitwise alike), not after update 1
    (l1 alone is below it: the window counts); cut after the step-1 checkpoint, a resumed run stops after update 2 too
    (it needs l1 from the checkpoint)."""
    runs, _ = finished
    l1, l2, l3, _l4 = [json.loads(line)["loss"] for line in (runs / "whole" / "metrics.jsonl").read_text().splitlines()]
    target = (l1 + l2) / 2
    assert l1 <= target < (l2 + l3) / 2  # a window of 1 would stop after update 1; one resumed without l1, never at 2
    extra = {"sft.stop_at_loss": target, "sft.stop_window": 2, "checkpoint.every": 1}
    early = scalerl.sft(model="builtin", train_dataset=ROWS, config=settings(runs, "early", **extra))
    assert early["steps"] == 2 and early["max_steps"] == 4 and early["stopped"].startswith("sft.stop_at_loss: mean loss of the last 2")
    assert len((runs / "early" / "metrics.jsonl").read_text().splitlines()) == 2
    cut = runs / "early_cut"
    shutil.copytree(runs / "early", cut, ignore=shutil.ignore_patterns("step_0000002", "model", "summary.json"))
    tree = yaml_tree(cut)
    resumed = scalerl.sft(config=scalerl.Config.model_validate({**tree, "log": {**tree["log"], "name": "early_cut"}}), resume=True)
    assert resumed["steps"] == 2 and resumed["stopped"] == early["stopped"]
    final, again = weights(runs / "early" / "model"), weights(cut / "model")
    assert all(torch.equal(final[k], again[k]) for k in final)
    assert not all(torch.equal(final[k], v) for k, v in weights(runs / "whole" / "model").items())  # not the 4-update model


def yaml_tree(run: Path) -> dict:
    import yaml

    return yaml.safe_load((run / "config.yaml").read_text())


def test_its_output_trains_with_scalerl_train(finished, tmp_path):
    from scalerl.config import load_config
    from scalerl.trainer.loop import train

    _, summary = finished
    config = load_config(overrides=tiny_overrides(tmp_path / "runs", "rl", **{"model.path": summary["model"], "train.steps": 2,
                                                                              "eval.every": 0, "eval.max_tasks": 4}))
    result = train(config)
    assert result["steps"] == 2 and (tmp_path / "runs" / "rl" / "checkpoints" / "step_0000002").is_dir()


def test_two_processes_give_the_one_process_weights(finished, tmp_path):
    """`scalerl sft --nproc 2` (torchrun, gloo, DDP): each update's 8 rows split 4 and 4, gradients averaged; every row
    has as many response tokens, so the update is the one-process run's (which accumulates two micro-batches of 4)."""
    from tests.conftest import run_cli

    runs, _ = finished
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    sets = {**settings(tmp_path / "runs", "two", **{"sft.data": str(data), "parallel.strategy": "ddp"}), "sft.micro_batch_size": None}
    proc = run_cli("-m", "scalerl.cli.main", "sft", "--nproc", "2", *(a for k, v in sets.items() if v is not None for a in ("--set", f"{k}={v}")))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "world_size: 2" in (tmp_path / "runs" / "two" / "resolved.yaml").read_text()
    one, two = weights(runs / "whole" / "model"), weights(tmp_path / "runs" / "two" / "model")
    assert one.keys() == two.keys() and max((one[k] - two[k]).abs().max().item() for k in one) < 1e-5


def test_chat_rows_and_bad_input(tmp_path):
    from scalerl.jobs.sft import load_examples
    from scalerl.models.loading import load_tokenizer
    from scalerl.config import load_config

    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "2+3="}, {"role": "assistant", "content": "5"}]}) + "\n")
    template = tmp_path / "chat.jinja"  # what `scalerl train` renders a conversation with, for a character tokenizer
    template.write_text("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}a:{% endif %}")
    config = load_config(overrides={"sft.data": str(data), "env.chat_template": str(template)})
    tokenizer = load_tokenizer(config.model)
    (row,) = load_examples(config, tokenizer)
    (prompt, response), = row
    assert tokenizer.decode(prompt).endswith("u:2+3= a:") and tokenizer.decode(response) == "5</s>"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "2+3="}]}) + "\n")
    with pytest.raises(ScaleRLError, match=r"^sft.data: .*chat.jsonl:1: 'messages' must end with the assistant's reply"):
        load_examples(config, tokenizer)
    with pytest.raises(ScaleRLError, match=r"^sft.data: give the data to fine-tune on"):
        scalerl.sft(config={"log.run_dir": str(tmp_path)})


def test_cli_bad_data_is_one_line_exit_2(tmp_path):
    from typer.testing import CliRunner

    from scalerl.cli.main import app

    result = CliRunner().invoke(app, ["sft", "--set", f"sft.data={tmp_path}/none.jsonl", "--set", f"log.run_dir={tmp_path}"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == f"error: sft.data: {tmp_path}/none.jsonl does not exist; give a JSONL file or a save_to_disk folder"


def test_scalerl_eval_scores_a_run_on_reasoning_gym(finished, tmp_path):
    """`scalerl eval RUN` on a run whose env is reasoning_gym: its held-out tasks, judged by the dataset's verifier."""
    pytest.importorskip("reasoning_gym", reason="needs the optional reasoning-gym package: pip install 'scalerl[reasoning-gym]'")
    import yaml

    from scalerl.jobs.evaluate import run_eval

    runs, _ = finished
    run = tmp_path / "rg"
    shutil.copytree(runs / "whole", run, ignore=shutil.ignore_patterns("model"))
    tree = yaml_tree(run)
    tree["env"] = {"name": "reasoning_gym", "args": {"datasets": [{"name": "basic_arithmetic", "size": 20, "eval_size": 3}],
                                                     "extract": "last_line", "prompt_template": "{question}"}}
    (run / "config.yaml").write_text(yaml.safe_dump(tree))
    result = run_eval(str(run), None, 1, None, None, 4, 0)
    assert result["env"] == "reasoning_gym" and result["tasks"] == 3 and result["scored_by"] == "verifier"
    assert result["pass_rate"] in (0.0, 1 / 3, 2 / 3, 1.0)
