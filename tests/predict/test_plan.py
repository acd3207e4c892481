"""`scalerl plan`: the step cost model fitted on synthetic pilots with known coefficients, its extrapolation to a
bigger model, more processes and longer completions, and the command's one-line errors (in-process)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from scalerl.cli.main import app
from scalerl.errors import ScaleRLError
from scalerl.jobs.plan import plan_from_pilots, plan_without_pilot, target_shape
from scalerl.predict.memory import ModelShape
from scalerl.predict.pilot import read_pilot
from scalerl.predict.step_cost import Shape, comm_bytes, fit_shape_cost

# the machine the synthetic pilots ran on: 0.05 s fixed rollout, generation at 20 GFLOP/s (compute-bound: 64 rows per
# decode step on a CPU), 0.2 ms per layer and decode step, 0.02 s fixed learning, training at 10 GFLOP/s plus 20 ns
# per position, hidden unit and layer, 0.01 s of logging per step, a collective bandwidth of 1 GB/s, 0.1 ns per KV cache
# byte read while decoding
TRUE = {"a_r": 0.05, "g_c": 1 / 20e9, "g_t": 2e-4, "a_l": 0.02, "f": 1 / 10e9, "e": 2e-8, "other": 0.01, "bw": 1e9, "g_kv": 1e-10}
PROMPT, COMPLETIONS = 12, 64


def _true_step(shape: Shape) -> tuple[float, float]:
    rollout = (TRUE["a_r"] + TRUE["g_c"] * 2 * shape.params * shape.sampled + TRUE["g_t"] * shape.decode_steps * shape.layers
               + TRUE["g_kv"] * shape.kv_read)
    learn = (TRUE["a_l"] + TRUE["f"] * 6 * shape.params * shape.trained + TRUE["e"] * shape.trained * shape.hidden * shape.layers
             + comm_bytes(shape) / TRUE["bw"])
    return rollout, learn


def _model(tmp_path, hidden, layers):
    folder = tmp_path / f"model_h{hidden}_l{layers}"
    folder.mkdir(exist_ok=True)
    cfg = {"vocab_size": 64, "hidden_size": hidden, "intermediate_size": 3 * hidden, "num_hidden_layers": layers,
           "num_attention_heads": 4}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder, ModelShape.from_hf_config(cfg)


def _pilot(tmp_path, name, hidden=64, layers=2, length=8, world=1, strategy="ddp", steps=12, noise=0.01, seed=0, eval_s=None,
           decode_clock=True):
    """A run folder as `scalerl train` writes it, its phase timings drawn from TRUE with `noise` relative scatter; with
    `decode_clock` the HF engine's record of a decode step's growth per cached position (rollout/hf.py: DecodeClock)."""
    model, model_shape = _model(tmp_path, hidden, layers)
    run = tmp_path / name
    run.mkdir()
    (run / "config.yaml").write_text(f"model:\n  path: {model}\nrollout:\n  prompts_per_step: 8\n  group_size: 8\n  max_new_tokens: {length}\n"
                                     f"parallel:\n  strategy: {strategy}\ntrain:\n  steps: {steps}\neval:\n  every: {5 if eval_s else 0}\n")
    (run / "resolved.yaml").write_text(f"train:\n  device: cpu\n  world_size: {world}\n")
    rng = np.random.default_rng(seed)
    shape = Shape(params=model_shape.params, weight_bytes=4, grad_bytes=4, completions=COMPLETIONS, decode_steps=length,
                  trained=COMPLETIONS * (PROMPT + length), world=world, strategy=strategy, hidden=hidden, layers=layers,
                  kv_bytes=2 * layers * hidden * 4)  # 4 heads of hidden/4, fp32
    rows, elapsed = [], 0.0
    for step in range(1, steps + 1):
        rollout, learn = (t * (1 + noise * rng.standard_normal()) for t in _true_step(shape))
        ev = eval_s if eval_s and step % 5 == 0 else None
        elapsed += rollout + learn + TRUE["other"] + (ev or 0.0)
        rows.append({"step": step, "step_time_s": rollout + learn, "time/rollout_s": rollout, "time/learn_s": learn,
                     "sampled_positions": COMPLETIONS * length * world, "trained_positions": COMPLETIONS * (PROMPT + length) * world,
                     "completions": COMPLETIONS * world, "time/elapsed_s": elapsed, **({"eval_time_s": ev} if ev else {}),
                     **({"time/decode_s_per_position": TRUE["g_kv"] * COMPLETIONS * shape.kv_bytes} if decode_clock else {})})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run, shape


def test_the_fit_recovers_known_coefficients(tmp_path):
    # two widths at two lengths, exact timings: the compute-bound generation, the per-layer decode overhead, the
    # training rate, its width term and both fixed parts are each told apart, and come back as they were put in
    runs = [_pilot(tmp_path, f"p{h}_{n}", hidden=h, length=n, noise=0.0) for h in (64, 128) for n in (8, 32)]
    pilots = [read_pilot(r) for r, _ in runs]
    assert len(pilots[0].shapes) == 10 and pilots[0].shapes[0].decode_steps == 8  # 12 steps less the 2 of warm-up
    cost = fit_shape_cost([s for p in pilots for s in p.shapes], np.concatenate([p.rollout_s for p in pilots]),
                          np.concatenate([p.learn_s for p in pilots]), np.concatenate([p.other_s for p in pilots]), compute_bound=True,
                          bandwidth=1e9, kv_s_per_byte=float(np.mean([k for p in pilots for k in p.kv_s_per_byte])))
    a_r, g_c, g_m, g_t, g_kv = cost.rollout
    a_l, f, e, per_byte = cost.learn
    assert abs(a_r / 0.05 - 1) < 1e-6 and abs(g_c * 20e9 - 1) < 1e-6 and g_m == 0 and abs(g_t / 2e-4 - 1) < 1e-6
    assert g_kv == pytest.approx(TRUE["g_kv"], rel=1e-9)
    assert abs(a_l / 0.02 - 1) < 1e-6 and abs(f * 10e9 - 1) < 1e-6 and abs(e / 2e-8 - 1) < 1e-6 and per_byte == 1e-9
    assert abs(cost.other_s - 0.01) < 1e-9
    assert cost.achieved_flops == pytest.approx(10e9)
    assert cost.left_out == ("generation memory (weight bytes × decode steps)",)  # the rows never vary: it cannot be told from compute


@pytest.mark.parametrize("clock", [True, False])
def test_one_pilot_at_8_tokens_prices_64_with_the_kv_cache_it_measured(tmp_path, clock, monkeypatch):
    """The decode's KV cache reads grow with the square of the length: one pilot at 8 new tokens can price 64 only
    with the growth the HF engine measured (`time/decode_s_per_position`); without the record the same pilot prices
    every decoded position alike, and under-predicts. (No fixed parts here: one pilot cannot tell them apart.)"""
    monkeypatch.setitem(TRUE, "a_r", 0.0)
    monkeypatch.setitem(TRUE, "a_l", 0.0)
    monkeypatch.setitem(TRUE, "g_kv", 1e-9)  # 1 GB/s: the KV cache about a third of the step at 64 tokens
    run, _ = _pilot(tmp_path, "short", length=8, noise=0.0, decode_clock=clock)
    _, model = _model(tmp_path, 64, 2)
    out = plan_from_pilots([run], model=model, model_name="same", gpus=1, steps=10, completion_length=64, probe=False)
    truth = sum(_true_step(Shape(params=model.params, weight_bytes=4, grad_bytes=4, completions=COMPLETIONS, decode_steps=64,
                                 trained=COMPLETIONS * (PROMPT + 64), hidden=64, layers=2, kv_bytes=2 * 2 * 64 * 4))) + TRUE["other"]
    if clock:
        assert out["step_s"] == pytest.approx(truth, rel=1e-6)
        assert out["parts"]["generation KV cache (bytes read)"] > 0
    else:
        assert out["step_s"] < 0.93 * truth and out["parts"]["generation KV cache (bytes read)"] == 0


def test_a_single_pilot_prices_its_work_proportionally_as_the_time_estimate_does(tmp_path):
    run, shape = _pilot(tmp_path, "one", noise=0.0)
    p = read_pilot(run)
    cost = fit_shape_cost(p.shapes, np.array(p.rollout_s), np.array(p.learn_s), np.array(p.other_s), compute_bound=True, bandwidth=1e9)
    rollout, learn = _true_step(shape)
    at = cost.at(shape)  # the within-run StepCost at the pilot's own shape reproduces the pilot's step
    assert at.rollout.fixed == 0 and at.learn.fixed == 0
    assert at.seconds(shape.sampled, shape.trained) == pytest.approx(rollout + learn + 0.01, rel=1e-9)


def test_extrapolates_to_a_bigger_model_more_processes_and_longer_completions(tmp_path):
    small = [_pilot(tmp_path, f"s{h}", hidden=h, layers=n, noise=0.002, seed=h) for h, n in ((64, 2), (128, 2))]
    long_ = _pilot(tmp_path, "long", hidden=64, layers=2, length=32, noise=0.002, seed=7)[0]
    _, big = _model(tmp_path, 256, 8)  # 16x the parameters of the larger pilot
    assert 15 < big.params / small[1][1].params < 17
    out = plan_from_pilots([small[0][0], small[1][0], long_], model=big, model_name="big", gpus=1, steps=100, completion_length=64, probe=False)
    truth_shape = Shape(params=big.params, weight_bytes=4, grad_bytes=4, completions=COMPLETIONS, decode_steps=64,
                        trained=COMPLETIONS * (PROMPT + 64), hidden=256, layers=8)
    truth = sum(_true_step(truth_shape)) + TRUE["other"]
    assert abs(out["step_s"] / truth - 1) < 0.03
    # each term at the target's own width and depth: 20 ns × T × 256 × 8 of width work, 0.2 ms × 64 × 8 per layer and decode step
    assert out["parts"]["training width (T·h·layers)"] == pytest.approx(2e-8 * COMPLETIONS * (PROMPT + 64) * 256 * 8, rel=0.2)
    assert out["parts"]["generation per layer and decode step"] == pytest.approx(2e-4 * 64 * 8, rel=0.2)
    lo, hi = out["band"]["step_s"]
    assert lo < out["step_s"] < hi and out["band"]["hours"][0] < out["hours"] < out["band"]["hours"][1]
    assert out["hours"] == pytest.approx(100 * out["step_s"] / 3600) and out["gpu_hours"] == out["hours"]
    assert out["cost"] == pytest.approx(2.0 * out["gpu_hours"]) and out["dominant"] == "training compute (6·P·T FLOPs)"
    # more processes: a pilot at 1 and one at 2 processes (DDP) measure the bandwidth; 4 processes under FSDP2 send
    # 3/4 · (2 · weights + gradients) per update instead of DDP's 2 · 1/2 · gradients
    one = _pilot(tmp_path, "w1", hidden=128, noise=0.0)[0]
    two, two_shape = _pilot(tmp_path, "w2", hidden=128, world=2, noise=0.0)
    same = ModelShape.from_hf_config(json.loads((tmp_path / "model_h128_l2" / "config.json").read_text()))
    four = plan_from_pilots([one, two], model=same, model_name="same", gpus=4, strategy="fsdp2", probe=False)
    target = Shape(**{**two_shape.__dict__, "world": 4, "strategy": "fsdp2"})
    assert four["step_s"] == pytest.approx(sum(_true_step(target)) + TRUE["other"], rel=1e-6)
    p = two_shape.params
    assert comm_bytes(two_shape) == pytest.approx(2 * 0.5 * 4 * p) and comm_bytes(target) == pytest.approx(0.75 * (2 * 4 * p + 4 * p))
    assert four["parts"]["communication"] == pytest.approx(0.75 * 12 * p / 1e9, rel=1e-6)
    given = plan_from_pilots([one], model=same, model_name="same", gpus=2, bandwidth_gbs=1.0, probe=False)  # one process: bandwidth given
    assert given["step_s"] == pytest.approx(sum(_true_step(two_shape)) + TRUE["other"], rel=1e-6)


def test_evaluations_and_the_no_pilot_rule(tmp_path):
    run = _pilot(tmp_path, "ev", noise=0.0, steps=20, eval_s=0.5)[0]
    out = plan_from_pilots([run], model=_model(tmp_path, 64, 2)[1], model_name="same", gpus=1, steps=100, probe=False)
    # evaluations at step 0, every 5 steps and the end: 1 + 20; their time from the pilot's, same shape
    assert out["evals"] == 21 and out["eval_s"] == pytest.approx(0.5)
    assert out["total_s"] == pytest.approx(100 * out["step_s"] + 21 * 0.5)
    shape, name = target_shape("7b", None)
    params = shape.params
    bare = plan_without_pilot(model=shape, model_name=name, gpus=8, steps=10, completion_length=100, prompt_len=100)
    # 6·P·T + 2·P·S per GPU at 989 TFLOP/s × 0.85, the default job's completions per GPU
    from scalerl.config import load_config

    n = load_config().batch_size
    flops = 6 * params * n * 200 + 2 * params * n * 100
    assert bare["band"] is None and "efficiency factor 0.85" in bare["source"]
    assert bare["step_s"] == pytest.approx(flops / (989e12 * 0.85)) and bare["gpu_hours"] == pytest.approx(8 * bare["hours"])


def _cli(*args):
    return CliRunner().invoke(app, ["plan", "--no-probe", *map(str, args)])


def test_cli_prints_the_plan_and_one_line_errors(tmp_path):
    run, shape = _pilot(tmp_path, "cli", noise=0.01)
    ok = _cli(run, "--model", tmp_path / "model_h64_l2", "--gpus", 1, "--steps", 50)
    assert ok.exit_code == 0, ok.output
    assert "step time:" in ok.output and "(band" in ok.output and "GPU-hours:" in ok.output and "dominant term:" in ok.output
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.yaml").write_text((run / "config.yaml").read_text())
    (tmp_path / "bare" / "metrics.jsonl").write_text(json.dumps({"step": 1, "step_time_s": 1.0, "tokens": 5}) + "\n")
    short = tmp_path / "short.json"  # a target of 16 positions: 12 prompt tokens leave 4 new ones
    short.write_text(json.dumps({**json.loads((tmp_path / "model_h64_l2" / "config.json").read_text()), "max_position_embeddings": 16}))
    for args, said in (((tmp_path / "missing", "--model-size", "7b"), "no such run folder"),
                       ((tmp_path / "bare", "--model-size", "7b"), "no phase records"),
                       ((run, "--model-size", "5b"), "--model-size"),
                       ((run, "--model-size", "7b", "--strategy", "zero"), "--strategy"),
                       ((run, "--model-size", "7b", "--gpus", 2), "--bandwidth-gbs"),
                       ((run,), "exactly one of --model-size"),
                       ((run, "--model", short, "--completion-length", 20), "has 16 positions for the prompt (12 tokens in the pilots)")):
        bad = _cli(*args)
        assert bad.exit_code == 2 and said in bad.output and bad.output.strip().count("\n") == 0, (args, bad.output)
    with pytest.raises(ScaleRLError, match="--gpus 3 --nodes 2"):
        plan_from_pilots([run], model=_model(tmp_path, 64, 2)[1], model_name="x", gpus=3, nodes=2, probe=False)


def test_a_pilot_is_priced_in_the_precision_it_ran(tmp_path):
    """config.yaml keeps precision.mode=auto; resolved.yaml says what auto chose, and the pilot's bytes follow it."""
    from scalerl.predict.pilot import read_pilot

    run = _pilot(tmp_path, "auto")[0]
    assert (read_pilot(run).shapes[0].weight_bytes, read_pilot(run).shapes[0].grad_bytes) == (4.0, 4.0)  # nothing recorded: fp32
    with (run / "resolved.yaml").open("a") as f:
        f.write("precision:\n  mode: standard\n  why: bf16 matmuls faster here\n")
    assert (read_pilot(run).shapes[0].weight_bytes, read_pilot(run).shapes[0].grad_bytes) == (2.0, 4.0)


def test_a_probed_plan_is_the_target_probe_plus_the_pilots_loop(tmp_path, monkeypatch):
    """With a probe (scalerl/jobs/probe.py) the step is the target's probed rollout and update plus what the pilots
    spend outside their own probes; the probe gets the target's model, length and processes."""
    import scalerl.jobs.probe as probe_module
    from scalerl.jobs.probe import ProbeResult

    run, shape = _pilot(tmp_path, "probed", noise=0.0)
    seen = []

    def probe_alternated(specs, *, repeats=3, rounds=2):
        seen.append(specs)
        return [ProbeResult((0.01, 0.01), (0.02, 0.02)), ProbeResult((0.5, 0.7, 0.6), (1.0, 1.2, 1.1))]

    monkeypatch.setattr(probe_module, "probe_alternated", probe_alternated)
    folder, big = _model(tmp_path, 128, 4)
    out = plan_from_pilots([run], model=big, model_name="big", gpus=1, completion_length=32, model_config=json.loads((folder / "config.json").read_text()))
    rollout, learn = _true_step(shape)
    assert out["probed"] and out["step_s"] == pytest.approx(0.6 + 1.1 + (rollout - 0.01) + (learn - 0.02) + TRUE["other"])
    pilot_spec, target_spec = seen[0]
    printed = CliRunner().invoke(app, ["plan", str(run), "--model", str(folder), "--completion-length", "32", "--probe-rounds", "1"])
    assert printed.exit_code == 0 and f"step time: {out['step_s']:.4g} s" in printed.output and "probed on this machine" in printed.output
    assert "--probe-rounds: 0" in CliRunner().invoke(app, ["plan", str(run), "--model", str(folder), "--probe-rounds", "0"]).output
    assert (pilot_spec.new_tokens, pilot_spec.prompt_len, pilot_spec.model["hidden_size"]) == (8, PROMPT, 64)
    assert "\n  device: cpu\n" in target_spec.config  # the pilots' device (resolved.yaml), not train.device's auto
    assert (target_spec.new_tokens, target_spec.prompt_len, target_spec.model["hidden_size"], target_spec.world) == (32, PROMPT, 128, 1)
    # more processes than this machine has devices: the probe runs one and the bytes are priced at the given bandwidth
    many = plan_from_pilots([run], model=big, model_name="big", gpus=64, strategy="fsdp2", bandwidth_gbs=2.0)
    assert seen[-1][1].world == 1 and "fsdp2" in seen[-1][1].config
    target = Shape(**{**shape.__dict__, "params": big.params, "world": 64, "strategy": "fsdp2", "hidden": 128, "layers": 4})
    assert many["parts"]["communication"] == pytest.approx(comm_bytes(target) / 2e9)


def test_a_target_this_machine_cannot_hold_is_priced_by_the_fit(tmp_path):
    run = _pilot(tmp_path, "huge", noise=0.0)[0]
    shape, name = target_shape("70b", None)
    out = plan_from_pilots([run], model=shape, model_name=name, gpus=1)
    assert not out["probed"] and "no probe (the target's weights, gradients and moments" in out["notes"][0]
    assert out == plan_from_pilots([run], model=shape, model_name=name, gpus=1, probe=False) | {"notes": out["notes"], "probed": False}


def test_at_the_pilots_own_shape_a_probed_plan_is_the_pilots_measured_step(tmp_path, monkeypatch):
    """Even when the probe ran slower than the pilot (the machine's drift between them): the loop term is signed."""
    import scalerl.jobs.probe as probe_module
    from scalerl.jobs.probe import ProbeResult

    run, shape = _pilot(tmp_path, "same", noise=0.0)
    monkeypatch.setattr(probe_module, "probe_alternated", lambda specs, **_: [ProbeResult((1.0,), (2.0,))] * len(specs))
    out = plan_from_pilots([run], model=_model(tmp_path, 64, 2)[1], model_name="same", gpus=1)
    assert out["probed"] and out["step_s"] == pytest.approx(sum(_true_step(shape)) + TRUE["other"])



@pytest.mark.parametrize("section, setting, said", [("rollout", "engine: vllm", "a pilot sampled with vLLM"),
                                                    ("rollout", "mode: async\n  max_staleness: 0", "rollout.mode=async"),
                                                    ("algorithm", "name: ppo", "a separate critic model")])
def test_a_pilot_the_probe_cannot_copy_is_priced_by_the_fit(tmp_path, section, setting, said):
    run = _pilot(tmp_path, "other", noise=0.0)[0]
    (run / "config.yaml").write_text((run / "config.yaml").read_text() + f"{section}:\n  {setting}\n" if section == "algorithm" else
                                     (run / "config.yaml").read_text().replace("rollout:\n", f"rollout:\n  {setting}\n"))
    out = plan_from_pilots([run], model=_model(tmp_path, 64, 2)[1], model_name="same", gpus=1)
    assert not out["probed"] and said in out["notes"][0]


def test_the_target_line_writes_parameters_as_people_do():
    from scalerl.cli.plan import _millions

    assert [_millions(p) for p in (1.06e6, 27.3e6, 6.738e9, 13.016e9, 68.98e9)] == ["1.06", "27.3", "6,738", "13,016", "68,980"]
