"""`bench.autoscale --plot x.html` writes a page that opens offline: plotly.js is inlined (the
copy of the pinned plotly package), no script comes from a CDN."""

from __future__ import annotations

from pathlib import Path

from bench.autoscale import QUICK, EpochRow, plot
from tests.test_self_contained import REMOTE_ASSET


def test_the_ramp_plot_is_self_contained(tmp_path: Path) -> None:
    rows = [
        EpochRow(
            epoch=1, parallelism=2, records_in=300, busy_s=0.5, backlog_epochs=0, committed_s=1.0
        ),
        EpochRow(
            epoch=2, parallelism=4, records_in=1200, busy_s=2.0, backlog_epochs=2, committed_s=2.5
        ),
    ]
    path = tmp_path / "ramp.html"
    plot(rows, QUICK, str(path))
    page = path.read_text()
    assert not REMOTE_ASSET.search(page), REMOTE_ASSET.search(page)
    assert "Plotly.newPlot" in page
    # the library itself is in the page (its version banner), not fetched
    assert "plotly.js v" in page and len(page) > 1_000_000
