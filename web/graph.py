"""Lay out a window of the commit graph in lanes, like ``git log --graph``.

Rows come newest first (a window of the lineage index, never the whole graph). Each lane
waits for one snapshot id: a row takes the first lane waiting for it (lanes that also waited
for it end there, drawn converging into the node), then the lane waits for its first parent;
further parents (merges) take a lane of their own. Lanes keep their place, so lines stay
straight. At most MAX_LANES lanes are drawn: a parent that would need another lane gets a
short stub instead and its own lane when it shows up. Runs of plain epoch commits can be
folded into one row ("compact").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from html import escape

from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from controlplane.lineage.selectors import SnapshotSummary

ROW_H = 28
LANE_W = 16
MAX_LANES = 16
LANE_COLORS = 8
FOLD_MIN = 4  # fold a run of plain epochs when it is at least this long
MARKED_KINDS = ("initial", "rescale", "rollback", "fork", "migration", "savepoint")


@dataclass
class _Step:
    snapshot: SnapshotSummary
    column: int
    before: list[str | None]
    after: list[str | None]
    incoming: list[int]
    parent_lanes: list[int]
    stubs: int  # parents without a lane (over the cap)


@dataclass
class GraphRow:
    """One drawn row: a snapshot, or a fold standing for several plain epoch commits."""

    top: int
    column: int
    snapshot: SnapshotSummary | None
    folded: list[SnapshotSummary] = field(default_factory=list)
    refs: list[str] = field(default_factory=list)
    abandoned: bool = False  # off its branch's current line (e.g. left behind by a rollback)

    @property
    def is_fold(self) -> bool:
        return self.snapshot is None

    @property
    def newest_epoch(self) -> int | None:
        return self.folded[0].epoch if self.folded else None

    @property
    def oldest_epoch(self) -> int | None:
        return self.folded[-1].epoch if self.folded else None


@dataclass(frozen=True)
class GraphLine:
    d: str
    lane: int
    dashed: bool = False
    abandoned: bool = False  # history a rollback left behind: grey, not a branch's colour

    @property
    def color(self) -> int:
        return self.lane % LANE_COLORS


@dataclass(frozen=True)
class GraphNode:
    x: int
    y: int
    kind: str
    snapshot_id: str
    title: str
    lane: int
    tagged: bool
    """A savepoint (any tag but a rollback's `-abandoned` one) points here."""
    abandoned: bool = False

    @property
    def color(self) -> int:
        return self.lane % LANE_COLORS

    @property
    def marked(self) -> bool:
        return self.kind in MARKED_KINDS


@dataclass
class GraphLayout:
    rows: list[GraphRow]
    lines: list[GraphLine]
    nodes: list[GraphNode]
    lanes: int
    row_height: int = ROW_H

    @property
    def width(self) -> int:
        return max(1, self.lanes) * LANE_W + LANE_W // 2

    @property
    def height(self) -> int:
        return max(1, len(self.rows)) * ROW_H + ROW_H // 2


def _x(lane: int) -> int:
    return lane * LANE_W + LANE_W // 2 + 2


def _line(x1: int, y1: int, x2: int, y2: int) -> str:
    if x1 == x2:
        return f"M{x1},{y1}V{y2}"
    ym = (y1 + y2) // 2
    return f"M{x1},{y1}C{x1},{ym} {x2},{ym} {x2},{y2}"


class _Lines:
    """Collects the drawing's lines, merging a lane's touching vertical segments into one
    path (a lane that runs straight through a hundred rows is one line, not a hundred)."""

    def __init__(self) -> None:
        self.lines: list[GraphLine] = []
        # lane -> [x, y_from, y_to, dashed, abandoned]
        self._open: dict[int, list[int]] = {}

    def add(
        self,
        lane: int,
        x1: int,
        y1: int,
        x2: int,
        y2: int,
        dashed: bool = False,
        abandoned: bool = False,
    ) -> None:
        if x1 != x2:
            self.lines.append(GraphLine(_line(x1, y1, x2, y2), lane, dashed, abandoned))
            return
        run = self._open.get(lane)
        if (
            run is not None
            and run[0] == x1
            and run[2] == y1
            and run[3] == dashed
            and run[4] == abandoned
        ):
            run[2] = y2
            return
        self._flush(lane)
        self._open[lane] = [x1, y1, y2, dashed, abandoned]

    def _flush(self, lane: int) -> None:
        run = self._open.pop(lane, None)
        if run is not None:
            x, y1, y2, dashed, abandoned = run
            self.lines.append(GraphLine(f"M{x},{y1}V{y2}", lane, bool(dashed), bool(abandoned)))

    def done(self) -> list[GraphLine]:
        for lane in list(self._open):
            self._flush(lane)
        return self.lines


def _free(lanes: list[str | None]) -> int:
    for i, want in enumerate(lanes):
        if want is None:
            return i
    return len(lanes)


def _steps(snapshots: Sequence[SnapshotSummary]) -> list[_Step]:
    lanes: list[str | None] = []
    steps = []
    for s in snapshots:
        before = list(lanes)
        incoming = [i for i, want in enumerate(lanes) if want == s.snapshot_id]
        column = incoming[0] if incoming else _free(lanes)
        for i in incoming[1:]:
            lanes[i] = None
        owned = column < MAX_LANES
        if owned and column == len(lanes):
            lanes.append(None)
        parent_lanes: list[int] = []
        stubs = 0
        for position, parent in enumerate(s.parent_ids):
            if position == 0 and owned:
                lanes[column] = parent
                parent_lanes.append(column)
                continue
            if parent in lanes:
                parent_lanes.append(lanes.index(parent))
                continue
            slot = _free(lanes)
            if slot >= MAX_LANES:
                stubs += 1
                continue
            if slot == len(lanes):
                lanes.append(None)
            lanes[slot] = parent
            parent_lanes.append(slot)
        if owned and not s.parent_ids:
            lanes[column] = None
        while lanes and lanes[-1] is None:
            lanes.pop()
        steps.append(_Step(s, column, before, list(lanes), incoming, parent_lanes, stubs))
    return steps


def _plain(step: _Step, refs: Mapping[str, list[str]], next_id: str | None) -> bool:
    s = step.snapshot
    return (
        s.kind == "epoch"
        and not refs.get(s.snapshot_id)
        and len(s.parent_ids) == 1
        and s.parent_ids[0] == next_id
        and step.incoming == [step.column]
        and step.parent_lanes == [step.column]
    )


def _title(s: SnapshotSummary, refs: list[str]) -> str:
    lines = [
        f"{s.kind} · epoch {s.epoch} · {s.branch}",
        s.snapshot_id,
        f"parallelism {s.parallelism} of M={s.max_parallelism} · {s.created_at:%Y-%m-%d %H:%M:%S}",
    ]
    if s.code_version:
        lines.append(f"code version {s.code_version}")
    lines += [f"{key}: {value}" for key, value in sorted(s.provenance.items()) if value != ""]
    lines += refs
    return "\n".join(lines)


def _abandoned(snapshots: Sequence[SnapshotSummary], refs: Mapping[str, list[str]]) -> set[str]:
    """Snapshots of the window committed on a branch that its head no longer reaches by first
    parents: the line a rollback left behind still carries the branch's name in its manifests,
    but it is not that branch any more. Only judged where the head's line, walked inside the
    window, reaches at least as far back (by generation); elsewhere unknown and not marked."""
    by_id = {s.snapshot_id: s for s in snapshots}
    lowest: dict[str, int] = {}  # branch -> lowest generation its line reaches in the window
    on_line: set[str] = set()
    for head, names in refs.items():
        for branch in (n.removeprefix("heads/") for n in names if n.startswith("heads/")):
            sid = head
            while sid in by_id and sid not in on_line:
                on_line.add(sid)
                lowest[branch] = min(
                    lowest.get(branch, by_id[sid].generation), by_id[sid].generation
                )
                parents = by_id[sid].parent_ids
                sid = parents[0] if parents else ""
    return {
        s.snapshot_id
        for s in snapshots
        if s.branch in lowest and s.snapshot_id not in on_line and s.generation >= lowest[s.branch]
    }


def layout(
    snapshots: Sequence[SnapshotSummary],
    refs: Mapping[str, list[str]] | None = None,
    *,
    fold: bool = False,
) -> GraphLayout:
    """The drawing of `snapshots` (newest first) with `refs` (snapshot id -> ref names)."""
    refs = refs or {}
    steps = _steps(snapshots)
    abandoned = _abandoned(snapshots, refs)
    # which steps are hidden in a fold: the middle of a run of plain epochs
    hidden = [False] * len(steps)
    if fold:
        i = 0
        while i < len(steps):
            j = i
            while j + 1 < len(steps) and _plain(steps[j], refs, steps[j + 1].snapshot.snapshot_id):
                j += 1
            # steps i..j form a chain where each is the first parent's child of the next
            if j - i + 1 >= FOLD_MIN + 2:
                for k in range(i + 1, j):
                    hidden[k] = True
            i = j + 1

    rows: list[GraphRow] = []
    lines = _Lines()
    nodes: list[GraphNode] = []
    lanes_used = 0
    dim: set[int] = set()  # lanes waiting for a parent of history a rollback left behind
    k = 0
    while k < len(steps):
        step = steps[k]
        top = len(rows) * ROW_H
        mid, bottom = top + ROW_H // 2, top + ROW_H
        if hidden[k]:
            run = []
            while k < len(steps) and hidden[k]:
                run.append(steps[k].snapshot)
                k += 1
            rows.append(GraphRow(top, step.column, None, folded=run))
            for lane, want in enumerate(step.before):
                if want is not None:
                    lines.add(
                        lane, _x(lane), top, _x(lane), bottom, lane == step.column,
                        want in abandoned or lane in dim,
                    )  # fmt: skip
            continue
        s = step.snapshot
        row_refs = sorted(refs.get(s.snapshot_id, []))
        rows.append(
            GraphRow(top, step.column, s, refs=row_refs, abandoned=s.snapshot_id in abandoned)
        )
        x = _x(step.column)
        gone = s.snapshot_id in abandoned
        for lane, want in enumerate(step.before):
            if want is None:
                continue
            if want == s.snapshot_id:
                lines.add(lane, _x(lane), top, x, mid, abandoned=gone or lane in dim)
                dim.discard(lane)
            else:
                dim_lane = want in abandoned or lane in dim
                lines.add(lane, _x(lane), top, _x(lane), bottom, abandoned=dim_lane)
        for lane in step.parent_lanes:
            lines.add(lane, x, mid, _x(lane), bottom, abandoned=gone)
            if gone:
                dim.add(lane)
            else:
                dim.discard(lane)
        if step.stubs:
            lines.add(step.column, x, mid, x + LANE_W // 2, bottom, True)
        nodes.append(
            GraphNode(
                x=x,
                y=mid,
                kind=s.kind,
                snapshot_id=s.snapshot_id,
                title=_title(s, row_refs),
                lane=step.column,
                tagged=any(
                    r.startswith("tags/") and not r.endswith("-abandoned") for r in row_refs
                ),
                abandoned=gone,
            )
        )
        lanes_used = max(lanes_used, step.column + 1, len(step.before), len(step.after))
        k += 1
    if steps:  # lanes that go on below the window
        bottom = len(rows) * ROW_H
        for lane, want in enumerate(steps[-1].after):
            if want is not None:
                lines.add(lane, _x(lane), bottom, _x(lane), bottom + ROW_H // 2, True)
    return GraphLayout(rows, lines.done(), nodes, min(lanes_used, MAX_LANES + 1))


MARKS = mark_safe("""<svg class="marks" width="0" height="0" aria-hidden="true"><defs>
<g id="m-epoch"><circle r="4"/></g>
<g id="m-initial"><circle r="5" class="hollow"/></g>
<g id="m-rescale"><path d="M0,-7L7,0L0,7L-7,0Z"/></g>
<g id="m-rollback"><path d="M-6,5L0,-7L6,5Z"/></g>
<g id="m-fork"><circle r="6"/><circle r="2.5" class="inner"/></g>
<g id="m-migration"><rect x="-5" y="-5" width="10" height="10"/></g>
<g id="m-savepoint"><path d="M0,-7L2,-2L7,-2L3,1L5,7L0,3L-5,7L-3,1L-7,-2L-2,-2Z"/></g>
</defs></svg>""")
"""The node shapes, drawn once per page and used by the graph and its legend."""


def svg(drawing: GraphLayout) -> SafeString:
    """The drawing as one SVG element (built here: thousands of template nodes cost more than
    the queries behind the page). Node titles carry the provenance shown on hover."""
    parts = [
        f'<svg class="graph-svg" width="{drawing.width}" height="{drawing.height}" role="img" '
        f'aria-label="commit graph">',
    ]
    for line in drawing.lines:
        dashed = " dashed" if line.dashed else ""
        color = "abandoned" if line.abandoned else f"lane-{line.color}"
        parts.append(f'<path d="{line.d}" class="lane {color}{dashed}"/>')
    for node in drawing.nodes:
        if node.marked:
            mark = f"kind-{node.kind}"
        else:
            mark = "abandoned" if node.abandoned else f"lane-{node.color}"
        ring = (
            f'<circle cx="{node.x}" cy="{node.y}" r="9" class="tag-ring"/>' if node.tagged else ""
        )
        parts.append(
            f'<g class="node" data-kind="{escape(node.kind)}" data-snapshot="{node.snapshot_id}">'
            f"<title>{escape(node.title)}</title>{ring}"
            f'<use href="#m-{escape(node.kind)}" x="{node.x}" y="{node.y}" '
            f'class="node-mark {mark}"/></g>'
        )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every value above is escaped or a number


def _ago(moment: datetime, now: datetime) -> str:
    from web.templatetags.epochal import seconds_words

    words = seconds_words((now - moment).total_seconds())
    return "just now" if words == "now" else f"{words} ago"


#: how a sink's status reads beside a snapshot (a sign and words, never colour alone)
SINK_LABELS = {
    "written": ("✓", "written", "the destination holds this epoch"),
    "pending": ("…", "pending", "not known to be in the destination yet (it may lag)"),
    "abandoned": ("✗", "abandoned", "off the branch's line after a rollback: the destination "
                  "drops it, or never had it"),
    "abandoned_published": ("!", "abandoned, published", "off the branch's line after a "
                            "rollback; the log had published its records, which stay"),
}  # fmt: skip


def sinks_html(statuses: Mapping[str, str]) -> str:
    """A snapshot's sinks as badges: the sink's name, a sign and the status in words."""
    out = []
    for name, status in statuses.items():
        sign, words, meaning = SINK_LABELS.get(status, ("?", status, status))
        out.append(
            f'<span class="sink sink-{escape(status)}" data-sink="{escape(name)}" '
            f'data-status="{escape(status)}" title="sink {escape(name)}: {escape(meaning)}">'
            f'<span aria-hidden="true">{sign}</span> {escape(name)}: {escape(words)}</span>'
        )
    return f'<span class="sinks">{"".join(out)}</span>' if out else ""


def rows_html(
    drawing: GraphLayout,
    *,
    snapshot_url: str,
    query: str,
    unfold: str,
    selected: str = "",
    sinks: Mapping[str, Mapping[str, str]] | None = None,
) -> SafeString:
    """The list beside the drawing: one row per snapshot (a link that opens it in the side
    panel, its provenance as a tooltip, its sinks' statuses) or per fold. `query` is kept by
    the rows' plain links; `unfold` is the query string of this window without folding."""
    now = timezone.now()
    keep = f"&amp;{escape(query)}" if query else ""
    out = ['<ol class="graph-rows">']
    for row in drawing.rows:
        if row.snapshot is None:
            out.append(
                f'<li class="graph-row fold"><a href="?{escape(unfold)}">⋯ {len(row.folded)} '
                f"plain epochs (epochs {row.oldest_epoch} to {row.newest_epoch}) — unfold</a></li>"
            )
            continue
        s = row.snapshot
        sid = s.snapshot_id
        provenance = s.provenance
        tip = "&#10;".join(
            escape(line)
            for line in [f"{s.kind} · epoch {s.epoch} · {s.branch}"]
            + [f"{k}: {v}" for k, v in provenance.items()]
        )
        kind = f'<span class="kind kind-{escape(s.kind)}">{escape(s.kind)}</span>'
        refs = "".join(
            f'<span class="ref {"ref-head" if ref.startswith("heads/") else "ref-tag"}">'
            f"{escape(ref)}</span>"
            for ref in row.refs
        )
        reason = provenance.get("reason")
        why = f'<span class="small prov">“{escape(str(reason)[:60])}”</span>' if reason else ""
        out.append(
            f'<li class="graph-row{" selected" if sid == selected else ""}" '
            f'data-snapshot="{sid}" data-kind="{escape(s.kind)}">'
            f'<a class="snap" href="?at={sid}{keep}" hx-get="{snapshot_url}{sid}/" '
            f'hx-target="#snapshot-panel" hx-swap="innerHTML" title="{tip}">'
            f'<span class="kcell">{kind if s.kind != "epoch" else ""}</span>'
            f'<span class="epoch">e{s.epoch}</span>'
            + (
                f'<span class="branch-name abandoned" data-testid="abandoned-lane" '
                f'title="committed on {escape(s.branch)}, left behind by a rollback">'
                f"abandoned {escape(s.branch)}</span>"
                if row.abandoned
                else f'<span class="branch-name">{escape(s.branch)}</span>'
            )
            + f'<span class="mono muted">{sid[:10]}</span>{refs}'
            f'<span class="muted small">p={s.parallelism}</span>{why}'
            + sinks_html((sinks or {}).get(sid, {}))
            + f'<span class="muted small when">{_ago(s.created_at, now)}</span></a></li>'
        )
    out.append("</ol>")
    return mark_safe("".join(out))  # every value above is escaped, an id or a number
