"""The job web: jobs as nodes, branch-output edges with alignment state and lag per edge."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from controlplane.operations.webs import web_graph
from web.access import viewer_required
from web.views.base import page

COLUMN_W = 230
ROW_H = 90
NODE_W = 170
NODE_H = 46


def layout(graph: dict[str, Any]) -> dict[str, Any]:
    """Columns by longest path from a source job (the web is a DAG), rows in name order."""
    names = [n["job"] for n in graph["nodes"]]
    ups: dict[str, list[str]] = {n: [] for n in names}
    for edge in graph["edges"]:
        ups.setdefault(edge["downstream"], []).append(edge["upstream"])
    depth: dict[str, int] = {}

    def level(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name not in depth:
            parents = [u for u in ups.get(name, []) if u not in seen]
            depth[name] = 1 + max((level(u, seen | {name}) for u in parents), default=-1)
        return depth[name]

    for name in names:
        level(name)
    rows: dict[int, int] = {}
    places = {}
    for name in names:
        col = depth[name]
        row = rows.get(col, 0)
        rows[col] = row + 1
        places[name] = (20 + col * COLUMN_W, 20 + row * ROW_H)
    nodes = [{**n, "x": places[n["job"]][0], "y": places[n["job"]][1]} for n in graph["nodes"]]
    edges = []
    for e in graph["edges"]:
        (x1, y1), (x2, y2) = places[e["upstream"]], places[e["downstream"]]
        edges.append(
            {
                **e,
                "x1": x1 + NODE_W,
                "y1": y1 + NODE_H // 2,
                "x2": x2,
                "y2": y2 + NODE_H // 2,
                "lx": (x1 + NODE_W + x2) // 2,
                "ly": (y1 + y2) // 2 + NODE_H // 2 - 6,
            }
        )
    width = 40 + (max(depth.values(), default=0) + 1) * COLUMN_W
    height = 40 + max(rows.values(), default=1) * ROW_H
    return {
        "nodes": nodes,
        "edges": edges,
        "width": width,
        "height": height,
        "node_w": NODE_W,
        "node_h": NODE_H,
    }


@viewer_required
def job_web(request: HttpRequest) -> HttpResponse:
    graph = web_graph()
    return page(
        request,
        "web/webs.html",
        {
            "graph": graph,
            "drawing": layout(graph),
            "alarms": [e for e in graph["edges"] if e["lag_alarm"]],
        },
    )
