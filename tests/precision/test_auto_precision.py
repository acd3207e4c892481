"""precision.mode=auto (scalerl/precision/probe.py, scalerl/trainer/setup.py: resolve_precision): bf16 compute where
the probe says this device runs it faster, fp32 where not, with the probe's result injected both ways; the choice
and why on the start line; an explicit bf16 mode slower than fp32 here warned about; the probe cached per machine."""

from __future__ import annotations

import subprocess

import pytest
import torch
import yaml

from conftest import tiny_overrides
from scalerl.config import load_config
from scalerl.config.load import dump_config, with_overrides
from scalerl.errors import ScaleRLError
from scalerl.distributed.context import DistContext
from scalerl.precision import probe
from scalerl.precision.probe import Rates, choose_mode, slower_warning
from scalerl.trainer import setup

CPU = torch.device("cpu")
SLOW_BF16 = Rates(fp32=180.0, bf16=90.0, shape=(512, 128, 512))  # a Xeon with AVX-512 BF16 and no AMX (issue 38): half of fp32
FAST_BF16 = Rates(fp32=100.0, bf16=430.0, shape=(512, 128, 512))  # an EPYC at 2048²: 4.3x


def test_choice_by_rates_on_cpu_and_by_capability_on_gpu():
    assert choose_mode(CPU, SLOW_BF16)[0] == "fp32" and "bf16 90.0 vs fp32 180.0 GFLOP/s" in choose_mode(CPU, SLOW_BF16)[1]
    assert choose_mode(CPU, FAST_BF16) == ("standard", "bf16 matmuls 4.30x faster here (bf16 430.0 vs fp32 100.0 GFLOP/s on a "
                                                       "512x128x512 matmul)")
    assert choose_mode(CPU, Rates(fp32=100.0, bf16=105.0, shape=(1, 1, 1)))[0] == "fp32"  # within the probe's noise: fp32
    assert choose_mode(CPU, Rates(fp32=100.0, bf16=110.0, shape=(1, 1, 1)))[0] == "standard"  # 1.1x is enough, as for the step
    assert choose_mode(CPU, Rates(fp32=100.0, bf16=105.0, shape=(1, 1, 1)))[1].startswith("bf16 matmuls only 1.05x fp32's here")
    assert choose_mode(torch.device("cuda"), None, (9, 0))[0] == "standard" and choose_mode(torch.device("cuda"), None, (7, 0))[0] == "fp32"
    assert slower_warning("standard", SLOW_BF16) == (
        "warning: precision.mode=standard computes in bf16, and bf16 matmuls run slower than fp32 on this machine (bf16 90.0 vs "
        "fp32 180.0 GFLOP/s on a 512x128x512 matmul); precision.mode=auto or fp32 would be faster")
    assert slower_warning("standard", FAST_BF16) is None and slower_warning("fp32", SLOW_BF16) is None


@pytest.mark.parametrize("rates, mode, autocast", [(SLOW_BF16, "fp32", None), (FAST_BF16, "standard", "bfloat16")])
def test_auto_resolves_by_the_probe(monkeypatch, tmp_path, rates, mode, autocast):
    monkeypatch.setattr(setup, "cpu_rates", lambda shape, **_: rates)
    asked = load_config(overrides={"log.run_dir": str(tmp_path)})
    assert asked.precision.mode == "auto"  # the default
    config, why, warning = setup.resolve_precision(asked, DistContext())
    assert config.precision.mode == mode and config.precision_policy.mode == mode and config.precision_policy.autocast_dtype == autocast
    assert why == f"precision.mode=auto: {choose_mode(CPU, rates)[1]}" and warning is None
    assert asked.precision.mode == "auto" and config.plan == asked.plan  # the asked config untouched, the rest derived the same
    explicit, why, warning = setup.resolve_precision(load_config(overrides={"precision.mode": "standard"}), DistContext())
    assert explicit.precision.mode == "standard" and why is None and (warning is not None) == (rates is SLOW_BF16)


def test_the_start_line_says_what_auto_chose(monkeypatch, runs):
    """A job on the default config, the probe saying bf16 is 4.3x faster: the learner computes under bf16 autocast,
    the precision start line says why, config.yaml keeps auto and resolved.yaml records the choice."""
    from scalerl.trainer import loop

    monkeypatch.setattr(setup, "cpu_rates", lambda shape, **_: FAST_BF16)
    _, learner, run_dir = loop.build_roles(load_config(overrides=tiny_overrides(runs, "auto")), DistContext(), resume=False)
    assert learner.precision.mode == "standard" and learner.precision.autocast_dtype == "bfloat16"
    line = learner.start(fresh=False)[0]
    assert line.startswith("precision standard: compute bf16 autocast") and line.endswith(
        "; precision.mode=auto: bf16 matmuls 4.30x faster here (bf16 430.0 vs fp32 100.0 GFLOP/s on a 512x128x512 matmul)")
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["precision"]["mode"] == "auto"
    assert yaml.safe_load((run_dir / setup.RESOLVED_FILE).read_text())["precision"]["mode"] == "standard"


def test_the_probe_is_cached_per_machine(monkeypatch, tmp_path):
    monkeypatch.delenv("SCALERL_PRECISION_RATES")  # the suite's pinned rates (tests/conftest.py)
    monkeypatch.setenv("SCALERL_CACHE_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(probe, "measure", lambda shape: calls.append(shape) or Rates(fp32=2.0, bf16=1.0, shape=shape))
    first, again, other = probe.cpu_rates((512, 64, 256)), probe.cpu_rates((512, 64, 256)), probe.cpu_rates((512, 128, 512))
    assert calls == [(512, 64, 256), (512, 128, 512)]  # the second call of a shape reads the cache
    assert not first.cached and again == Rates(fp32=2.0, bf16=1.0, shape=(512, 64, 256), cached=True) and not other.cached
    assert (tmp_path / "precision_probe.json").is_file()
    monkeypatch.setenv("SCALERL_PRECISION_RATES", "fp32:180,bf16:90")  # given, not measured
    given = probe.cpu_rates((1, 2, 3))
    assert given == Rates(fp32=180.0, bf16=90.0, shape=(1, 2, 3), given="SCALERL_PRECISION_RATES") and len(calls) == 2
    assert given.text().endswith("matmul (given by SCALERL_PRECISION_RATES)")
    for bad in ("fp32:0,bf16:90", "fp32:-5,bf16:90", "fp32:180,bf16:nan", "fp32:180"):  # one line each, no traceback
        monkeypatch.setenv("SCALERL_PRECISION_RATES", bad)
        with pytest.raises(ScaleRLError, match="SCALERL_PRECISION_RATES="):
            probe.cpu_rates((1, 2, 3))


def test_where_the_matmul_favours_bf16_the_runs_step_decides():
    """The reference benchmark's model on this project's EPYC: the matmul reads 1.36x, the whole step is slower in bf16."""
    matmul = Rates(fp32=150.0, bf16=204.0, shape=(512, 128, 512))
    slower = probe.StepTimes(fp32=0.050, bf16=0.053)
    assert choose_mode(CPU, matmul, step=slower) == (
        "fp32", "bf16 matmuls 1.36x faster but this run's step only 0.94x (fp32 50.0 vs bf16 53.0 ms per probed step of this run's "
                "shape; bf16 needs 1.1x)")
    assert choose_mode(CPU, matmul, step=probe.StepTimes(fp32=2.0, bf16=1.0))[0] == "standard"
    assert choose_mode(CPU, SLOW_BF16, step=probe.StepTimes(fp32=2.0, bf16=1.0))[0] == "fp32"  # the matmul already says no


def test_an_explicit_bf16_mode_is_warned_about_by_the_runs_step_where_a_probe_of_it_is_at_hand(monkeypatch, tmp_path):
    """The matmul 4.3x faster in bf16 but this run's step slower in bf16 (given here; cached by an earlier `auto` start
    in a user's case): an explicit `standard` starts with a warning giving both step times; with no step probe at hand
    none is measured for an explicit mode, and there is no warning."""
    monkeypatch.setattr(setup, "cpu_rates", lambda shape, **_: FAST_BF16)
    monkeypatch.setenv("SCALERL_PRECISION_STEP", "fp32:0.050,bf16:0.055")
    config, why, warning = setup.resolve_precision(load_config(overrides={"precision.mode": "standard"}), DistContext())
    assert config.precision.mode == "standard" and why is None
    assert warning == ("warning: precision.mode=standard computes in bf16, and bf16 matmuls are 4.30x faster here but this run's "
                       "step is slower in bf16 (0.91x: fp32 50.0 vs bf16 55.0 ms per probed step of this run's shape (given by "
                       "SCALERL_PRECISION_STEP)); precision.mode=auto or fp32 would be faster")
    monkeypatch.setenv("SCALERL_PRECISION_STEP", "fp32:0.050,bf16:0.045")  # faster in bf16: nothing to warn about
    assert setup.resolve_precision(load_config(overrides={"precision.mode": "compressed"}), DistContext())[2] is None
    monkeypatch.delenv("SCALERL_PRECISION_STEP")
    monkeypatch.delenv("SCALERL_PRECISION_RATES")  # the suite's pinned rates would stand in for the step (tests/conftest.py)
    monkeypatch.setenv("SCALERL_CACHE_DIR", str(tmp_path))  # an empty cache: no step probe at hand
    monkeypatch.setattr(probe, "measure", lambda shape: pytest.fail("cpu_rates is given here"))
    assert setup.resolve_precision(load_config(overrides={"precision.mode": "standard"}), DistContext())[2] is None
    key = setup.precision_step_probe(load_config(), setup.model_config(load_config()), CPU, FAST_BF16.fp32)[0]
    assert probe.cpu_step_times(key, lambda: (0.050, 0.060)).bf16 == 0.060  # what an `auto` start measures and caches
    warning = setup.resolve_precision(load_config(overrides={"precision.mode": "standard"}), DistContext())[2]
    assert "this run's step is slower in bf16 (0.83x: fp32 50.0 vs bf16 60.0 ms per probed step of this run's shape (cached))" in warning


def test_auto_says_it_is_measuring_once_before_it_measures_and_nothing_when_cached(monkeypatch, tmp_path, capsys):
    """A machine's first run of a shape waits seconds on the probe: one line says so first; a later start reads the
    cache and says nothing; an explicit mode measures nothing it would announce."""
    monkeypatch.delenv("SCALERL_PRECISION_RATES")  # the suite's pinned rates (tests/conftest.py)
    monkeypatch.setenv("SCALERL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(probe, "measure", lambda shape: FAST_BF16)
    monkeypatch.setattr(setup, "precision_step_probe", lambda *a: ("step shape", lambda: (0.050, 0.055)))
    config = load_config(overrides={"log.run_dir": str(tmp_path)})
    assert setup.resolve_precision(config, DistContext())[0].precision.mode == "fp32"  # matmul then step measured
    line = ("precision.mode=auto: timing bf16 against fp32 on this machine (matmuls, then this run's step where bf16's "
            f"matmuls are faster: seconds, once; cached in {tmp_path / 'precision_probe.json'})\n")
    assert capsys.readouterr().err == line  # once for both measurements
    assert setup.resolve_precision(config, DistContext())[0].precision.mode == "fp32" and capsys.readouterr().err == ""
    monkeypatch.setenv("SCALERL_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.setattr(probe, "measure", lambda shape: SLOW_BF16)
    setup.resolve_precision(load_config(overrides={"precision.mode": "standard"}), DistContext())
    assert capsys.readouterr().err == ""


def test_auto_resolves_by_the_step_probe_injected(monkeypatch, tmp_path):
    """SCALERL_PRECISION_STEP gives the step's seconds: with the matmul 4.3x faster in bf16 and the step 10 % slower,
    auto runs fp32 and says why; several processes take the matmul's word (nothing probed)."""
    monkeypatch.setattr(setup, "cpu_rates", lambda shape, **_: FAST_BF16)
    monkeypatch.setenv("SCALERL_PRECISION_STEP", "fp32:0.050,bf16:0.055")
    config, why, _ = setup.resolve_precision(load_config(overrides={"log.run_dir": str(tmp_path)}), DistContext())
    assert config.precision.mode == "fp32" and why.startswith("precision.mode=auto: bf16 matmuls 4.30x faster but this run's step only 0.91x")
    monkeypatch.setenv("SCALERL_PRECISION_STEP", "fp32:0.050,bf16:0.025")
    assert setup.resolve_precision(load_config(), DistContext())[0].precision.mode == "standard"
    # a matmul exactly 1.1x faster is enough to probe the step (the same rule as choose_mode's), and the step decides
    monkeypatch.setattr(setup, "cpu_rates", lambda shape, **_: Rates(fp32=100.0, bf16=110.0, shape=(1, 1, 1)))
    monkeypatch.setenv("SCALERL_PRECISION_STEP", "fp32:0.050,bf16:0.055")
    assert setup.resolve_precision(load_config(), DistContext())[0].precision.mode == "fp32"
    monkeypatch.setattr(setup, "cpu_rates", lambda shape, **_: FAST_BF16)
    monkeypatch.setattr(setup, "precision_step_probe", lambda *a: pytest.fail("several processes must not probe the step"))
    monkeypatch.setattr(DistContext, "gather_lists", lambda self, items: items)
    assert setup.resolve_precision(load_config(), DistContext(world_size=2))[0].precision.mode == "standard"


def test_the_step_probe_times_the_runs_step_in_both_precisions_and_is_cached(monkeypatch, tmp_path):
    """The real step probe on the built-in model: the run's rows, 2 layers, fp32 and bf16 autocast in turn (the
    learner's precision as built), in a child process (its memory and random draws stay out of the run's), a time for
    each, cached per machine and shape (not per model folder)."""
    from scalerl.trainer import step_probe

    monkeypatch.delenv("SCALERL_PRECISION_RATES")
    monkeypatch.setenv("SCALERL_CACHE_DIR", str(tmp_path))
    config = load_config(overrides={"rollout.prompts_per_step": 2, "rollout.group_size": 2, "rollout.max_new_tokens": 4, "train.threads": 1})
    model = setup.model_config(config)
    shape, measure = step_probe.precision_step_probe(config, model, CPU, 150.0)
    assert "rows 2x2" in shape and "new 4" in shape and "_name_or_path" not in shape
    rng = torch.random.get_rng_state()
    first = probe.cpu_step_times(shape, measure)
    assert torch.equal(torch.random.get_rng_state(), rng)  # the run's random stream untouched
    assert not first.cached and first.fp32 > 0 and first.bf16 > 0
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("a cached shape must not be probed again"))
    moved = {**model, "_name_or_path": "/elsewhere", "transformers_version": "9.9"}
    assert probe.cpu_step_times(*step_probe.precision_step_probe(config, moved, CPU, 150.0)) == probe.StepTimes(first.fp32, first.bf16, cached=True)
    # 4 rows x 20 positions of 2 layers at hidden 1024 (~16 GFLOP) take 1.6 s of matmuls at 10 GFLOP/s: FLOP-bound, not probed
    big = {**model, "hidden_size": 1024, "intermediate_size": 4096}
    assert probe.cpu_step_times(*step_probe.precision_step_probe(config, big, CPU, 10.0)) is None


def test_the_step_probe_runs_each_precision_in_turn(monkeypatch):
    from scalerl.trainer import step_probe

    seen = []
    real = step_probe.run_probe

    def spy(spec, repeats, ctx):
        seen.append((yaml.safe_load(spec.config)["precision"]["mode"], spec.model["num_hidden_layers"], spec.new_tokens, repeats))
        return real(spec, repeats, ctx)

    monkeypatch.setattr(step_probe, "run_probe", spy)
    config = load_config(overrides={"rollout.prompts_per_step": 2, "rollout.group_size": 2, "rollout.max_new_tokens": 4, "train.threads": 1})
    model = {**setup.model_config(config), "num_hidden_layers": 2}
    specs = {mode: step_probe.ProbeSpec(config=dump_config(with_overrides(config, {"precision.mode": mode})), model=model, prompt_len=16,
                                        new_tokens=4) for mode in ("fp32", "standard")}
    best = step_probe.time_modes(specs, learn_only=False, device=CPU)
    assert seen == [("fp32", 2, 4, 2), ("standard", 2, 4, 2)] * 2 and set(best) == {"fp32", "standard"}
    assert all(0 < t < float("inf") for t in best.values())
