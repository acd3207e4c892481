"""`scalerl report RUN_DIR`: one self-contained HTML file (PNG plots inlined as base64) with the
run's curves, its health events as markers, the health verdict and the reward-curve forecast.

Plots use matplotlib's object API (`Figure` rendered by Agg), so no pyplot state or display.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from scalerl.errors import ScaleRLError
from scalerl.monitor.events import read_events
from scalerl.jsonl import read_metrics

# (title, y-axis keys on the left axis, key on a right axis or None)
PANELS: list[tuple[str, list[str], str | None]] = [
    ("Reward", ["reward_mean", "task_reward_mean"], None),
    ("KL and β", ["kl", "kl_seq"], "beta"),
    ("Loss", ["loss"], None),
    ("Entropy", ["entropy"], None),
    ("Response length (tokens)", ["response_len"], None),
    ("Held-out pass rate", ["eval/pass_rate"], None),
]
SEVERITY_COLOURS = {"critical": "#d62728", "warning": "#ff7f0e", "info": "#7f7f7f"}
KL_KEYS = ("kl", "kl_seq")
FIGSIZE = (11, 4.4)  # inches; at DPI, 1100 x 440 pixels before tight cropping
DPI = 100


@dataclass
class RunData:
    run_dir: Path
    rows: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # the run's config.yaml, as plain YAML ({} when absent)


def load_run(run_dir: Path) -> RunData:
    """metrics.jsonl (required), events.jsonl and summary.json (each optional) of a run directory."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ScaleRLError(f"{run_dir}: no such run directory; pass a folder made by `scalerl train` (e.g. runs/<name>)")
    if not (run_dir / "metrics.jsonl").is_file():
        raise ScaleRLError(f"{run_dir}/metrics.jsonl: not found; pass a run directory of `scalerl train` that has logged a step")
    rows = read_metrics(run_dir)
    if not rows:
        raise ScaleRLError(f"{run_dir}/metrics.jsonl: empty; the run has not logged a step yet")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    config_path = run_dir / "config.yaml"
    config = (yaml.safe_load(config_path.read_text()) or {}) if config_path.is_file() else {}
    return RunData(run_dir, rows, read_events(run_dir), summary, config if isinstance(config, dict) else {})


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, skipping steps where it is absent or null."""
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [s for s, _ in points], [v for _, v in points]


def run_series(data: RunData, key: str) -> tuple[list[int], list[float]]:
    """`series`, with the pass rate measured before training (summary.json) as step 0 of eval/pass_rate."""
    steps, values = series(data.rows, key)
    if key == "eval/pass_rate" and data.summary.get("pass_rate_before") is not None:
        return [0, *steps], [data.summary["pass_rate_before"], *values]
    return steps, values


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def same_series(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> bool:
    """The same steps and, at each, the same value (to 1e-9: sums in another order may differ in the last bit)."""
    return a[0] == b[0] and all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(a[1], b[1]))


def panel_lines(data: RunData, keys: list[str]) -> list[tuple[list[str], list[int], list[float]]]:
    """(names, steps, values) per line to draw: the recorded keys, with a series identical to an earlier
    one drawn once under both names (`reward_mean` is `task_reward_mean` when nothing is fused in)."""
    lines: list[tuple[list[str], list[int], list[float]]] = []
    for key in keys:
        steps, values = run_series(data, key)
        if not steps:
            continue
        twin = next((line for line in lines if same_series((line[1], line[2]), (steps, values))), None)
        if twin is not None:
            twin[0].append(key)
        else:
            lines.append(([key], steps, values))
    return lines


def line_label(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{' = '.join(names)} (identical)"


def kl_missing_reason(data: RunData) -> str:
    """Why a run logged no KL, from its config.yaml (else its β column), and how to measure it."""
    kl = (data.config.get("algorithm") or {}).get("kl") or {}
    betas = {r["beta"] for r in data.rows if isinstance(r.get("beta"), (int, float))}
    beta = kl.get("beta", next(iter(betas)) if len(betas) == 1 else None)
    how = "set algorithm.kl.track=true to measure it (one extra forward per step), or algorithm.kl.beta > 0 to also penalise it"
    if beta == 0 and not kl.get("track"):
        return f"KL not measured: β = 0 and algorithm.kl.track is off, so no reference model was loaded and kl is null at every step; {how}"
    return f"KL not recorded: kl and kl_seq are null at every step (β {'= ' + format(beta, 'g') if beta is not None else 'unknown'}); {how}"


def _mark_events(ax: Axes, events: list[dict[str, Any]]) -> None:
    """A vertical line per event at its step, coloured by severity (one legend entry per severity)."""
    seen: set[str] = set()
    for event in events:
        severity = event["severity"]
        ax.axvline(event["step"], color=SEVERITY_COLOURS.get(severity, "#7f7f7f"), linestyle=":" if severity == "info" else "--",
                   linewidth=1, label=None if severity in seen else f"event: {severity}")
        seen.add(severity)


def plot_panel(data: RunData, title: str, keys: list[str], right: str | None) -> bytes | None:
    """One panel's PNG, or None when the run recorded none of its metrics."""
    lines = panel_lines(data, keys)
    right_line = series(data.rows, right) if right else ([], [])
    if not lines and not right_line[0]:
        return None
    fig = Figure(figsize=FIGSIZE)
    ax = fig.subplots()
    for names, steps, values in lines:
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=line_label(names))
    if right and right_line[0]:
        twin = ax.twinx()
        twin.plot(*right_line, color="#2ca02c", linestyle="-.", label=right)
        twin.set_ylabel(right)
        twin.legend(loc="upper right", fontsize=9)
    _mark_events(ax, data.events)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    return png(fig)


def panel_html(data: RunData, title: str, keys: list[str], right: str | None) -> str:
    """A panel's figure with a caption naming series drawn once for several names; a one-line reason
    in its place when there is nothing to draw (the KL panel of a run without a reference model)."""
    if KL_KEYS[0] in keys and not any(panel_lines(data, list(KL_KEYS))):
        return f'<p class="muted kl-missing">{html.escape(title)}: {html.escape(kl_missing_reason(data))}</p>'
    image = plot_panel(data, title, keys, right)
    if image is None:
        return f'<p class="muted">{html.escape(title)}: not recorded in this run</p>'
    merged = [names for names, _, _ in panel_lines(data, keys) if len(names) > 1]
    caption = "; ".join(f"{', '.join(names[1:])} identical to {names[0]} at every step: one line drawn" for names in merged)
    return _img(title, image, caption)


def plot_forecast(data: RunData, forecast: dict[str, Any]) -> bytes:
    """The fitted saturating curve with its bootstrap band over the measured pass rates."""
    fig = Figure(figsize=FIGSIZE)
    ax = fig.subplots()
    xs = [x for x, _ in forecast["curve"]]
    ax.fill_between(xs, forecast["band_low"], forecast["band_high"], color="#1f77b4", alpha=0.2, label="95% band")
    ax.plot(xs, [y for _, y in forecast["curve"]], color="#1f77b4", label=f"fit: A={forecast['A']:.3f}")
    if forecast["compute_key"] == "steps":
        steps, rates = run_series(data, "eval/pass_rate")
        ax.plot(steps, rates, "o", color="#7f7f7f", markersize=4, label="measured")
    ax.plot([x for x, _ in forecast["points"]], [y for _, y in forecast["points"]], "o", color="#d62728", markersize=4,
            label="fitted points")
    ax.axhline(forecast["A"], color="#1f77b4", linestyle="--", linewidth=0.8)
    ax.set_title(f"Held-out {eval_metric(data)}: forecast")
    ax.set_xlabel(forecast["compute_key"])
    ax.set_ylabel(eval_metric(data))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    return png(fig)


def run_forecast(run_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """(forecast or None, why there is none)."""
    try:
        from scalerl.predict.forecast import ForecastUnavailable, forecast_run
    except ImportError as err:
        return None, f"forecast unavailable ({err})"
    try:
        return forecast_run(run_dir), ""
    except ForecastUnavailable as err:
        return None, f"forecast unavailable: {err}"


def _img(title: str, data: bytes, caption: str = "") -> str:
    cap = f'<figcaption class="muted">{html.escape(caption)}</figcaption>' if caption else ""
    return f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">{cap}</figure>'


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else html.escape(str(value))


def eval_metric(data: RunData) -> str:
    """What eval/pass_rate measures: a pass rate (an environment's verifier) or a mean reward (the run's reward functions)."""
    return str(data.summary.get("eval_metric", "pass rate"))


def _summary_table(data: RunData) -> str:
    keys = ["pass_rate_before", "pass_rate_after", "steps", "wall_time_s", "train_time_s", "tokens_per_s"]
    metric = eval_metric(data)
    labels = {"pass_rate_before": f"held-out {metric} before (pass_rate_before)", "pass_rate_after": f"held-out {metric} after (pass_rate_after)"}
    cells = "".join(f"<tr><th>{html.escape(labels.get(k, k))}</th><td>{_fmt(data.summary[k])}</td></tr>" for k in keys if k in data.summary)
    last = data.rows[-1]
    cells += f"<tr><th>last logged step</th><td>{last['step']}</td></tr>"
    return f'<table class="kv">{cells}</table>'


def _verdict(data: RunData) -> str:
    verdict = data.summary.get("phase_verdict")
    if verdict is None:
        return '<p class="muted">no health verdict (summary.json has no phase_verdict)</p>'
    stats = data.summary.get("phase_stats") or {}
    detail = ", ".join(f"{html.escape(str(k))} {_fmt(v)}" for k, v in stats.items())
    return f'<p>reward curve: <b class="verdict">{html.escape(str(verdict))}</b> {detail}</p>'


def _events_table(events: list[dict[str, Any]]) -> str:
    if not events:
        return '<p class="muted">no events recorded</p>'
    rows = "".join(
        f'<tr class="{html.escape(e["severity"])}"><td>{e["step"]}</td><td>{html.escape(e["severity"])}</td>'
        f'<td>{html.escape(e["rule"])}</td><td>{html.escape(str(e["message"]))}</td><td>{html.escape(str(e.get("action") or ""))}</td></tr>'
        for e in events)
    return f"<table><tr><th>step</th><th>severity</th><th>rule</th><th>message</th><th>action</th></tr>{rows}</table>"


CSS = """body{font-family:system-ui,sans-serif;max-width:1180px;margin:2em auto;color:#222}
figure{margin:1em 0}img{max-width:100%}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:14px}.muted{color:#777}
tr.critical{background:#fdd}tr.warning{background:#fed}"""


def render_report(data: RunData, forecast: dict[str, Any] | None, forecast_note: str) -> str:
    """The report's HTML: summary, health verdict, events, one figure per panel, forecast."""
    name = html.escape(data.run_dir.name)
    metric = eval_metric(data)
    plots = [panel_html(data, f"Held-out {metric}" if keys == ["eval/pass_rate"] else title, keys, right) for title, keys, right in PANELS]
    if forecast is not None:
        fc = (f"<p>A (asymptote) {_fmt(forecast['A'])}, B {_fmt(forecast['B'])}, C_mid {_fmt(forecast['C_mid'])}, "
              f"R0 {_fmt(forecast['R0'])}, over {len(forecast['points'])} points ({html.escape(forecast['compute_key'])})</p>"
              + "".join(f'<p class="{html.escape(w["kind"])}">{html.escape(w["kind"])}: {html.escape(w["message"])}</p>'
                        for w in forecast.get("warnings", []))
              + _img("forecast", plot_forecast(data, forecast)))
    else:
        fc = f'<p class="muted forecast">{html.escape(forecast_note)}</p>'
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>ScaleRL run {name}</title>'
            f"<style>{CSS}</style></head><body><h1>ScaleRL run {name}</h1>"
            f'<p class="muted">{html.escape(str(data.run_dir))}, report written {datetime.now():%Y-%m-%d %H:%M}</p>'
            f'<h2>Summary</h2>{_summary_table(data)}<h2>Health</h2>{_verdict(data)}'
            f'<h2>Events</h2>{_events_table(data.events)}<h2>Curves</h2>{"".join(plots)}'
            f"<h2>Forecast</h2>{fc}</body></html>\n")


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report (default `<run_dir>/report.html`) and return its path."""
    data = load_run(run_dir)
    forecast, note = run_forecast(data.run_dir)
    path = Path(out) if out is not None else data.run_dir / "report.html"
    if not path.parent.is_dir():
        raise ScaleRLError(f"--out {path}: folder {path.parent} does not exist; create it or choose another path")
    path.write_text(render_report(data, forecast, note))
    return path
