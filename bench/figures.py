"""Benchmark figures as a PNG plus the data it was drawn from (a Plotly figure's JSON), never a
self-contained page carrying its own plotly.js (megabytes in the repository per figure).

The PNG is drawn by plotly.js (the copy in the pinned `plotly` package) in a headless Chromium
(Debian's package, driven by the `playwright` package; never a downloaded browser):
``python -m bench.figures docs/images/autoscale-ramp.json`` draws the PNG again from its data.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

WIDTH = 1200
HEIGHT = 600


def save(figure: Any, png: Path) -> Path:
    """Write `figure` (a plotly Figure) as `png` and its data beside it (`.json`); returns
    the data's path."""
    data = png.with_suffix(".json")
    data.write_text(figure.to_json(pretty=True) + "\n")
    render(json.loads(data.read_text()), png)
    return data


def render(figure: dict[str, Any], png: Path, *, width: int = WIDTH, height: int = HEIGHT) -> None:
    """Draw a Plotly figure's JSON (`{"data": [...], "layout": {...}}`) into `png`."""
    from playwright.sync_api import sync_playwright
    from plotly.offline import get_plotlyjs

    chromium = shutil.which("chromium")
    if chromium is None:
        raise RuntimeError("drawing a figure needs Chromium: apt-get install -y chromium")
    layout = {**figure.get("layout", {}), "width": width, "height": height}
    page_html = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<script>{get_plotlyjs()}</script></head>"
        "<body style='margin:0'><div id='figure'></div><script>"
        f"Plotly.newPlot('figure', {json.dumps(figure.get('data', []))}, "
        f"{json.dumps(layout)}, {{staticPlot: true}})"
        ".then(() => document.body.dataset.drawn = '1');</script></body></html>"
    )
    with tempfile.TemporaryDirectory() as tmp:
        page_path = Path(tmp) / "figure.html"
        page_path.write_text(page_html)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium, headless=True, args=["--no-sandbox"]
            )
            try:
                page = browser.new_page(viewport={"width": width, "height": height})
                page.goto(page_path.as_uri())
                page.wait_for_selector("body[data-drawn='1']", timeout=30_000)
                page.locator("#figure").screenshot(path=str(png))
            finally:
                browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="a figure's data (.json); the PNG goes beside")
    args = parser.parse_args()
    render(json.loads(args.data.read_text()), args.data.with_suffix(".png"))
    print(json.dumps({"png": str(args.data.with_suffix(".png"))}))


if __name__ == "__main__":
    main()
