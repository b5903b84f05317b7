"""`bench.autoscale --plot x.png` writes the ramp as a PNG, drawn by plotly.js in headless
Chromium (bench/figures.py), and the figure's data beside it (x.json) to draw it again."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from bench.autoscale import QUICK, EpochRow, plot
from tests.conftest import require_service

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, head[:8]
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_the_ramp_plot_is_a_png_and_its_data(tmp_path: Path) -> None:
    require_service("Chromium", shutil.which("chromium") is not None, "apt-get install chromium")
    rows = [
        EpochRow(
            epoch=1, parallelism=2, records_in=300, busy_s=0.5, backlog_epochs=0, committed_s=1.0
        ),
        EpochRow(
            epoch=2, parallelism=4, records_in=1200, busy_s=2.0, backlog_epochs=2, committed_s=2.5
        ),
    ]
    path = tmp_path / "ramp.png"
    plot(rows, QUICK, str(path))
    assert png_size(path) == (1200, 600)
    assert path.stat().st_size > 10_000  # drawn, not blank
    data = json.loads(path.with_suffix(".json").read_text())
    traces = {trace["name"]: trace for trace in data["data"]}
    assert traces["parallelism"]["y"] == [2, 4]
    assert traces["records read per tick-second"]["y"] == [300 / QUICK.tick_s, 1200 / QUICK.tick_s]


def test_the_docs_figures_are_pngs_with_their_data() -> None:
    """No self-contained Plotly page in the repository: each figure is a PNG beside its data."""
    images = Path(__file__).resolve().parents[2] / "docs" / "images"
    assert not list(images.glob("*.html"))
    ramp = images / "autoscale-ramp.png"
    assert png_size(ramp)[0] >= 800
    assert json.loads(ramp.with_suffix(".json").read_text())["data"]
