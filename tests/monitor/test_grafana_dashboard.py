"""deploy/grafana_dashboard.json is a valid dashboard whose every query names a metric the exporter serves."""

from __future__ import annotations

import json
import re

import pytest

from conftest import ROOT
from observed_run import observed, samples, scrape
from scalerl.monitor.events import read_events
from scalerl.jsonl import read_metrics
from scalerl.monitor.prometheus import PrometheusExporter

DASHBOARD = ROOT / "deploy" / "grafana_dashboard.json"
WANTED = {"reward": "scalerl_reward_mean", "KL": "scalerl_kl", "β": "scalerl_beta", "Loss": "scalerl_loss",
          "Entropy": "scalerl_entropy", "Response length": "scalerl_response_len", "pass rate": "scalerl_eval_pass_rate",
          "tokens/s": "scalerl_tokens_per_s", "events": "scalerl_events_total"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> set[str]:
    """Sample names the exporter serves for a real run's metrics.jsonl and events.jsonl (plus one event,
    so the events counter exists even when the health monitor raised none)."""
    run = observed(tmp_path_factory)
    exporter = PrometheusExporter(run.run_dir.name, port=0)
    try:
        for row in read_metrics(run.run_dir):
            exporter.log(row["step"], {k: v for k, v in row.items() if k != "step"})
        exporter.events(read_events(run.run_dir) + [{"step": 1, "rule": "kl_band", "severity": "warning"}])
        return {name for name, _ in samples(scrape(exporter.url))}
    finally:
        exporter.close()


def test_dashboard_is_a_grafana_dashboard():
    dash = json.loads(DASHBOARD.read_text())
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert dash["title"] and dash["uid"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) >= 9
    for panel in dash["panels"]:
        assert panel["type"] in {"timeseries", "stat"} and panel["targets"], panel["title"]
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys() and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["datasource"]["type"] == "prometheus"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "run"} <= variables


def test_every_panel_queries_metrics_the_exporter_serves(exported):
    dash = json.loads(DASHBOARD.read_text())
    queried: set[str] = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            names = set(re.findall(r"\bscalerl_[a-zA-Z0-9_]+", target["expr"]))
            assert names, (panel["title"], target["expr"])
            assert names <= exported, (panel["title"], names - exported)
            queried |= names
    assert set(WANTED.values()) <= queried, set(WANTED.values()) - queried
