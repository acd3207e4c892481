"""Where else a step's metrics go besides metrics.jsonl and TensorBoard: a Prometheus endpoint,
Weights & Biases, MLflow. `MetricsLogger` fans each step out to the sinks `build_sinks` returns."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from scalerl.config import Config


class Sink(Protocol):
    """One destination of step metrics (rank 0 only)."""

    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def events(self, rows: list[dict[str, Any]]) -> None:
        """New health-monitor events (rows of events.jsonl: step, rule, severity, message, action)."""

    def close(self) -> None: ...


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics dict (null, NaN and strings dropped; bools are not metrics)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{'optim': {'lr': 1e-4}} → {'optim.lr': '0.0001'}: the resolved config as run parameters."""
    flat: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


class WandbSink:
    """A Weights & Biases run named like the run directory; the resolved config is its config.
    Offline use: WANDB_MODE=offline."""

    def __init__(self, config: Config, run_dir: Path):
        import wandb

        self._run = wandb.init(project=config.log.project, name=run_dir.name, dir=str(run_dir),
                               config=config.model_dump(mode="json"))
        self._events = 0

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._run.log(numeric(metrics), step=step)

    def events(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._events += 1
            self._run.log({"events_total": self._events}, step=int(row["step"]))

    def close(self) -> None:
        self._run.finish()


class MlflowSink:
    """An MLflow run in experiment `log.project` at `log.mlflow_tracking_uri`, with the resolved
    config as its parameters. Uses the client API, so no global "active run" is left behind."""

    def __init__(self, config: Config, run_dir: Path):
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=config.log.mlflow_tracking_uri)
        experiment = self._client.get_experiment_by_name(config.log.project)
        experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(config.log.project)
        self.run_id = self._client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        from mlflow.entities import Param

        params = [Param(k, v[:6000]) for k, v in _flat(config.model_dump(mode="json")).items()]
        self._client.log_batch(self.run_id, params=params)
        self._events = 0

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in numeric(metrics).items()])

    def events(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._events += 1
            self._client.log_metric(self.run_id, "events_total", self._events, step=int(row["step"]))

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def build_sinks(config: Config, run_dir: Path) -> list[Sink]:
    """The sinks `config.log` asks for: the Prometheus endpoint (`metrics_port`), then `log.sinks`.
    If one fails to start, those already started are closed before the error propagates."""
    log = config.log
    sinks: list[Sink] = []
    try:
        if log.metrics_port is not None:
            from scalerl.monitor.prometheus import PrometheusExporter

            exporter = PrometheusExporter(run_dir.name, host=log.metrics_host, port=log.metrics_port,
                                          linger_s=log.metrics_linger_s)
            print(f"metrics: serving Prometheus at {exporter.url}", file=sys.stderr)
            sinks.append(exporter)
        for name in log.sinks:
            match name:
                case "wandb":
                    sinks.append(WandbSink(config, run_dir))
                case "mlflow":
                    sinks.append(MlflowSink(config, run_dir))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks
