"""The attention implementation: what is loaded for what was asked, and what the run records it ran."""

from __future__ import annotations

import torch
import yaml

from scalerl.config import load_config
from scalerl.distributed.context import DistContext
from scalerl.models.loading import attention_choice, attention_used, load_model
from scalerl.trainer.setup import RESOLVED_FILE, check_run_dir, prepare_run_dir, what_ran

CPU = torch.device("cpu")


def test_flash_attention_falls_back_to_sdpa_on_cpu_and_the_loaded_model_says_so():
    assert attention_choice("sdpa", CPU) == ("sdpa", None) and attention_choice("eager", CPU) == ("eager", None)
    assert attention_choice("flash_attention_2", CPU) == ("sdpa", "flash_attention_2 needs a CUDA GPU; using sdpa on cpu")
    for requested, used in (("flash_attention_2", "sdpa"), ("eager", "eager")):
        model = load_model(load_config(overrides={"model.attn_implementation": requested}).model, CPU)
        assert attention_used(model, requested) == used


def test_the_run_records_the_attention_it_ran(tmp_path, caplog):
    """flash_attention_2 asked for on CPU: config.yaml keeps the request (a resume reads it), notes the
    fallback on its line; resolved.yaml records sdpa and why; the startup output says it."""
    config = load_config(overrides={"model.attn_implementation": "flash_attention_2", "log.run_dir": str(tmp_path), "log.name": "fa"})
    ctx = DistContext()
    ran = what_ran(config, ctx, load_model(config.model, ctx.device))
    run_dir = check_run_dir(config, resume=False)
    prepare_run_dir(config, ctx, run_dir, False, ran)
    resolved = yaml.safe_load((run_dir / RESOLVED_FILE).read_text())
    assert resolved == {"model": {"attn_implementation": "sdpa", "attn_implementation_requested": "flash_attention_2",
                                  "attn_implementation_fallback": "flash_attention_2 needs a CUDA GPU; using sdpa on cpu"},
                        "train": {"device": "cpu", "world_size": 1}, "rollout": {"decode": "static KV cache"}}
    text = (run_dir / "config.yaml").read_text()
    assert "  attn_implementation: flash_attention_2  # ran as sdpa: see resolved.yaml\n" in text
    assert load_config(run_dir / "config.yaml").model.attn_implementation == "flash_attention_2"  # still loads, as asked
    assert f"using sdpa on cpu; the run records it in {run_dir / RESOLVED_FILE}" in caplog.text
    assert check_run_dir(config, resume=False) == run_dir  # config.yaml and resolved.yaml alone are not a run
    # no fallback: resolved.yaml says sdpa ran as asked, nothing is printed or noted
    caplog.clear()
    plain = load_config(overrides={"log.run_dir": str(tmp_path), "log.name": "plain"})
    prepare_run_dir(plain, ctx, check_run_dir(plain, resume=False), False, what_ran(plain, ctx, load_model(plain.model, CPU)))
    assert yaml.safe_load((tmp_path / "plain" / RESOLVED_FILE).read_text())["model"] == {
        "attn_implementation": "sdpa", "attn_implementation_requested": "sdpa"}
    assert "# ran as" not in (tmp_path / "plain" / "config.yaml").read_text() and "records it" not in caplog.text
