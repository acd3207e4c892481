"""`--resume` needs only the checkpoints: each checkpoint carries the config it was saved with (covered by its
manifest), so a run folder whose config.yaml was lost still resumes, with or without `--config FILE` (accepted
when the file agrees with the saved config); and the source documents' `reward_components` spelling is accepted
on --resume as on a new run."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import tiny_overrides
from scalerl.config import load_config
from scalerl.config.resume import resume_config
from scalerl.errors import ScaleRLError
from scalerl.jsonl import read_metrics
from scalerl.trainer import checkpoint as ckpt
from scalerl.trainer import loop

COMPONENTS = [{"name": "exact", "env": True}, {"name": "zero", "function": "zero_reward:zero", "weight": 0.5}]


def _where(runs) -> list[str]:
    return [f"log.run_dir={runs}", "log.name=run", "log.console=none"]


def test_a_run_whose_config_yaml_was_lost_resumes_from_its_checkpoint(runs, tmp_path, fault):
    over = tiny_overrides(runs, "run", **{"train.steps": 2, "checkpoint.every": 2, "eval.every": 0, "rollout.max_new_tokens": 6})
    loop.train(load_config(overrides=over))
    saved = (runs / "run" / "config.yaml").read_text()
    newest = ckpt.latest_checkpoint(runs / "run" / "checkpoints")
    assert (newest / "config.yaml").read_text() == saved and ckpt.verify_checkpoint(newest) is None  # in the manifest
    (runs / "run" / "config.yaml").unlink()

    config = resume_config(None, [*_where(runs), "train.steps=4"])
    assert (config.rollout.max_new_tokens, config.train.steps) == (6, 4)  # the run's config, not the defaults
    file = tmp_path / "run.yaml"
    file.write_text(yaml.safe_dump({"rollout": {"max_new_tokens": 6, "prompts_per_step": 4, "group_size": 4}}))
    assert resume_config(file, [*_where(runs), "train.steps=4"]) == config  # --config FILE --resume: the same run
    loop.train(config, resume=True)
    assert [r["step"] for r in read_metrics(runs / "run")] == [1, 2, 3, 4]
    assert "max_new_tokens: 6" in (runs / "run" / "config.yaml").read_text()  # the record is back

    (runs / "run" / "config.yaml").unlink()  # a checkpoint whose config was tampered with is not used
    for folder in ckpt.complete_checkpoints(runs / "run" / "checkpoints"):
        (folder / "config.yaml").write_text((folder / "config.yaml").read_text().replace("max_new_tokens: 6", "max_new_tokens: 7"))
    with pytest.raises(ScaleRLError, match="holds no run to resume"):
        resume_config(None, _where(runs))
    fault("resume", "--resume after the run folder's config.yaml was deleted (and with --config FILE of the same run)",
          "resumed from the config saved in the newest checkpoint (manifest-checked): max_new_tokens 6 kept, steps 3-4 "
          "trained, config.yaml written again; a tampered checkpoint config is not used")


def test_resume_accepts_the_reward_components_spelling(runs, tmp_path, fault):
    file = tmp_path / "run.yaml"
    file.write_text(yaml.safe_dump({"reward_components": COMPONENTS}))
    over = tiny_overrides(runs, "run", **{"train.steps": 2, "checkpoint.every": 2, "eval.every": 0})
    loop.train(load_config(file, [f"{k}={v}" for k, v in over.items()]))
    config = resume_config(file, [*_where(runs), "train.steps=3", f"reward_components={json.dumps(COMPONENTS)}"])
    assert [c.name for c in config.reward.components] == ["exact", "zero"] and config.train.steps == 3
    with pytest.raises(ScaleRLError, match="reward_components and reward.components are the same setting"):
        resume_config(None, [*_where(runs), f"reward_components={json.dumps(COMPONENTS)}",
                             f"reward.components={json.dumps(COMPONENTS)}"])
    loop.train(config, resume=True)
    assert [r["step"] for r in read_metrics(runs / "run")] == [1, 2, 3]
    fault("resume", "--resume --set reward_components=[...] of a run whose YAML said reward_components:",
          "accepted as reward.components (no change, resumed to step 3); both spellings at once refused in one line")
