"""MetricsLogger's fan-out to sinks, the events.jsonl tail, and the optional W&B / MLflow sinks."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import run_cli
from scalerl.config import load_config
from scalerl.errors import ScaleRLError
from scalerl.monitor.metrics import EventsTail, MetricsLogger
from scalerl.monitor.sinks import build_sinks, numeric


class Recorder:
    """A sink that keeps what it was given."""

    def __init__(self):
        self.steps, self.rows, self.closed = [], [], False

    def log(self, step, metrics):
        self.steps.append((step, dict(metrics)))

    def events(self, rows):
        self.rows.extend(rows)

    def close(self):
        self.closed = True


def _event(step, rule="kl_band"):
    return json.dumps({"step": step, "rule": rule, "severity": "warning", "message": "m", "action": None}) + "\n"


def test_events_tail_reads_only_complete_new_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = EventsTail(path)
    assert tail.read_new() == []  # no file yet
    path.write_text(_event(1) + _event(2)[:10])  # the second line is still being written
    assert [e["step"] for e in tail.read_new()] == [1]
    with open(path, "a") as f:
        f.write(_event(2)[10:] + _event(3))
    assert [e["step"] for e in tail.read_new()] == [2, 3]
    assert tail.read_new() == []
    path.write_text(_event(1))  # rewritten shorter (a resumed run): read from the start again
    assert [e["step"] for e in tail.read_new()] == [1]


def test_metrics_logger_fans_out_steps_and_events_to_every_sink(tmp_path):
    sinks = [Recorder(), Recorder()]
    logger = MetricsLogger(tmp_path, tensorboard=False, sinks=sinks)
    logger.log(1, {"reward_mean": 0.5, "kl": None})
    (tmp_path / "events.jsonl").write_text(_event(2))
    logger.log(2, {"reward_mean": 0.75})
    with open(tmp_path / "events.jsonl", "a") as f:
        f.write(_event(2, "phase_verdict"))  # written after the last step: forwarded by close()
    logger.close()
    for sink in sinks:
        assert sink.steps == [(1, {"reward_mean": 0.5, "kl": None}), (2, {"reward_mean": 0.75})]
        assert [e["rule"] for e in sink.rows] == ["kl_band", "phase_verdict"]
        assert sink.closed
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_numeric_keeps_finite_numbers_only():
    assert numeric({"a": 1, "b": 0.5, "c": None, "d": float("nan"), "e": "x", "f": True}) == {"a": 1.0, "b": 0.5}


def test_no_sinks_by_default(tmp_path):
    assert build_sinks(load_config(), tmp_path) == []


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
def test_a_sink_whose_package_is_missing_is_a_one_line_error(package, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # importlib.util.find_spec then reports it absent
    with pytest.raises(ScaleRLError) as err:
        load_config(overrides={"log.sinks": [package]})
    message = str(err.value)
    assert message.startswith(f"log.sinks: '{package}' needs the {package} package") and f"pip install {package}" in message
    assert "\n" not in message


def test_cli_metrics_port_sets_the_config_key():
    proc = run_cli("-m", "scalerl.cli.main", "train", "--metrics-port", "9109", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "metrics_port: 9109" in proc.stdout and "metrics_host: 127.0.0.1" in proc.stdout


def test_mlflow_sink_records_a_real_local_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="optional: pip install 'scalerl[mlflow]'")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the plain-folder store behind this switch
    uri = (tmp_path / "mlruns").as_uri()
    config = load_config(overrides={"log.sinks": ["mlflow"], "log.mlflow_tracking_uri": uri, "log.project": "unit",
                                    "optim.lr": 3e-5})
    run_dir = tmp_path / "runs" / "m1"
    run_dir.mkdir(parents=True)
    logger = MetricsLogger(run_dir, tensorboard=False, sinks=build_sinks(config, run_dir))
    for step, reward in [(1, 0.25), (2, 0.5), (3, 0.75)]:
        logger.log(step, {"reward_mean": reward, "kl": None, "eval/pass_rate": reward / 2})
    (run_dir / "events.jsonl").write_text(_event(3))
    logger.close()

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("unit")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "m1" and run.info.status == "FINISHED"
    assert run.data.params["optim.lr"] == "3e-05" and run.data.params["log.sinks"] == "['mlflow']"
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "eval/pass_rate")] == pytest.approx([0.125, 0.25, 0.375])
    assert "kl" not in run.data.metrics  # null values are not sent
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "events_total")] == [(3, 1.0)]
