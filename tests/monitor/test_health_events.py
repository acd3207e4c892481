"""The event log: JSON lines, counts, resume, and alerts POSTed to a real local HTTP server."""

from __future__ import annotations

import json
import math
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from scalerl.monitor.events import Event, EventLog, read_events


@pytest.fixture
def webhook():
    """A real HTTP server on localhost: collects POSTed JSON bodies; a path of /fail answers 500."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(body)
            self.send_response(500 if self.path == "/fail" else 200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", received
    server.shutdown()
    server.server_close()


def test_events_are_json_lines_counted_and_alerts_are_posted(tmp_path, webhook):
    url, received = webhook
    printed: list[str] = []
    log = EventLog(tmp_path, write=True, printer=printed.append, webhook_url=url + "/hook")
    log.emit(Event(1, "kl_inactive", "info", "no reference model"))
    log.emit(Event(2, "grad_norm", "warning", "gradient norm 12 > 10", values={"grad_norm": 12.0, "max": 10.0}, time=5.0))
    log.emit(Event(3, "nonfinite", "critical", "loss nan", action="skipped the update", values={"loss": math.nan}))
    log.close()
    rows = read_events(tmp_path)
    assert [r["rule"] for r in rows] == ["kl_inactive", "grad_norm", "nonfinite"]
    assert rows[1] == {"step": 2, "time": 5.0, "rule": "grad_norm", "severity": "warning", "message": "gradient norm 12 > 10",
                       "action": None, "grad_norm": 12.0, "max": 10.0}
    assert rows[2]["loss"] is None and rows[2]["action"] == "skipped the update"  # NaN is not JSON
    assert [r["rule"] for r in received] == ["grad_norm", "nonfinite"]  # info is not an alert
    assert received[0] == rows[1]
    assert printed[1] == "health warning at step 2, grad_norm: gradient norm 12 > 10"
    assert printed[2].endswith("-> skipped the update")
    assert log.metrics() == {"health/events_total": 3.0, "health/grad_norm": 1.0, "health/kl_inactive": 1.0,
                             "health/nonfinite": 1.0, "health/webhook_failures": 0.0}


def test_webhook_failures_are_counted_and_printed_not_raised(tmp_path, webhook):
    url, received = webhook
    printed: list[str] = []
    log = EventLog(tmp_path, write=True, printer=printed.append, webhook_url=url + "/fail")
    log.emit(Event(1, "grad_norm", "warning", "x"))
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    log.webhook_url = closed
    log.emit(Event(2, "grad_norm", "warning", "y"))
    log.close()
    assert len(received) == 1 and log.webhook_failures == 2
    assert "HTTP Error 500" in printed[1] and "failed (2 so far)" in printed[3]
    assert len(read_events(tmp_path)) == 2  # the events themselves are still written


def test_resume_drops_the_tail_and_keeps_counting(tmp_path):
    log = EventLog(tmp_path, write=True, printer=lambda m: None)
    for step, rule in [(1, "grad_norm"), (2, "reward_plateau"), (5, "grad_norm")]:
        log.emit(Event(step, rule, "warning", "m"))
    log.close()
    resumed = EventLog(tmp_path, write=True, printer=lambda m: None, resume_after=3)
    resumed.emit(Event(4, "grad_norm", "warning", "m"))
    resumed.close()
    assert [r["step"] for r in read_events(tmp_path)] == [1, 2, 4]
    assert resumed.metrics() == {"health/events_total": 3.0, "health/grad_norm": 2.0, "health/reward_plateau": 1.0}


def test_other_ranks_count_but_write_nothing(tmp_path):
    log = EventLog(tmp_path, write=False)
    log.emit(Event(1, "grad_norm", "warning", "m"))
    assert log.metrics()["health/grad_norm"] == 1.0 and not (tmp_path / "events.jsonl").exists()
