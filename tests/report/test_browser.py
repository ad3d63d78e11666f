"""The HTML report in a real headless Chromium (Debian package `chromium`): no console errors,
no failed or external loads, every figure decoded, and a screenshot that shows the figures.

Skipped, with the reason, only when no Chromium is installed (CI installs it: see .ci/run).
"""
import io

import numpy as np
import pytest
from matplotlib import colors as mcolors
from PIL import Image

from browser import find_chromium, load_page
from taxmodel.report import style
from taxmodel.report.build import write_report
from taxmodel.report.document import build_document

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: apt-get install -y chromium")


def _pixels_near(img: np.ndarray, hex_color: str, tol: int = 6) -> int:
    """Pixels within ``tol`` per channel of the colour (``img``: int16 RGB, so differences don't wrap)."""
    target = np.array([round(255 * c) for c in mcolors.to_rgb(hex_color)], dtype=np.int16)
    return int((np.abs(img - target).max(axis=2) <= tol).sum())


@pytest.fixture(scope="module")
def page(real_cases, tmp_path_factory):
    path = write_report(real_cases, tmp_path_factory.mktemp("html") / "report.html")
    result = load_page(CHROMIUM, path)
    result.expected_figures = len(build_document(real_cases).figures)
    shot = tmp_path_factory.getbasetemp() / "report-screenshot.png"
    shot.write_bytes(result.screenshot_png)  # kept for a human look after the run
    return result


def test_no_console_errors_or_failed_loads(page):
    assert page.console_errors == []
    assert page.title == "taxmodel report"


def test_every_figure_decoded_and_nothing_external(page):
    assert page.expected_figures >= 6  # ledger, taxes, comparisons, advice...: a report without them is broken
    assert page.images["count"] == page.expected_figures
    assert page.images["broken"] == 0
    assert page.images["external"] == []


def test_screenshot_shows_the_figures(page):
    img = np.asarray(Image.open(io.BytesIO(page.screenshot_png)).convert("RGB")).astype(np.int16)
    assert img.shape[0] > 2000 and img.shape[1] == 1280  # the whole page, not just the first screen
    assert img[::4, ::4].std() > 20, "screenshot is blank"
    # the ledger colours are on screen: useful work, exposed communication (bsp), locality, launch
    for part in ("useful", "exposed_comm", "locality_tax", "launch_latency", "flag_wait"):
        assert _pixels_near(img, style.part_style(part).color) > 500, f"no {part} colour in the screenshot"
