"""Prompts that cannot fit (scalerl/rollout/prompt_fit.py): a 1,003-token prompt on the built-in model (64 positions,
56 of them for the prompt with max_new_tokens=8) is refused by `--dry-run` and by a run before it trains, in one line;
with `rollout.truncate_prompts=left` it is cut to its last 56 tokens, warned once and counted per step."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from conftest import run_cli
from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.jsonl import read_metrics
from scalerl.models.build import build_policy
from scalerl.models.loading import load_tokenizer
from scalerl.rollout.build import build_rollout
from scalerl.rollout.chat import prompt_format
from scalerl.types import Task

LONG = "1+" * 499 + "1="  # after "{i}+": 1,002 characters, 1,003 tokens with the built-in tokenizer's BOS
LIMIT = 64 - 8  # the built-in model's positions less rollout.max_new_tokens


def _data(tmp_path: Path, long_rows: int, short_rows: int = 0) -> Path:
    path = tmp_path / "long.jsonl"
    rows = [{"prompt": f"{i}+" + LONG, "answer": "0"} for i in range(long_rows)]  # distinct: the stream keeps each
    rows += [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(short_rows)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _train(tmp_path: Path, data: Path, *extra: str, dry_run: bool = False):
    args = ["-m", "scalerl.cli.main", "train", *(["--dry-run"] if dry_run else []), "--set", f"env.args.data_file={data}",
            "--set", f"log.run_dir={tmp_path / 'runs'}", "--set", "log.name=long", "--set", "log.console=none",
            "--set", "train.steps=3", "--set", "train.threads=1", "--set", "rollout.prompts_per_step=2",
            "--set", "rollout.group_size=2", "--set", "eval.every=0", *extra]
    return run_cli(*args, timeout=180, env={"HF_HUB_OFFLINE": "1"})


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def _names_length_and_limit(line: str) -> None:
    assert "has 1003 tokens" in line and "training task 1 of 2" in line, line
    assert f"longer than {LIMIT}" in line and "64 positions" in line and "max_new_tokens=8" in line, line
    assert "rollout.truncate_prompts=left" in line, line  # the fix


def test_dry_run_refuses_a_prompt_longer_than_the_model_positions(tmp_path, fault):
    line = _one_error_line(_train(tmp_path, _data(tmp_path, 1, 1), dry_run=True))
    _names_length_and_limit(line)
    fault("bad input", "a 1,003-token prompt on the built-in model (64 positions), --dry-run", f"exit 2: {line}")


def test_a_run_refuses_it_before_training(tmp_path, fault):
    proc = _train(tmp_path, _data(tmp_path, 1, 1))
    line = _one_error_line(proc)
    _names_length_and_limit(line)
    metrics = tmp_path / "runs" / "long" / "metrics.jsonl"
    assert not metrics.exists() or read_metrics(tmp_path / "runs" / "long") == []
    fault("bad input", "a 1,003-token prompt on the built-in model (64 positions), a run", f"exit 2 before training: {line}")


def test_left_truncation_trains_warns_once_and_counts(tmp_path, fault):
    proc = _train(tmp_path, _data(tmp_path, 4), "--set", "rollout.truncate_prompts=left")
    assert proc.returncode == 0, proc.stderr[-2000:]
    warned = [line for line in proc.stderr.splitlines() if "rollout.truncate_prompts=left" in line]
    assert len(warned) == 1, proc.stderr
    assert f"4 of 204 prompts are longer than {LIMIT} tokens" in warned[0] and f"last {LIMIT} tokens" in warned[0], warned
    rows = read_metrics(tmp_path / "runs" / "long")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["prompts_truncated"] for r in rows] == [2, 2, 2]  # every training prompt is long, 2 a step
    fault("bad input", "1,003-token prompts with rollout.truncate_prompts=left", f"exit 0, 3 steps, warned once ({warned[0]}), "
          "prompts_truncated 2 of 2 prompts each step")


def _worker(tmp_path: Path, data: Path, setting: str):
    config = load_config(overrides=[f"env.args.data_file={data}", f"rollout.truncate_prompts={setting}", "rollout.prompts_per_step=4",
                                    "rollout.group_size=2", "env.shuffle=false", f"log.run_dir={tmp_path}"])
    ctx = DistContext(device=torch.device("cpu"))
    tokenizer = load_tokenizer(config.model)
    policy = build_policy(config, ctx.device).eval()
    worker = build_rollout(config, ctx, tmp_path, policy, tokenizer, contextlib.nullcontext, announce=False)
    whole = prompt_format(config.env.chat_template, config.env.system_prompt, tokenizer)
    return worker, whole


def _sampled_prompts(batch) -> list[list[int]]:
    """Each group's prompt ids as sampled (left padding dropped)."""
    rollout = batch.rollout
    rows = rollout.group_ids.tolist()
    firsts = [rows.index(g) for g in sorted(set(rows))]
    return [[t for t, m in zip(rollout.prompt_ids[b].tolist(), rollout.prompt_mask[b].tolist()) if m] for b in firsts]


def test_the_sampled_prompt_ids_are_the_kept_end_or_start(tmp_path):
    data = _data(tmp_path, 2, 2)
    for setting in ("left", "right"):
        worker, whole = _worker(tmp_path, data, setting)
        batch = worker.produce(1)
        tasks = [Task(t.prompt, t.answer) for t in worker.env.train_tasks()]
        expected = []
        for task in tasks:
            ids = whole.encode(task)
            expected.append(ids if len(ids) <= LIMIT else ids[-LIMIT:] if setting == "left" else ids[:LIMIT])
        assert sorted(_sampled_prompts(batch)) == sorted(expected), setting
        assert batch.metrics["prompts_truncated"] == 2, setting  # the two long ones, not the two short


def test_the_limit_is_the_positions_or_the_vllm_engines_length_less_the_longest_completion():
    from scalerl.rollout.prompt_fit import prompt_limit

    assert prompt_limit(load_config(), 64) == 56
    assert prompt_limit(load_config(overrides=["eval.max_new_tokens=20"]), 64) == 44  # held-out prompts share the encoding
    assert prompt_limit(load_config(overrides=["rollout.engine=vllm", "rollout.vllm.max_model_len=40"]), 64) == 32
    assert prompt_limit(load_config(overrides=["rollout.vllm.max_model_len=40"]), 64) == 56  # the hf engine: no engine length
    assert prompt_limit(load_config(), None) is None  # a model that names no limit is not checked


def test_prompt_lengths_are_measured_in_batches_and_match_one_by_one():
    """`PromptFormat.lengths` tokenizes a dataset in batches of LENGTH_BATCH (one batch of a whole dataset stays in
    the process's resident memory); the lengths are those of encoding each prompt alone, across batch edges."""
    from scalerl.rollout import chat

    config = load_config()
    fmt = prompt_format(config.env.chat_template, config.env.system_prompt, load_tokenizer(config.model))
    tasks = [Task(prompt="1" * (i % 37) + "+2=", answer="") for i in range(2 * chat.LENGTH_BATCH + 5)]
    assert fmt.lengths(tasks) == [len(fmt.encode_whole(t)) for t in tasks]
