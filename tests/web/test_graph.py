"""The lineage graph's lane layout: one lane per line of history, forks and merges drawn
between lanes, lanes bounded, plain epoch runs folded."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from controlplane.lineage.selectors import SnapshotSummary
from web import graph


def snap(
    sid: str, *parents: str, kind: str = "epoch", branch: str = "main", generation: int = 1
) -> SnapshotSummary:
    return SnapshotSummary(
        snapshot_id=sid,
        branch=branch,
        epoch=0,
        kind=kind,
        parallelism=2,
        max_parallelism=8,
        code_version="",
        config_hash="",
        operation_id="",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        generation=generation,
        parent_ids=tuple(parents),
        offsets_json="{}",
        stats_json="{}",
        provenance_json='{"reason": "why"}',
    )


def columns(layout: graph.GraphLayout) -> dict[str, int]:
    return {row.snapshot.snapshot_id: row.column for row in layout.rows if row.snapshot}


def test_a_linear_history_is_one_lane() -> None:
    layout = graph.layout([snap("c", "b"), snap("b", "a"), snap("a", kind="initial")])
    assert set(columns(layout).values()) == {0}
    assert layout.lanes == 1
    assert len(layout.nodes) == 3 and layout.nodes[0].title.splitlines()[-1] == "reason: why"


def test_a_fork_takes_a_second_lane_that_joins_its_source() -> None:
    # newest first: exp's commit, main's commit, the fork commit, then their common parent
    rows = [
        snap("x2", "x1", branch="exp"),
        snap("m2", "m1"),
        snap("x1", "m1", kind="fork", branch="exp"),
        snap("m1", "m0"),
        snap("m0", kind="initial"),
    ]
    layout = graph.layout(rows, {"x2": ["heads/exp"], "m2": ["heads/main"]})
    cols = columns(layout)
    assert cols["x2"] == cols["x1"] == 0 and cols["m2"] == 1 and cols["m1"] == 0
    # the row of m1 receives both lanes: one converging line from lane 1
    assert any("C" in line.d for line in layout.lines)
    assert layout.rows[0].refs == ["heads/exp"]
    assert [n.kind for n in layout.nodes if n.marked] == ["fork", "initial"]


def test_a_parent_outside_the_window_continues_below() -> None:
    layout = graph.layout([snap("b", "a")])
    assert any(line.dashed for line in layout.lines)


def test_lanes_are_bounded() -> None:
    # many branch heads, all waiting for parents outside the window
    rows = [snap(f"h{i}", f"p{i}", branch=f"b{i}") for i in range(graph.MAX_LANES + 10)]
    layout = graph.layout(rows)
    assert layout.lanes <= graph.MAX_LANES + 1
    assert max(columns(layout).values()) <= graph.MAX_LANES
    assert layout.width <= (graph.MAX_LANES + 1) * graph.LANE_W + graph.LANE_W


def test_a_merge_draws_a_line_to_each_parent() -> None:
    layout = graph.layout([snap("m", "a", "b"), snap("b", "r"), snap("a", "r"), snap("r")])
    cols = columns(layout)
    assert cols["m"] == 0 and {cols["a"], cols["b"]} == {0, 1}


def test_runs_of_plain_epochs_fold_into_one_row() -> None:
    ids = [f"s{i}" for i in range(12)]
    rows = [snap(ids[i], ids[i + 1]) for i in range(11)] + [snap(ids[11], kind="initial")]
    folded = graph.layout(rows, fold=True)
    assert len(folded.rows) < len(rows)
    [fold] = [row for row in folded.rows if row.is_fold]
    assert len(fold.folded) == len(rows) - len(folded.rows) + 1
    unfolded = graph.layout(rows)
    assert len(unfolded.rows) == len(rows)


def test_the_line_a_rollback_left_behind_is_not_labelled_as_the_branch() -> None:
    # main: m0 - m1 - m2 - m3, then a rollback to m1: rb (parent m1) is main's head now
    rows = [
        snap("rb", "m1", kind="rollback", generation=2),
        snap("m3", "m2", generation=3),
        snap("m2", "m1", generation=2),
        snap("m1", "m0", generation=1),
        snap("m0", kind="initial", generation=0),
    ]
    refs = {"rb": ["heads/main"], "m3": ["tags/rollback-1-abandoned"]}
    layout = graph.layout(rows, refs)
    assert {r.snapshot.snapshot_id for r in layout.rows if r.abandoned} == {"m3", "m2"}
    html = str(graph.rows_html(layout, snapshot_url="/s/", query="", unfold=""))
    labels = dict(
        re.findall(r'data-snapshot="(\w+)".*?<span class="branch-name[^>]*>([^<]*)<', html)
    )
    assert labels == {
        "rb": "main",
        "m3": "abandoned main",
        "m2": "abandoned main",
        "m1": "main",
        "m0": "main",
    }
    # drawn grey, not in another branch's colour; its -abandoned tag is no savepoint ring
    drawing = str(graph.svg(layout))
    nodes = dict(re.findall(r'data-snapshot="(\w+)">.*?class="node-mark ([^"]+)"', drawing, re.S))
    assert nodes["m3"] == "abandoned" and nodes["m2"] == "abandoned"
    assert nodes["m1"].startswith("lane-") and nodes["rb"] == "kind-rollback"
    assert 'class="tag-ring"' not in drawing
    # m3 -> m2 and m2 -> m1 grey; main's own line (rb -> m1 -> m0) in its lane colour
    assert [line.abandoned for line in layout.lines].count(True) == 2
    assert 'class="lane abandoned' in drawing
    savepoint = graph.layout(rows, {**refs, "m1": ["tags/sp-1"]})
    assert str(graph.svg(savepoint)).count('class="tag-ring"') == 1
    # a head outside the window: nothing is judged
    assert not any(r.abandoned for r in graph.layout(rows[1:], {}).rows)
