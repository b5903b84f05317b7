"""Plotly figures of the job page, as plain JSON-ready dicts (drawn by plotly.js, served
locally). Each figure carries a `version` so the browser redraws only what changed."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from controlplane.lineage.epoch_stats import EpochPoint
from controlplane.lineage.state_reads import KeyGroupSizes
from controlplane.operations.models import Operation
from runners.engine.keygroups import key_group_ranges

PALETTE = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#0891b2", "#db2777", "#ca8a04", "#475569"]
KIND_COLORS = {
    "rescale": "#ea580c",
    "rollback": "#dc2626",
    "fork": "#9333ea",
    "migration": "#0891b2",
    "savepoint": "#ca8a04",
    "start": "#16a34a",
    "stop": "#475569",
    "migrate": "#0891b2",
}
HEAT = [[0.0, "#f1f5f9"], [0.25, "#fde68a"], [0.6, "#f97316"], [1.0, "#991b1b"]]
CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["lasso2d"]}


def _t(moment: datetime) -> str:
    """UTC wall time for a date axis (no offset: the axes are labelled UTC)."""
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _layout(title: str, **more: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {
            "text": title,
            "font": {"size": 13},
            "x": 0.01,
            "xanchor": "left",
            "y": 0.98,
            "yanchor": "top",
        },
        "margin": {"l": 48, "r": 16, "t": 52, "b": 32},
        "height": 250,
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "font": {"family": "system-ui, sans-serif", "size": 11, "color": "#334155"},
        "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0},
        "hovermode": "x unified",
        # automargin: titles and tick labels get room inside the figure, never spilling
        # into the next card
        "xaxis": {"gridcolor": "#e2e8f0", "zeroline": False, "automargin": True},
        "yaxis": {
            "gridcolor": "#e2e8f0",
            "zeroline": False,
            "rangemode": "tozero",
            "automargin": True,
        },
    }
    layout.update(more)
    for name, axis in layout.items():
        if name.startswith(("xaxis", "yaxis")) and isinstance(axis, dict):
            axis.setdefault("automargin", True)
    return layout


def _dates(layout: dict[str, Any]) -> dict[str, Any]:
    """A time x axis even before any point exists (markers alone cannot set its type)."""
    layout["xaxis"] = {
        **layout.get("xaxis", {}),
        "type": "date",
        "nticks": 8,
        "title": {"text": "commit time (UTC)"},
    }
    layout["margin"]["b"] = 44
    return layout


def _epochs(layout: dict[str, Any]) -> dict[str, Any]:
    layout["xaxis"] = {
        **layout.get("xaxis", {}),
        "type": "category",
        "nticks": 12,
        "title": {"text": "epoch"},
    }
    layout["hovermode"] = "closest"
    layout["margin"]["b"] = 44
    return layout


def _figure(data: list[dict[str, Any]], layout: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps([data, layout], sort_keys=True, default=str)
    return {
        "data": data,
        "layout": layout,
        "version": hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()[:16],
    }


def _time_axis(points: Sequence[EpochPoint]) -> list[str]:
    return [_t(p.committed_at or p.created_at) for p in points]


def _epoch_axis(points: Sequence[EpochPoint]) -> list[str]:
    """One category per commit: its epoch, and its kind when an operation made it."""
    return [f"e{p.epoch}" if p.kind == "epoch" else f"e{p.epoch} {p.kind}" for p in points]


def _epoch_text(points: Sequence[EpochPoint]) -> list[str]:
    return [f"epoch {p.epoch} · {p.snapshot_id[:12]} · {p.kind}" for p in points]


def _series(
    points: Sequence[EpochPoint], name: str, y: list[Any], color: str, **more: Any
) -> dict[str, Any]:
    """A line over commit time, hovering each commit's epoch, id and kind."""
    return {
        "type": "scatter",
        "mode": "lines+markers",
        "connectgaps": True,
        "name": name,
        "x": _time_axis(points),
        "y": y,
        "text": _epoch_text(points),
        "line": {"color": color, "width": 2},
        "marker": {"size": 4},
        **more,
    }


def timing(points: Sequence[EpochPoint]) -> dict[str, Any]:
    data = [
        _series(points, "epoch duration (s)", [p.process_s for p in points], PALETTE[0]),
        _series(
            points,
            "commit latency (ms)",
            [p.commit_latency_ms for p in points],
            PALETTE[1],
            yaxis="y2",
            line={"color": PALETTE[1], "width": 1.5, "dash": "dot"},
        ),
    ]
    layout = _layout(
        "Epoch duration and commit latency",
        yaxis={"title": {"text": "s"}, "gridcolor": "#e2e8f0", "rangemode": "tozero"},
        yaxis2={
            "title": {"text": "ms"},
            "overlaying": "y",
            "side": "right",
            "showgrid": False,
            "rangemode": "tozero",
        },
    )
    layout["margin"]["r"] = 48
    return _figure(data, _dates(layout))


def throughput(points: Sequence[EpochPoint]) -> dict[str, Any]:
    """Records in and rows out per second, each on its own axis: a job aggregating 15k
    records/s into 30 rows/s would otherwise draw its output as a flat line at zero."""
    data = [
        _series(points, "records in /s", [p.records_in_per_s for p in points], PALETTE[2]),
        _series(
            points,
            "rows out /s (right axis)",
            [p.output_rows_per_s for p in points],
            PALETTE[3],
            yaxis="y2",
        ),
    ]
    layout = _layout(
        "Records per second of epoch processing",
        yaxis={
            "title": {"text": "records in /s"},
            "gridcolor": "#e2e8f0",
            "rangemode": "tozero",
            "automargin": True,
        },
        yaxis2={
            "title": {"text": "rows out /s"},
            "overlaying": "y",
            "side": "right",
            "showgrid": False,
            "rangemode": "tozero",
            "automargin": True,
        },
    )
    layout["margin"]["r"] = 48
    return _figure(data, _dates(layout))


def bytes_written(points: Sequence[EpochPoint]) -> dict[str, Any]:
    x = _epoch_axis(points)
    data = [
        {
            "type": "bar",
            "name": "bytes written",
            "x": x,
            "y": [p.bytes_written for p in points],
            "hovertext": _epoch_text(points),
            "marker": {"color": PALETTE[0]},
        },
        {
            "type": "bar",
            "name": "changed state bytes",
            "x": x,
            "y": [p.changed_state_bytes for p in points],
            "marker": {"color": PALETTE[4]},
        },
    ]
    return _figure(data, _epochs(_layout("Bytes per epoch", barmode="group")))


def dead_letters(points: Sequence[EpochPoint]) -> dict[str, Any]:
    data = [
        {
            "type": "bar",
            "name": "dead letters",
            "x": _epoch_axis(points),
            "y": [p.dead_letters for p in points],
            "hovertext": _epoch_text(points),
            "marker": {"color": "#dc2626"},
        }
    ]
    late = any(p.late_records for p in points)
    if late:  # event-time jobs: the dead letters later than the watermark, beside them
        data.append(
            {
                "type": "bar",
                "name": "late (behind the watermark)",
                "x": _epoch_axis(points),
                "y": [p.late_records for p in points],
                "hovertext": _epoch_text(points),
                "marker": {"color": "#f59e0b"},
            }
        )
    layout = _epochs(_layout("Dead letters per epoch", showlegend=late))
    if not any(p.dead_letters for p in points):
        # nothing to draw: say so instead of an empty 0 to 1 grid
        layout["xaxis"]["visible"] = False
        layout["yaxis"] = {**layout["yaxis"], "visible": False}
        layout["annotations"] = [
            {
                "text": f"no dead letters in the last {len(points)} commits"
                if points
                else "no commits yet",
                "xref": "paper",
                "yref": "paper",
                "x": 0.5,
                "y": 0.5,
                "showarrow": False,
                "font": {"size": 12, "color": "#64748b"},
            }
        ]
    return _figure(data, layout)


def event_time(points: Sequence[EpochPoint]) -> dict[str, Any]:
    """Event-time jobs: how far each commit's watermark trailed its wall time (a line), and the
    records each epoch dropped as late (bars, on their own axis), per epoch."""
    x = _epoch_axis(points)
    data = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "connectgaps": True,
            "name": "watermark lag at commit (s)",
            "x": x,
            "y": [p.watermark_lag_s for p in points],
            "hovertext": _epoch_text(points),
            "line": {"color": PALETTE[3], "width": 2},
            "marker": {"size": 5},
        },
        {
            "type": "bar",
            "name": "late records",
            "x": x,
            "y": [p.late_records if p.event_time else None for p in points],
            "hovertext": _epoch_text(points),
            "yaxis": "y2",
            "opacity": 0.7,
            "marker": {"color": "#f59e0b"},
        },
    ]
    layout = _layout(
        "Watermark lag and late records per epoch",
        showlegend=True,
        yaxis={"gridcolor": "#e2e8f0", "rangemode": "tozero", "title": {"text": "lag (s)"}},
        yaxis2={
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
            "title": {"text": "late records"},
        },
    )
    return _figure(data, _epochs(layout))


def parallelism_over_time(
    points: Sequence[EpochPoint], operations: Sequence[Operation]
) -> dict[str, Any]:
    """Parallelism of each commit as steps, with the job's operations as vertical markers."""
    x = _time_axis(points)
    data: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "parallelism",
            "x": x,
            "y": [p.parallelism for p in points],
            "line": {"shape": "hv", "color": PALETTE[0], "width": 2},
        }
    ]
    # Each operation once: a marker at the moment it ended (or where it is now), at the
    # parallelism then, one legend entry per kind; details on hover, no labels to overlap.
    start = points[0].created_at if points else None
    by_kind: dict[str, list[tuple[str, int, str]]] = {}
    for op in operations:
        moment = op.finished_at or op.started_at or op.created_at
        if start is None or moment < start:
            continue
        then = [p.parallelism for p in points if (p.committed_at or p.created_at) <= moment]
        label = op.kind
        if op.kind == "rescale":
            label = f"rescale to p={op.params.get('parallelism')}"
        text = f"{label} · {op.state} · {str(op.pk)[:8]}"
        level = then[-1] if then else points[0].parallelism
        if op.kind == "rescale" and isinstance(op.params.get("parallelism"), int):
            level = op.params["parallelism"]  # where it took the job
        by_kind.setdefault(op.kind, []).append((_t(moment), level, text))
    for kind, marks in sorted(by_kind.items()):
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": kind,
                "x": [m[0] for m in marks],
                "y": [m[1] for m in marks],
                "text": [m[2] for m in marks],
                "hoverinfo": "text",
                "marker": {
                    "size": 11,
                    "symbol": "diamond",
                    "color": KIND_COLORS.get(kind, PALETTE[7]),
                    "line": {"color": "#ffffff", "width": 1},
                },
            }
        )
    top = max([p.parallelism for p in points] + [1])
    layout = _layout(
        "Parallelism over time, with operations",
        showlegend=True,
        yaxis={"gridcolor": "#e2e8f0", "range": [0, top + 1], "dtick": 1, "automargin": True},
    )
    return _figure(data, _dates(layout))


def heatmap(sizes: KeyGroupSizes | None) -> dict[str, Any]:
    """State bytes per key group, M key groups laid out in rows of `width`."""
    if sizes is None:
        return _figure([], _layout("State size per key group (no snapshot yet)"))
    m = sizes.max_parallelism
    width = max(1, min(m, 16)) if m <= 512 else math.ceil(math.sqrt(m))
    rows = math.ceil(m / width)
    z: list[list[int | None]] = []
    text: list[list[str]] = []
    p = sizes.parallelism
    ranges = key_group_ranges(p, m)
    owner = [0] * m
    for task, r in enumerate(ranges):
        for g in r:
            owner[g] = task
    for row in range(rows):
        z_row: list[int | None] = []
        t_row: list[str] = []
        for col in range(width):
            g = row * width + col
            if g >= m:
                z_row.append(None)
                t_row.append("")
                continue
            z_row.append(sizes.bytes[g])
            t_row.append(
                f"key group {g} · task {owner[g]} · {sizes.bytes[g]:,} B in {sizes.chunks[g]} "
                "chunk(s)"
            )
        z.append(z_row)
        text.append(t_row)
    data = [
        {
            "type": "heatmap",
            "z": z,
            "text": text,
            "hoverinfo": "text",
            "x": list(range(width)),
            "y": [r * width for r in range(rows)],
            "colorscale": HEAT,
            "zmin": 0,
            "colorbar": {"title": {"text": "bytes"}, "thickness": 10},
            "xgap": 1,
            "ygap": 1,
        }
    ]
    layout = _layout(
        f"State size per key group (M={m}, snapshot {sizes.snapshot_id[:12]})",
        hovermode="closest",
        xaxis={"title": {"text": "key group (column)"}, "dtick": 1 if width <= 16 else None},
        yaxis={"title": {"text": "first key group of row"}, "autorange": "reversed"},
        height=max(200, 40 + rows * 16),
    )
    return _figure(data, layout)


def allocation(
    parallelism: int, max_parallelism: int, sizes: KeyGroupSizes | None
) -> dict[str, Any]:
    """Which task owns which key groups at `parallelism` (Flink's range allocation), and the
    state bytes each task holds."""
    ranges = key_group_ranges(parallelism, max_parallelism)
    per_task = sizes.per_task(parallelism) if sizes is not None else [None] * parallelism
    data = []
    for task, r in enumerate(ranges):
        held = per_task[task]
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": f"task {task}: key groups {r.start}-{r.end}",
                "y": ["key groups"],
                "x": [len(r)],
                "base": [r.start],
                "text": [f"task {task}"],
                "textposition": "inside",
                "insidetextanchor": "middle",
                "hovertext": [
                    f"task {task} owns key groups {r.start}-{r.end} ({len(r)})"
                    + ("" if held is None else f" · {held:,} B of state")
                ],
                "hoverinfo": "text",
                "marker": {"color": PALETTE[task % len(PALETTE)]},
            }
        )
    layout = _layout(
        f"Key-group → task allocation at parallelism {parallelism} (M={max_parallelism})",
        barmode="overlay",
        hovermode="closest",
        height=170,
        showlegend=parallelism <= 12,
        xaxis={"range": [0, max_parallelism]},
        yaxis={"visible": False},
    )
    layout["legend"] = {"orientation": "h", "y": -0.45, "yanchor": "top", "x": 0}
    return _figure(data, layout)


def job_figures(
    points: Sequence[EpochPoint],
    operations: Sequence[Operation],
    sizes: KeyGroupSizes | None,
    parallelism: int,
    max_parallelism: int,
) -> dict[str, dict[str, Any]]:
    return {
        "timing": timing(points),
        "throughput": throughput(points),
        "bytes": bytes_written(points),
        "dead-letters": dead_letters(points),
        "parallelism": parallelism_over_time(points, operations),
        "heatmap": heatmap(sizes),
        "allocation": allocation(parallelism, max_parallelism, sizes),
        **({"event-time": event_time(points)} if any(p.event_time for p in points) else {}),
    }
