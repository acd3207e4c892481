"""A run's Prometheus endpoint: every numeric step metric as a gauge labelled with the run's name.

Served by `prometheus-client` from a daemon thread on rank 0 when `log.metrics_port` is set; the
dashboard in `deploy/grafana_dashboard.json` reads these names.
"""

from __future__ import annotations

import errno
import re
import sys
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from scalerl.errors import ScaleRLError

PREFIX = "scalerl"
_NOT_ALLOWED = re.compile(r"[^a-zA-Z0-9_]+")


def metric_name(key: str) -> str:
    """Prometheus name of a metrics-dict key: `scalerl_` + the key with every run of characters
    outside [a-zA-Z0-9_] replaced by one `_` (names must match [a-zA-Z_:][a-zA-Z0-9_:]*; `:` is
    reserved for recording rules). `reward/correctness_mean` → `scalerl_reward_correctness_mean`."""
    return f"{PREFIX}_{_NOT_ALLOWED.sub('_', key).strip('_')}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _serve_error(host: str, port: int, err: Exception) -> ScaleRLError:
    """Blame the setting at fault: a port in use or not allowed is log.metrics_port's; a name that
    does not resolve, or an address that is not this machine's, is log.metrics_host's."""
    reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err) or type(err).__name__
    if isinstance(err, OSError) and err.errno in (errno.EADDRINUSE, errno.EACCES):
        return ScaleRLError(f"log.metrics_port: cannot serve Prometheus metrics on {host}:{port} ({reason}); "
                            "choose a free port, or 0 for any free port")
    return ScaleRLError(f"log.metrics_host: cannot serve Prometheus metrics on {host!r} ({reason}); "
                        "give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0")


class PrometheusExporter:
    """Gauges `scalerl_<metric>{run}` (last value of each step metric), `scalerl_step{run}`, and the
    counters `scalerl_generated_tokens_total{run}` and `scalerl_events_total{run,rule,severity}`.

    Each exporter has its own registry, so two runs in one process do not collide.
    """

    def __init__(self, run: str, *, host: str = "127.0.0.1", port: int = 0, linger_s: float = 0.0):
        self.run, self.linger_s = run, linger_s
        self.registry = CollectorRegistry(auto_describe=True)
        self._gauges: dict[str, Gauge] = {}
        self._step = Gauge(f"{PREFIX}_step", "Last completed training step.", ["run"], registry=self.registry)
        self._tokens = Counter(f"{PREFIX}_generated_tokens", "Completion tokens generated for training.", ["run"],
                               registry=self.registry)
        self._events = Counter(f"{PREFIX}_events", "Health-monitor events read from events.jsonl.",
                               ["run", "rule", "severity"], registry=self.registry)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except (OSError, UnicodeError, ValueError) as err:
            raise _serve_error(host, port, err) from None
        self.host, self.port = host, self._server.server_port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Set one gauge per numeric metric (null values leave the last value in place)."""
        self._step.labels(run=self.run).set(step)
        for key, value in metrics.items():
            if not _is_number(value):
                continue
            name = metric_name(key)
            if name not in self._gauges:
                self._gauges[name] = Gauge(name, f"Step metric '{key}' (last value).", ["run"], registry=self.registry)
            self._gauges[name].labels(run=self.run).set(value)
        if _is_number(metrics.get("tokens")):
            self._tokens.labels(run=self.run).inc(metrics["tokens"])

    def events(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._events.labels(run=self.run, rule=str(row["rule"]), severity=str(row["severity"])).inc()

    def close(self) -> None:
        """Keep serving `linger_s` seconds (a scraper catches the final values), then stop the server."""
        if self.linger_s > 0:
            print(f"metrics: holding {self.url} open for {self.linger_s:g} s", file=sys.stderr)
            time.sleep(self.linger_s)
        self._server.shutdown()
        self._server.server_close()
