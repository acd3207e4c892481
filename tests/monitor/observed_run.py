"""One short real training run with its Prometheus endpoint on, scraped over HTTP until it closes;
shared (once per session) by the monitor tests."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from conftest import tiny_overrides

STEPS = 6
_cache: dict[str, "ObservedRun"] = {}


@dataclass
class ObservedRun:
    run_dir: Path
    port: int
    last_scrape: str  # the last page served before the endpoint closed (during metrics_linger_s)
    scrapes: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a Prometheus text page."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def train_in_thread(root: Path, name: str, steps: int, linger_s: float, **extra) -> ObservedRun:
    """Train in a thread with the endpoint on; scrape every 50 ms until the thread ends."""
    from scalerl.config import load_config
    from scalerl.trainer.loop import train

    port = free_port()
    overrides = tiny_overrides(root, name, **{"train.steps": steps, "log.metrics_port": port,
                                              "log.metrics_linger_s": linger_s, "checkpoint.save_final": False, **extra})
    config = load_config(overrides=overrides)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            train(config)
        except BaseException as err:  # re-raised in the test's thread below
            errors.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    last, count = "", 0
    while thread.is_alive():
        page = scrape(f"http://127.0.0.1:{port}/metrics")
        if page is not None:
            last, count = page, count + 1
        time.sleep(0.05)
    thread.join()
    if errors:
        raise errors[0]
    return ObservedRun(root / name, port, last, count)


def observed(tmp_path_factory) -> ObservedRun:
    """The shared run: 6 steps, β > 0 (so kl is logged), evaluation every 2 steps, 1.5 s linger."""
    if "run" not in _cache:
        root = tmp_path_factory.mktemp("observed")
        _cache["run"] = train_in_thread(root, "observed", STEPS, 1.5, **{"algorithm.kl.beta": 0.05, "eval.every": 2})
    return _cache["run"]
