"""`scalerl report`: a self-contained HTML file whose plots are valid PNGs; rendered by headless
Chromium (slow; needs /usr/bin/chromium)."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys

import pytest
from PIL import Image, ImageStat

from conftest import run_cli
from observed_run import observed
from scalerl.errors import ScaleRLError
from scalerl.monitor.report import PANELS, load_run, panel_lines, render_report, run_forecast, write_report

IMG = re.compile(r'<img alt="([^"]*)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def _synthetic_run(root):
    """12 steps with reward 0.05·step, no entropy, two events, a verdict."""
    run = root / "synth"
    run.mkdir(parents=True)
    rows = [{"step": s, "reward_mean": 0.05 * s, "kl": None if s == 1 else 0.01 * s, "beta": 0.1, "loss": 1 / s,
             "response_len": 4 + s % 3, **({"eval/pass_rate": 0.3 + 0.02 * s} if s % 4 == 0 else {})} for s in range(1, 13)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    events = [{"step": 5, "rule": "kl_band", "severity": "warning", "message": "kl <b>low</b>", "action": None},
              {"step": 9, "rule": "nan_loss", "severity": "critical", "message": "loss is NaN", "action": "rolled back"}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run / "summary.json").write_text(json.dumps({"pass_rate_before": 0.3, "pass_rate_after": 0.54, "phase_verdict": "rising",
                                                  "phase_stats": {"slope": 0.05}}))
    return run


def _pngs(page: str) -> dict[str, Image.Image]:
    images = {}
    for alt, data in IMG.findall(page):
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        image.verify()  # a complete, uncorrupted PNG
        images[alt] = Image.open(io.BytesIO(base64.b64decode(data)))
    return images


def test_report_html_embeds_a_valid_png_per_recorded_panel(tmp_path):
    data = load_run(_synthetic_run(tmp_path))
    curve = [[float(x), 0.6 - 0.3 / (1 + x / 6)] for x in range(1, 25)]
    forecast = {"A": 0.6, "B": 1.0, "C_mid": 6.0, "R0": 0.3, "compute_key": "steps", "points": [[4, 0.38], [8, 0.46], [12, 0.54]],
                "curve": curve, "band_low": [y - 0.05 for _, y in curve], "band_high": [y + 0.05 for _, y in curve]}
    page = render_report(data, forecast, "")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "src=\"http" not in page and "<script" not in page  # self-contained
    images = _pngs(page)
    recorded = [title for title, _, _ in PANELS if title != "Entropy"]
    assert list(images) == [*recorded, "forecast"]  # one figure per panel with data, in order, then the forecast
    for image in images.values():  # large enough to read: 7 x 3 in at 90 dpi was ~520 x 240 px
        assert image.format == "PNG" and image.width >= 850 and image.height >= 380, image.size
    assert "Entropy: not recorded in this run" in page
    assert '<b class="verdict">rising</b>' in page
    assert page.count('<tr class="warning">') == 1 and page.count('<tr class="critical">') == 1
    assert "kl &lt;b&gt;low&lt;/b&gt;" in page and "rolled back" in page  # event text is escaped
    assert "A (asymptote) 0.6" in page


def _rewrite(run, edit):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(edit(r)) + "\n" for r in rows))


def test_empty_kl_panel_says_why_and_how_to_track_it(tmp_path):
    """β = 0 and no tracking: no reference model, so kl is null at every step; the panel says so in one line."""
    run = _synthetic_run(tmp_path)
    _rewrite(run, lambda r: {**r, "kl": None, "kl_seq": None, "beta": 0.0})
    (run / "config.yaml").write_text("algorithm:\n  name: grpo\n  kl:\n    beta: 0.0\n    track: false\n")
    page = render_report(load_run(run), None, "")
    assert "KL and β" not in _pngs(page)
    notes = re.findall(r'<p class="muted kl-missing">([^<]*)</p>', page)
    assert len(notes) == 1 and "\n" not in notes[0]
    assert "β = 0 and algorithm.kl.track is off, so no reference model was loaded" in notes[0]
    assert "set algorithm.kl.track=true" in notes[0]
    (run / "config.yaml").unlink()  # without config.yaml: the β column says it
    assert "β = 0 and algorithm.kl.track is off" in render_report(load_run(run), None, "")
    # with KL recorded, the panel is drawn and there is no note
    page = render_report(load_run(_synthetic_run(tmp_path / "tracked")), None, "")
    assert "KL and β" in _pngs(page) and "kl-missing" not in page


def test_identical_series_are_drawn_once_under_both_names(tmp_path):
    run = _synthetic_run(tmp_path)
    _rewrite(run, lambda r: {**r, "task_reward_mean": r["reward_mean"]})  # no components: fused = task reward
    data = load_run(run)
    assert [names for names, _, _ in panel_lines(data, ["reward_mean", "task_reward_mean"])] == [["reward_mean", "task_reward_mean"]]
    page = render_report(data, None, "")
    captions = re.findall(r"<figcaption[^>]*>([^<]*)</figcaption>", page)
    assert captions == ["task_reward_mean identical to reward_mean at every step: one line drawn"]
    assert re.search(r'<img alt="Reward" [^>]*><figcaption', page)  # under the Reward panel
    _rewrite(run, lambda r: {**r, "task_reward_mean": r["reward_mean"] + 0.01})  # different: two lines, no caption
    data = load_run(run)
    assert len(panel_lines(data, ["reward_mean", "task_reward_mean"])) == 2
    assert "<figcaption" not in render_report(data, None, "")


def test_report_without_events_verdict_or_forecast_says_so(tmp_path, monkeypatch):
    run = _synthetic_run(tmp_path)
    (run / "events.jsonl").unlink()
    (run / "summary.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "scalerl.predict.forecast", None)  # as if the module were absent
    forecast, note = run_forecast(run)
    assert forecast is None and note.startswith("forecast unavailable")
    page = render_report(load_run(run), forecast, note)
    assert "no events recorded" in page and "no health verdict" in page and "forecast unavailable" in page
    assert "forecast" not in _pngs(page)


def test_missing_run_dir_or_metrics_is_a_one_line_error(tmp_path):
    with pytest.raises(ScaleRLError, match="no such run directory"):
        write_report(tmp_path / "nope")
    with pytest.raises(ScaleRLError, match=r"metrics.jsonl: not found"):
        write_report(tmp_path)
    proc = run_cli("-m", "scalerl.cli.main", "report", str(tmp_path / "nope"))
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("error: ")


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={tmp_path / 'profile'}", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium: apt-get install -y chromium")
def test_headless_chromium_renders_the_report_of_a_real_run(tmp_path, tmp_path_factory):
    run = observed(tmp_path_factory)
    out = tmp_path / "report.html"
    proc = run_cli("-m", "scalerl.cli.main", "report", str(run.run_dir), "--out", str(out))
    assert proc.returncode == 0 and proc.stdout.strip() == f"report: {out}", proc.stderr
    dom = _chromium(tmp_path, "--dump-dom", out.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    images = _pngs(dom.stdout)  # what the browser parsed, not just the file
    assert {title for title, _, _ in PANELS} <= set(images)  # a real run records every panel
    assert all(image.width > 300 and image.height > 150 for image in images.values())
    shot = tmp_path / "shot.png"
    snap = _chromium(tmp_path, "--window-size=1000,2400", f"--screenshot={shot}", out.as_uri())
    assert snap.returncode == 0 and shot.is_file(), snap.stderr[-2000:]
    pixels = Image.open(shot).convert("L")
    assert pixels.size == (1000, 2400)
    assert ImageStat.Stat(pixels).stddev[0] > 10  # not a blank page: text and plot lines on white
    assert len(pixels.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 50


def test_a_reward_run_is_labelled_a_mean_reward_not_a_pass_rate(tmp_path):
    """summary.json's eval_metric (an environment without a verifier: "mean reward") names what eval/pass_rate holds in
    the summary table, the held-out panel and the forecast."""
    run = _synthetic_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "eval_metric": "mean reward"}))
    page = render_report(load_run(run), None, "no forecast")
    assert "<th>held-out mean reward before (pass_rate_before)</th>" in page and "Held-out mean reward" in _pngs(page)
    assert "pass rate" not in page.replace("pass_rate", "")
    plain = render_report(load_run(_synthetic_run(tmp_path / "verifier")), None, "no forecast")  # no eval_metric: a pass rate
    assert "<th>held-out pass rate after (pass_rate_after)</th>" in plain and "Held-out pass rate" in _pngs(plain)
