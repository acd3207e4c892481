"""Health events: one JSON object per line in `<run_dir>/events.jsonl`, counted per rule, and
alerts (warning or critical) POSTed to an optional webhook.

A line: {"step", "time", "rule", "severity", "message", "action", ...rule-specific values}.
`time` is Unix seconds; `action` is what the trainer did about it (null: nothing, only reported).
"""

from __future__ import annotations

import http.client
import json
import math
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from scalerl.files import writing
from scalerl.jsonl import read_log, write_log_atomically

SEVERITIES = ("info", "warning", "critical")
EVENTS_FILE = "events.jsonl"


@dataclass
class Event:
    step: int
    rule: str
    severity: str  # one of SEVERITIES
    message: str
    action: str | None = None
    values: dict[str, Any] = field(default_factory=dict)  # rule-specific numbers, flattened into the JSON line
    time: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in self.values.items()}
        return {"step": self.step, "time": self.time, "rule": self.rule, "severity": self.severity,
                "message": self.message, "action": self.action, **clean}

    @property
    def is_alert(self) -> bool:
        return SEVERITIES.index(self.severity) >= SEVERITIES.index("warning")

    def line(self) -> str:
        """The console line."""
        text = f"health {self.severity} at step {self.step}, {self.rule}: {self.message}"
        return text + (f" -> {self.action}" if self.action else "")


def post_json(url: str, payload: dict[str, Any], timeout: float) -> None:
    """POST `payload` as JSON; raises on a connection error, a timeout or a non-2xx answer."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # urlopen raises HTTPError on >= 400
        response.read()


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events of a run (a torn last line of a killed run dropped; [] without the file)."""
    return read_log(Path(run_dir) / EVENTS_FILE)


class EventLog:
    """Writes events (rank 0: `write=True`), counts them per rule and posts alerts to the webhook.

    On resume, events after the resumed step are dropped (a crashed run's tail, as for
    metrics.jsonl) and the kept ones are counted again, so `health/*` counts continue.
    """

    def __init__(self, run_dir: Path, *, write: bool, printer: Callable[[str], None] = print,
                 webhook_url: str | None = None, webhook_timeout_s: float = 2.0, resume_after: int | None = None):
        self.path = Path(run_dir) / EVENTS_FILE
        self.write, self.printer = write, printer
        self.webhook_url, self.webhook_timeout_s = webhook_url, webhook_timeout_s
        self.counts: dict[str, int] = {}
        self.webhook_failures = 0
        self._file = None
        if not write:
            return
        if resume_after is not None:
            kept = [e for e in read_events(run_dir) if e["step"] <= resume_after]
            write_log_atomically(self.path, kept)
            for e in kept:
                self.counts[e["rule"]] = self.counts.get(e["rule"], 0) + 1
        self._file = open(self.path, "a", buffering=1)

    def emit(self, event: Event) -> None:
        self.counts[event.rule] = self.counts.get(event.rule, 0) + 1
        if not self.write:
            return
        payload = event.to_json()
        with writing(self.path):
            self._file.write(json.dumps(payload) + "\n")
        self.printer(event.line())
        if self.webhook_url and event.is_alert:
            try:
                post_json(self.webhook_url, payload, self.webhook_timeout_s)
            except (OSError, ValueError, http.client.HTTPException) as err:  # contained on purpose: an alert channel must not stop training
                self.webhook_failures += 1
                self.printer(f"health webhook {self.webhook_url} failed ({self.webhook_failures} so far): {err}")

    def metrics(self) -> dict[str, float]:
        """`health/events_total`, `health/<rule>` (cumulative counts) and `health/webhook_failures`."""
        out = {"health/events_total": float(sum(self.counts.values()))}
        out.update({f"health/{rule}": float(n) for rule, n in sorted(self.counts.items())})
        if self.webhook_url:
            out["health/webhook_failures"] = float(self.webhook_failures)
        return out

    def close(self) -> None:
        if self._file is not None:
            with writing(self.path):
                self._file.close()
