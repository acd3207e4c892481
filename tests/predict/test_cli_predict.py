"""`scalerl predict` and `scalerl estimate` through the real CLI: output and one-line errors."""

import json

import numpy as np

from scalerl.predict.reward_curve import sigmoid_curve
from tests.conftest import run_cli


def _run(path, every):
    path.mkdir(parents=True)
    rows = [{"step": s, "tokens": 50, "step_time_s": 0.25,
             **({"eval/pass_rate": float(sigmoid_curve(np.array([float(s)]), r0=0.3, a=0.8, b=2.0, c_mid=30.0)[0])}
                if s % every == 0 else {})} for s in range(0, 101)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_predict_prints_fit_band_and_cost_to_target(tmp_path):
    _run(tmp_path / "r", 10)
    out = run_cli("-m", "scalerl.cli.main", "predict", str(tmp_path / "r"), "--target-compute", "100", "--target-pass-rate", "0.7",
                  "--gpus", "8", "--price-per-gpu-hour", "2")
    assert out.returncode == 0, out.stderr
    assert "A 0.800" in out.stdout and "at steps = 100: 0.759" in out.stdout and "95 % band" in out.stdout
    # R = 0.7 at step 60; 0.25 s per step measured -> 60 × 0.25 / 3600 h × 8 GPUs; cost = 2 × GPU-hours / 1
    assert "reached at steps = 60" in out.stdout and "to reach it: 60 steps" in out.stdout
    assert f"{60 * 0.25 / 3600 * 8:.3g} GPU-hours" in out.stdout and f"{2 * 60 * 0.25 / 3600 * 8:.4g} at 2 per GPU-hour" in out.stdout
    js = run_cli("-m", "scalerl.cli.main", "predict", str(tmp_path / "r"), "--target-compute", "100", "--target-pass-rate", "0.7",
                 "--gpus", "8", "--price-per-gpu-hour", "2", "--json")
    fc = json.loads(js.stdout)
    assert abs(fc["cost_to_target"]["point"]["steps"] - 60) < 1 and fc["warnings"] and "band_low" in fc
    unreached = run_cli("-m", "scalerl.cli.main", "predict", str(tmp_path / "r"), "--target-pass-rate", "0.9")
    assert unreached.returncode == 0 and "not reached by the fit (A = 0.800)" in unreached.stdout
    assert "no train.steps" in unreached.stdout  # no config.yaml: said, not silent


def test_predict_errors(tmp_path):
    out = run_cli("-m", "scalerl.cli.main", "predict", str(tmp_path / "missing"))
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "no such run directory" in out.stderr
    _run(tmp_path / "few", 40)
    out = run_cli("-m", "scalerl.cli.main", "predict", str(tmp_path / "few"))
    assert out.returncode == 2 and "evaluate more often" in out.stderr and out.stderr.strip().count("\n") == 0
    out = run_cli("-m", "scalerl.cli.main", "predict", str(tmp_path / "few"), "--target-compute", "0")
    assert out.returncode == 2 and "--target-compute" in out.stderr and out.stderr.strip().count("\n") == 0


def test_estimate_7b():
    out = run_cli("-m", "scalerl.cli.main", "estimate", "--model-size", "7b", "--precision", "bf16", "--prompt-len", "256",
                  "--set", "train.micro_batch_size=4", "--tokens-per-s", "2000")
    assert out.returncode == 0, out.stderr
    # bf16 is the older name of standard: fp32 master weights 6.738e9 × 4 B = 25.10 GiB and autocast's bf16 copy
    # of all but the embedding and the head (32000 × 4096 each) and the 65 norms (× 4096) × 2 B = 12.06 GiB;
    # efficiency 0.85 for 7B
    n, embed = 6_738_415_616, 32000 * 4096
    assert f"weights            {n * 4 / 2**30:10.3f} GiB" in out.stdout
    assert f"working_copy       {(n - 2 * embed - 65 * 4096) * 2 / 2**30:10.3f} GiB" in out.stdout
    assert "precision standard" in out.stdout and "efficiency 0.85" in out.stdout
    bad = run_cli("-m", "scalerl.cli.main", "estimate", "--model-size", "5b")
    assert bad.returncode == 2 and "--model-size" in bad.stderr
