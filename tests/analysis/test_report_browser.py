"""The `mathrl report` page in a real browser: headless Chromium, driven from its command line.

What is checked, on a report of the two fake runs of tests/analysis/test_report.py:

* the DOM Chromium builds (`--dump-dom`) holds every <svg class="chart"> of the file, each with
  <polyline> children: the markup parses as intended;
* a screenshot (`--screenshot`, 1200x2000) is not blank and holds many pixels of both runs' line
  colours: the charts are drawn, not just present;
* nothing goes to the browser console from the page: with `--enable-logging=stderr` Chromium writes
  every console message and uncaught exception of the page as a `CONSOLE` line naming the page's
  file URL. Chromium logs console.log and console.error at the same level, so the check is that the
  page writes *no* console line at all (it writes none by design) and that no "Uncaught" appears.
  A canary page that does call console.error and throw proves the check can fail with this build;
* the hover script: a copy of the page with a probe that dispatches a mousemove over a chart shows
  the expected run values in the tooltip.

Missing resources (a broken <img src>) are not logged by Chromium; test_report.py checks statically
that the page references no file or URL at all.

Needs /usr/bin/chromium (Debian package `chromium`); skipped without it.
Run: python -m pytest tests/analysis/test_report_browser.py -q
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

# tests/ is on sys.path under pytest's default (rootdir-relative) import mode, as for conftest.py
from test_report import write_run

from mathrl.analysis.charts import PALETTE
from mathrl.analysis.report import build_report

CHROMIUM = "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (apt-get install chromium)")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]


def chromium(page: Path, tmp: Path, *extra: str) -> tuple[str, str]:
    """Open `page` once; returns (stdout, stderr). A fresh profile each time: no state between runs."""
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


def console_problems(stderr: str, page: Path) -> list[str]:
    """Console lines of `page` and uncaught exceptions in Chromium's stderr log."""
    url = page.as_uri()
    return [line for line in stderr.splitlines()
            if ("CONSOLE" in line and url in line) or "Uncaught" in line]


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    a = write_run(root / "clip_sym", eps_high=0.2, lift=0.2, entropy_nan_at=4)
    b = write_run(root / "clip_higher", eps_high=0.28, lift=0.3, extra_metrics=True)
    return build_report([a, b], root / "report.html", pngs=False)  # PNGs are test_report.py's business


def test_console_check_can_fail(tmp_path):
    canary = tmp_path / "canary.html"
    canary.write_text("<!DOCTYPE html><body><script>console.error('canary');</script>"
                      "<script>notDefined();</script></body>")
    _, stderr = chromium(canary, tmp_path, "--dump-dom")
    problems = console_problems(stderr, canary)
    assert any("canary" in p for p in problems) and any("Uncaught" in p for p in problems), (
        "this Chromium does not log console messages to stderr: the console checks below would pass vacuously")


def test_dom_has_the_charts_and_no_console_output(page, tmp_path):
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    source_charts = re.findall(r'<svg class="chart" data-metric="([^"]+)"', page.read_text())
    dom_charts = [m[0] for m in re.finditer(r'<svg class="chart" data-metric="[^"]+".*?</svg>', dom, re.S)]
    assert len(source_charts) >= 10
    assert re.findall(r'<svg class="chart" data-metric="([^"]+)"', dom) == source_charts
    for svg in dom_charts:
        assert re.search(r"<(polyline|path)\b", svg)
    assert console_problems(stderr, page) == []


def test_screenshot_shows_both_runs(page, tmp_path):
    from matplotlib.image import imread

    shot = tmp_path / "shot.png"
    _, stderr = chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1200,2000")
    assert console_problems(stderr, page) == []
    pixels = imread(shot)[..., :3]  # [H, W, 3] floats in [0, 1]
    assert pixels.shape[:2] == (2000, 1200)
    assert pixels.std() > 0.05  # not a blank page
    # Pixels of each run's colour. Measured with Chromium 156: about 2900 (run 1) and 3400 (run 2);
    # the same page with its <polyline>s removed (swatches, legends and point markers left) about 850.
    for color in PALETTE[:2]:
        rgb = [int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        near = (abs(pixels - rgb) < 0.08).all(axis=-1).sum()
        assert near > 2000, f"only {near} pixels of {color}: are the lines drawn?"


def test_hover_shows_each_runs_value(page, tmp_path):
    # A probe appended to a copy of the page moves the mouse to the middle of the reward/mean plot
    # (step 3.5 of 1..6: nearest logged step 3) and the dumped DOM shows the tooltip it produced.
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", """<script>
var svg = document.querySelector('svg.chart[data-metric="reward/mean"]');
var plot = svg.getAttribute("data-plot").split(",").map(Number);
var pt = svg.createSVGPoint(); pt.x = plot[0] + plot[2] / 2; pt.y = plot[1] + plot[3] / 2;
var c = pt.matrixTransform(svg.getScreenCTM());
svg.dispatchEvent(new MouseEvent("mousemove", {clientX: c.x, clientY: c.y, bubbles: true}));
</script></body>"""))
    dom, stderr = chromium(probe, tmp_path, "--dump-dom")
    assert console_problems(stderr, probe) == []
    tip = re.search(r'<div id="tip"[^>]*>(.*?)</div>\s*<script', dom, re.S)[1]
    # reward/mean at step 3: 0.3 + lift * 3 / 6
    assert "clip_sym: 0.4000 (step 3)" in tip and "clip_higher: 0.4500 (step 3)" in tip
    assert "display: block" in dom
