"""The Prometheus endpoint: names, values served over HTTP during a real run, and a real Prometheus
server scraping it (slow; needs /usr/bin/prometheus)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections import Counter

import pytest

from observed_run import STEPS, free_port, observed, samples, scrape
from scalerl.errors import ScaleRLError
from scalerl.monitor.events import read_events
from scalerl.jsonl import read_metrics
from scalerl.monitor.prometheus import PrometheusExporter, metric_name


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return observed(tmp_path_factory)


@pytest.mark.parametrize("key, name", [
    ("reward/correctness_mean", "scalerl_reward_correctness_mean"),
    ("eval/pass_rate", "scalerl_eval_pass_rate"),
    ("time/remaining_s", "scalerl_time_remaining_s"),
    ("kl", "scalerl_kl"),
    ("a-b.c//d", "scalerl_a_b_c_d"),
])
def test_metric_name_sanitises_keys(key, name):
    assert metric_name(key) == name


def test_exporter_serves_last_values_counters_and_events():
    exporter = PrometheusExporter("r1", port=0)
    try:
        exporter.log(1, {"reward_mean": 0.25, "kl": None, "tokens": 40, "note": "text", "eval/pass_rate": 0.5})
        exporter.log(2, {"reward_mean": 0.75, "kl": 0.01, "tokens": 60})
        exporter.events([{"step": 2, "rule": "kl_band", "severity": "warning", "message": "m", "action": None}] * 2)
        got = samples(scrape(exporter.url))
    finally:
        exporter.close()
    run = (("run", "r1"),)
    assert got[("scalerl_step", run)] == 2
    assert got[("scalerl_reward_mean", run)] == 0.75  # the last value
    assert got[("scalerl_kl", run)] == 0.01
    assert got[("scalerl_eval_pass_rate", run)] == 0.5  # kept from step 1
    assert got[("scalerl_generated_tokens_total", run)] == 100  # 40 + 60
    assert got[("scalerl_events_total", (("rule", "kl_band"), ("run", "r1"), ("severity", "warning")))] == 2
    assert not any(name == "scalerl_note" for name, _ in got)
    assert scrape(exporter.url) is None  # closed: the port no longer answers


def test_busy_port_is_a_one_line_error():
    first = PrometheusExporter("a", port=0)
    try:
        with pytest.raises(ScaleRLError, match=rf"log.metrics_port: cannot serve .*:{first.port} .*choose a free port"):
            PrometheusExporter("b", port=first.port)
    finally:
        first.close()


def test_a_training_run_serves_every_step_metric_until_it_closes(run):
    """Scraped over HTTP while a real run trained: the last page equals the last metrics.jsonl values."""
    rows, events = read_metrics(run.run_dir), read_events(run.run_dir)
    assert run.scrapes >= 2
    got = samples(run.last_scrape)
    label = (("run", "observed"),)
    assert got[("scalerl_step", label)] == STEPS
    last: dict[str, float] = {}
    for row in rows:  # the gauge holds each metric's last non-null value
        last.update({k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"})
    assert {"reward_mean", "kl", "beta", "loss", "entropy", "response_len", "eval/pass_rate", "tokens_per_s"} <= last.keys()
    for key, value in last.items():
        assert got[(metric_name(key), label)] == pytest.approx(value, rel=1e-9), key
    assert got[("scalerl_generated_tokens_total", label)] == sum(r["tokens"] for r in rows)
    served = Counter({dict(labels)["rule"] + "/" + dict(labels)["severity"]: v
                      for (name, labels), v in got.items() if name == "scalerl_events_total"})
    assert served == Counter(f"{e['rule']}/{e['severity']}" for e in events)
    assert scrape(f"http://127.0.0.1:{run.port}/metrics") is None


PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if shutil.os.path.exists("/usr/bin/prometheus") else None)


def _query(api: str, promql: str) -> list[dict]:
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="needs the Prometheus server binary: apt-get install -y prometheus")
def test_a_real_prometheus_server_scrapes_the_run(tmp_path):
    """Prometheus scrapes the endpoint every second during a 30-step run; its query API then has the reward series."""
    port, web = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: scalerl\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
    server = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{web}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = f"http://127.0.0.1:{web}"
    try:
        deadline = time.time() + 30
        while scrape(f"{api}/-/ready") is None:
            assert time.time() < deadline and server.poll() is None, "prometheus did not become ready"
            time.sleep(0.2)
        from scalerl.trainer import loop
        from scalerl.config import load_config
        from conftest import tiny_overrides

        config = load_config(overrides=tiny_overrides(tmp_path / "runs", "prom", **{
            "train.steps": 30, "eval.every": 10, "log.metrics_port": port, "log.metrics_linger_s": 8.0,  # scrapes may start late on a busy machine
            "checkpoint.save_final": False}))
        loop.train(config)
        rows = read_metrics(tmp_path / "runs" / "prom")
        # The endpoint is gone now, so Prometheus has marked the series stale: ask over a window.
        reward = _query(api, 'last_over_time(scalerl_reward_mean{run="prom"}[5m])')
        assert len(reward) == 1 and reward[0]["metric"]["job"] == "scalerl"
        assert float(reward[0]["value"][1]) == pytest.approx(rows[-1]["reward_mean"])  # the final value, seen during the linger
        history = _query(api, 'scalerl_reward_mean{run="prom"}[5m]')
        assert len(history[0]["values"]) >= 3  # scraped repeatedly during the run
        step = _query(api, "max_over_time(scalerl_step[5m])")
        assert float(step[0]["value"][1]) == 30
        tokens = _query(api, "max_over_time(scalerl_generated_tokens_total[5m])")
        assert math.isclose(float(tokens[0]["value"][1]), sum(r["tokens"] for r in rows))
    finally:
        server.terminate()
        server.wait(timeout=20)
