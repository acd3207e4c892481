"""Health rules under fault injection in real short runs of the built-in model: each test breaks
something on purpose and checks the event AND that the response really happened."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch

from conftest import tiny_overrides
from scalerl.config import load_config
from scalerl.envs.arithmetic import ArithmeticEnv
from scalerl.errors import ScaleRLError
from scalerl.monitor.events import read_events
from scalerl.jsonl import read_metrics
from scalerl.trainer import loop
from scalerl.learner import learner as learner_module

BUILD, STEP = loop.build_roles, loop.train_step


def _run(runs, name, monkeypatch, before_step=None, **extra):
    """train() on the tiny config; `before_step(learner, step)` runs at the start of every step.
    Returns (learner, summary, metrics rows, events)."""
    config = load_config(overrides=tiny_overrides(runs, name, **{"eval.every": 0, "log.tensorboard": False, **extra}))
    built = {}
    monkeypatch.setattr(loop, "build_roles", lambda *a, **k: built.setdefault("roles", BUILD(*a, **k)))

    def stepping(rollout, learner, step, ctx):
        if before_step is not None:
            before_step(learner, step)
        return STEP(rollout, learner, step, ctx)

    monkeypatch.setattr(loop, "train_step", stepping)
    summary = loop.train(config)
    run = runs / name
    return built["roles"][1], summary, read_metrics(run), read_events(run)


def _poison_loss(monkeypatch, bad_steps):
    """The loss (hence every gradient) is NaN at the given steps; returns the setter for the step."""
    current = {"step": 0}
    original = learner_module.rl_objective

    def poisoned(*args, **kwargs):
        loss, diagnostics = original(*args, **kwargs)
        return loss * (math.nan if current["step"] in bad_steps else 1.0), diagnostics

    monkeypatch.setattr(learner_module, "rl_objective", poisoned)
    return lambda t, step: current.update(step=step)


def test_nan_step_is_skipped_and_the_snapshot_restored(runs, monkeypatch):
    seen = {}

    def before(t, step):
        track(t, step)
        seen[step] = ([p.detach().clone() for p in t.policy.parameters()],
                      [s["exp_avg"].clone() for s in t.optimizer.state.values()])

    track = _poison_loss(monkeypatch, {4})
    t, summary, rows, events = _run(runs, "nan", monkeypatch, before, **{"health.nonfinite.snapshot_every": 2,
                                                                        "optim.max_grad_norm": None})
    [event] = [e for e in events if e["rule"] == "nonfinite"]
    assert event["step"] == 4 and event["severity"] == "critical" and event["precision"] == "fp32"
    assert event["restored_step"] == 2 and event["max_grad_norm"] == 1.0
    assert "restored the model and optimizer of step 2" in event["action"] and "optim.max_grad_norm = 1.0" in event["action"]
    # Step 5 starts from the state after step 2 (= the start of step 3), not from after step 3.
    weights, moments = seen[5]
    assert all(torch.equal(a, b) for a, b in zip(weights, seen[3][0]))
    assert all(torch.equal(a, b) for a, b in zip(moments, seen[3][1]))
    assert any(not torch.equal(a, b) for a, b in zip(weights, seen[4][0]))
    assert t.state.max_grad_norm == 1.0 and t.state_dict()["max_grad_norm"] == 1.0  # clipping is on for the rest of the run (checkpointed)
    assert rows[3]["loss"] is None and rows[3]["health/nonfinite"] == 1.0 and rows[2].get("health/nonfinite") is None
    assert [r["step"] for r in rows] == list(range(1, 7)) and math.isfinite(rows[-1]["loss"])
    assert summary["health_events"]["nonfinite"] == 1


def test_without_room_for_a_restore_point_the_start_says_so_and_a_nan_step_is_only_skipped(runs, monkeypatch, capsys):
    """A restore point over half of the host's available memory (a 7B model's 84 GB, say) is not taken: one start line
    names the key, and the non-finite response skips the update without restoring."""
    from scalerl.trainer import health_guard

    real = health_guard.psutil.virtual_memory()
    tiny = real._replace(available=2 * 10**6)  # the built-in model's restore point (~12 MB) is over half of 2 MB
    monkeypatch.setattr(health_guard.psutil, "virtual_memory", lambda: tiny)
    track = _poison_loss(monkeypatch, {2})
    t, _summary, rows, events = _run(runs, "noroom", monkeypatch, track, **{"train.steps": 3, "log.console": "plain"})
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "health.nonfinite.snapshot_every: a restore point (the trained weights and optimizer state) takes 0.0128 GB" in out
    assert "over half of the 0.002 GB available to this process: none kept" in out
    [event] = [e for e in events if e["rule"] == "nonfinite"]
    assert t.kept_snapshot is None and event["restored_step"] is None and "restored" not in event["action"]
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[1]["loss"] is None and math.isfinite(rows[2]["loss"])


def test_repeated_nan_gives_up_with_the_one_line_error(runs, monkeypatch):
    track = _poison_loss(monkeypatch, {2, 3, 4, 5, 6})
    with pytest.raises(ScaleRLError, match=r"^step 2: loss or gradient norm is not finite for 2 steps in a row \(to step 3\)"):
        _run(runs, "giveup", monkeypatch, track, **{"health.nonfinite.max_consecutive": 2})
    assert [e["consecutive"] for e in read_events(runs / "giveup") if e["rule"] == "nonfinite"] == [1, 2]
    with pytest.raises(ScaleRLError, match=r"^step 2: loss or gradient norm is not finite; lower optim.lr"):
        _run(runs, "off", monkeypatch, track, **{"health.nonfinite.enabled": False})


@pytest.mark.parametrize("beta", [0.0, 0.02])
def test_kl_explosion_raises_beta_and_halves_the_lr(runs, monkeypatch, beta):
    # lr 0.05 is 500x the default: the policy leaves the reference within a step or two.
    t, summary, rows, events = _run(runs, f"kl{beta}", monkeypatch, **{
        "optim.lr": 0.05, "algorithm.kl.track": True, "algorithm.kl.beta": beta})
    explosions = [e for e in events if e["rule"] == "kl_explosion"]
    assert explosions, [r["kl_seq"] for r in rows]
    first = explosions[0]
    s = first["step"]
    assert first["kl"] > 9.0 and first["kl"] == pytest.approx(rows[s - 1]["kl_seq"])  # > 3 x the band's top, 3
    expected_beta = max(1.5 * beta, 0.01)  # beta = 0: the floor health.kl.min_beta
    assert (first["beta_old"], first["beta_new"], first["lr_old"], first["lr_new"]) == pytest.approx((beta, expected_beta, 0.05, 0.025))
    assert rows[s]["beta"] == pytest.approx(expected_beta) and rows[s]["lr"] == pytest.approx(0.025)  # the next step's metrics
    assert rows[s - 1]["beta"] == pytest.approx(beta) and rows[s - 1]["lr"] == pytest.approx(0.05)
    n = len(explosions)
    assert t.state_dict()["lr_scale"] == pytest.approx(0.5 ** n) and t.lr() == pytest.approx(0.05 * 0.5 ** n)  # persistent, saved with checkpoints
    assert t.kl_ctl.state_dict()["scale"] == pytest.approx(1.5 ** n)
    assert rows[-1]["health/kl_explosion"] == n


def test_poisoned_batch_fires_reward_collapse_and_dumps_it(runs, monkeypatch):
    current = {"step": 0}
    original = ArithmeticEnv.score

    def score(self, task, completion):  # rewards 0.5/1.0 normally, all 0 in the poisoned step 5
        return 0.0 if current["step"] == 5 else 0.5 + 0.5 * original(self, task, completion)

    monkeypatch.setattr(ArithmeticEnv, "score", score)
    t, summary, rows, events = _run(runs, "collapse", monkeypatch, lambda t, step: current.update(step=step),
                                    **{"health.min_history": 3})
    [event] = [e for e in events if e["rule"] == "reward_collapse"]
    assert event["step"] == 5 and event["reward_mean"] == 0.0 and event["dump"] == "collapse/step_5.jsonl"
    assert event["window_mean"] == pytest.approx(sum(r["reward_mean"] for r in rows[:4]) / 4)
    dumped = [json.loads(line) for line in (runs / "collapse" / event["dump"]).read_text().splitlines()]
    assert len(dumped) == 16 and all(d["reward"] == 0.0 and d["prompt"].endswith("=") for d in dumped)
    prompts = [d["prompt"] for d in dumped]
    assert all(isinstance(d["completion"], str) for d in dumped)
    assert all(len(set(prompts[i:i + 4])) == 1 for i in range(0, 16, 4)) and len(set(prompts)) == 4  # 4 groups of 4
    assert rows[4]["health/reward_collapse"] == 1.0


def test_grad_norm_plateau_phase_and_webhook_in_one_run(runs, monkeypatch, capsys):
    posted: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            posted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        t, summary, rows, events = _run(runs, "rules", monkeypatch, **{
            "health.grad_norm.max": 1e-9, "health.plateau.patience": 2, "health.plateau.min_delta": 10.0, "health.plateau.smooth": 1,
            "health.phase.min_steps": 4, "health.webhook_url": f"http://127.0.0.1:{server.server_port}/alerts",
            "log.console": "plain"})
    finally:
        server.shutdown()
        server.server_close()
    by_rule = lambda rule: [e["step"] for e in events if e["rule"] == rule]
    assert by_rule("grad_norm") == [1]  # every step's norm exceeds 1e-9: one excursion, one warning
    assert by_rule("reward_plateau") == [3]  # a best at step 1, never beaten by 10: one plateau, one alert
    assert by_rule("kl_inactive") == [1]  # beta = 0, no reference model
    assert [r["health/grad_norm"] for r in rows] == [1] * 6
    assert rows[-1]["health/events_total"] == 1 + 1 + 1  # grad_norm, reward_plateau, kl_inactive
    assert summary["phase_verdict"] in {"rising", "falling", "oscillating", "plateau"}
    assert json.loads((runs / "rules" / "summary.json").read_text())["phase_verdict"] == summary["phase_verdict"]
    assert by_rule("phase_verdict") == [6]
    assert [p["rule"] for p in posted] == [e["rule"] for e in events if e["severity"] != "info"]  # alerts only
    out = capsys.readouterr().out
    assert "health warning at step 3, reward_plateau" in out and f"reward curve: {summary['phase_verdict']}" in out


def test_scrambled_weights_fire_pass_rate_drop(runs, monkeypatch):
    """Noise added to every weight before step 3 wrecks the model: the next two held-out evaluations
    are far below the step-0 one, and the second of them raises the critical event."""
    def scramble(t, step):
        if step == 3:
            with torch.no_grad():
                for p in t.policy.parameters():
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.5)

    t, summary, rows, events = _run(runs, "drop", monkeypatch, scramble,
                                    **{"eval.every": 1, "train.steps": 5, "health.pass_rate_drop.max_drop": 0.1})
    passes = [summary["pass_rate_before"]] + [r["eval/pass_rate"] for r in rows]
    assert max(passes[:3]) > 0.1 and max(passes[3:]) < max(passes[:3]) - 0.1, passes  # measured: 0.125, 0.125, 0.1875, then 0.0
    [event] = [e for e in events if e["rule"] == "pass_rate_drop"]
    best = max(range(3), key=lambda i: passes[i])
    assert event["step"] == 4 and event["severity"] == "critical" and event["low_evals"] == 2
    assert (event["best"], event["best_step"], event["pass_rate"]) == (passes[best], best, passes[4])
    assert [r["health/pass_rate_drop"] for r in rows if "health/pass_rate_drop" in r] == [1.0, 1.0]  # steps 4 and 5
