"""The job page's charts: every axis makes room for its title (nothing spills into the next
card), output rows get an axis of their own, each operation is marked once with a legend, and
a window without dead letters says so instead of drawing an empty grid."""

from __future__ import annotations

import datetime as dt
import uuid

from controlplane.lineage.epoch_stats import EpochPoint
from controlplane.operations.models import Operation
from web import charts

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def point(epoch: int, *, p: int = 2, dead: int = 0, kind: str = "epoch") -> EpochPoint:
    at = T0 + dt.timedelta(seconds=10 * epoch)
    return EpochPoint(
        snapshot_id=f"{epoch:064x}", epoch=epoch, kind=kind, parallelism=p, operation_id="",
        created_at=at, committed_at=at + dt.timedelta(milliseconds=30), records_in=15_000,
        output_rows=30, dead_letters=dead, bytes_written=1000, changed_state_bytes=500,
        process_s=1.0,
    )  # fmt: skip


def operation(kind: str, at_s: float, **params: object) -> Operation:
    moment = T0 + dt.timedelta(seconds=at_s)
    return Operation(
        id=uuid.uuid4(), kind=kind, state="succeeded", params=params,
        created_at=moment, started_at=moment, finished_at=moment,
    )  # fmt: skip


def test_rows_out_has_its_own_axis_and_every_axis_makes_room_for_its_title() -> None:
    figure = charts.throughput([point(e) for e in range(1, 6)])
    records, rows = figure["data"]
    assert "yaxis" not in records and rows["yaxis"] == "y2"
    layout = figure["layout"]
    assert layout["yaxis2"]["overlaying"] == "y" and layout["yaxis2"]["side"] == "right"
    for name, f in charts.job_figures([point(1)], [], None, 2, 8).items():
        for axis in ("xaxis", "yaxis"):
            if axis in f["layout"] and f["layout"][axis].get("visible", True):
                assert f["layout"][axis].get("automargin") is True, (name, axis)


def test_each_operation_is_marked_once_with_a_legend_by_kind() -> None:
    points = [point(e, p=2 if e < 4 else 3) for e in range(1, 8)]
    ops = [
        operation("rescale", 35, parallelism=3),
        operation("rollback", 55),
        operation("rollback", 65),
    ]
    figure = charts.parallelism_over_time(points, ops)
    layout = figure["layout"]
    assert layout["showlegend"] is True and not layout.get("shapes")
    assert not layout.get("annotations")
    marks = {t["name"]: t for t in figure["data"] if t["mode"] == "markers"}
    assert set(marks) == {"rescale", "rollback"}
    assert len(marks["rollback"]["x"]) == 2 and len(marks["rescale"]["x"]) == 1
    assert marks["rescale"]["y"] == [3]  # where the rescale took the job
    assert marks["rollback"]["y"] == [3, 3]  # the parallelism when each ended
    assert marks["rescale"]["text"][0].startswith("rescale to p=3 · succeeded")


def test_a_window_without_dead_letters_says_so() -> None:
    quiet = charts.dead_letters([point(e) for e in range(1, 4)])
    assert quiet["layout"]["annotations"][0]["text"] == "no dead letters in the last 3 commits"
    assert quiet["layout"]["yaxis"]["visible"] is False
    noisy = charts.dead_letters([point(1), point(2, dead=4)])
    assert "annotations" not in noisy["layout"]
    assert noisy["data"][0]["y"] == [0, 4]
