"""Whether each sink's destination holds a snapshot's epoch, from what the index recorded.

No destination is asked: the answer comes from the manifests' sink records and lag
(`controlplane.lineage.sink_facts`, kept in `Snapshot.sinks`) and from the branch's
first-parent chain (see docs/sinks.md, *What the lineage view shows*). For a snapshot `x`
judged against branch `b` (its own branch, or the branch whose history is shown):

* off the first-parent chain of `b`'s head, committed on `b` (a rollback left it behind):
  ``abandoned`` — a chain sink drops it when the job next writes, Iceberg at its next epoch —
  or, for a log sink that had published it, ``abandoned_published``: its records stay;
* a chain sink (Delta Lake, PostgreSQL): ``written`` when the newest commit of the chain that
  records the sink's lag shows the destination at or past `x`'s epoch (`held` >= epoch), else
  ``pending``;
* a log or two-phase sink (Kafka, Redis/RabbitMQ Streams, Iceberg), only on snapshots that
  staged an epoch for it: when the newest commit of the chain recording the sink's own lag
  says (Iceberg and the Streams sinks follow the branch on the catch-up driver), by the same
  rule as a chain sink; else (Kafka, and commits written before those sinks followed the
  branch) ``written`` once a child of `x` was committed by a run with the sink (such a run
  commits the next epoch only after the previous one's second phase finished, in the same
  process or when it restarts), else ``pending``.

Reads: one statement for the snapshots, and one per branch judged (its first-parent path, the
sink facts of its newest `WITNESSES` generations and, in the first, the facts of the
snapshots' children); never one per row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from django.db import connection

from controlplane.applications.models import Application
from controlplane.lineage.errors import UnknownRevisionError
from controlplane.lineage.models import Chain, Snapshot
from controlplane.lineage.selectors import _edges_of, _seed

_SNAPSHOT = Snapshot._meta.db_table
_CHAIN = Chain._meta.db_table
#: the sinks column as text on both databases (PostgreSQL's jsonb, SQLite's text)
_FACTS = "CAST(sinks AS TEXT)"

WRITTEN: Final = "written"
PENDING: Final = "pending"
ABANDONED: Final = "abandoned"
ABANDONED_PUBLISHED: Final = "abandoned_published"
STATUSES: Final = (WRITTEN, PENDING, ABANDONED, ABANDONED_PUBLISHED)
#: the newest commits of a branch's chain read for the sinks' lag (older ones prove less)
WITNESSES: Final = 200
#: branches judged at most per call (the graph of every branch shows rows of many)
MAX_BRANCHES: Final = 12


@dataclass(frozen=True)
class SinkStatuses:
    """`names`: the sinks shown, in order; `by_snapshot`: snapshot id -> sink -> status (a
    sink without a part in a snapshot is left out: epoch 0, or a log sink's epoch staged
    before the sink was added)."""

    names: tuple[str, ...] = ()
    by_snapshot: dict[str, dict[str, str]] = field(default_factory=dict)

    def of(self, snapshot_id: str) -> dict[str, str]:
        return self.by_snapshot.get(snapshot_id, {})


class _Unjudged(Exception):
    """A branch whose head no revision names."""


@dataclass(frozen=True)
class _Row:
    pk: int
    snapshot_id: str
    branch: str
    epoch: int
    chain: int
    generation: int
    sinks: dict[str, dict[str, Any]]


@dataclass
class _Branch:
    segments: list[tuple[int, int, int]]  # (chain, top generation, root generation)
    held: dict[str, int]  # sink -> newest chain epoch its destination is known to hold
    roles: dict[str, str]  # sink -> role, for the sinks the branch's newest runs name

    def on_chain(self, row: _Row) -> bool:
        return any(
            c == row.chain and root <= row.generation <= top for c, top, root in self.segments
        )


def _facts(value: Any) -> dict[str, dict[str, Any]]:
    data = json.loads(value) if isinstance(value, str | bytes) else value
    return {str(k): v for k, v in (data or {}).items() if isinstance(v, Mapping)}


def _read(
    application: Application, name: str, children_of: Sequence[int] = ()
) -> tuple[_Branch | None, set[tuple[int, str]]]:
    """In one statement: the first-parent path of branch `name`'s head, the sink facts of its
    newest WITNESSES generations, and those of the children of the snapshots `children_of`
    (pks). (None: no such branch; the (parent pk, sink) pairs the children staged.)"""
    try:
        seed, params = _seed(application, f"heads/{name}")
    except UnknownRevisionError:  # a branch name no revision can spell: judged by none
        raise _Unjudged from None
    edges = _edges_of("p", "e.first_parent")
    kids = ""
    if children_of:
        marks = ", ".join(["%s"] * len(children_of))
        kids = (
            f" UNION ALL SELECT 2, first_parent_id, 0, 0, {_FACTS} FROM {_SNAPSHOT} "
            f"WHERE first_parent_id IN ({marks})"
        )
    sql = f"""
        WITH RECURSIVE path(depth, chain_id, generation) AS (
            SELECT 0, chain_id, generation FROM ({seed}) AS start
            UNION ALL
            SELECT p.depth + 1, e.to_chain_id, e.to_generation FROM path p {edges}
        ),
        segment(depth, chain_id, top, root) AS (
            SELECT p.depth, p.chain_id, p.generation, c.root_generation
            FROM path p JOIN {_CHAIN} c ON c.id = p.chain_id
        )
        SELECT 0, depth, chain_id, top, CAST(root AS TEXT) FROM segment
        UNION ALL
        SELECT 1, s.depth, w.generation, 0, {_FACTS} FROM {_SNAPSHOT} w JOIN segment s
            ON w.chain_id = s.chain_id AND w.generation <= s.top AND w.generation >= s.root
            AND w.generation > (SELECT top FROM segment WHERE depth = 0) - %s{kids}
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, WITNESSES, *children_of])
        rows = cursor.fetchall()
    segments = sorted((r[1], r[2], r[3], int(r[4])) for r in rows if r[0] == 0)
    staged = {(int(r[1]), sink) for r in rows if r[0] == 2 for sink in _facts(r[4])}
    if not segments:
        return None, staged
    held: dict[str, int] = {}
    roles: dict[str, str] = {}
    # newest first: the newest commit that says what a sink's destination held decides
    # (an older one may name epochs the destination lost since: a restart that could not
    # reach it, a table replaced); a later commit's record is never overruled by an older one
    for r in sorted((r for r in rows if r[0] == 1), key=lambda r: (r[1], -r[2])):
        for sink, fact in _facts(r[4]).items():
            roles.setdefault(sink, str(fact.get("role", "two_phase")))
            h = fact.get("held")
            if isinstance(h, int):
                held.setdefault(sink, h)
    return _Branch([(c, top, root) for _, c, top, root in segments], held, roles), staged


def _roles(row: _Row, view: _Branch | None) -> dict[str, str]:
    """The sinks a row is judged for: those its branch's newest runs name, and its own."""
    found = dict(view.roles) if view is not None else {}
    for sink, fact in row.sinks.items():
        found.setdefault(sink, str(fact.get("role", "two_phase")))
    return dict(sorted(found.items()))


def _status(
    row: _Row, sink: str, role: str, branch: str, view: _Branch, staged: set[tuple[int, str]]
) -> str | None:
    if row.epoch < 1:
        return None
    own = sink in row.sinks
    if role != "chain" and not own:
        return None  # a log or two-phase sink publishes only the epochs it staged
    if not view.on_chain(row):
        if row.branch != branch:
            return None  # another branch's history (a merge parent): not this job's output
        published = role == "log" and (row.pk, sink) in staged
        return ABANDONED_PUBLISHED if published else ABANDONED
    if role == "chain":
        if sink not in view.roles:
            return None  # no newest commit names it (the version dropped it): unknown
        return WRITTEN if row.epoch <= view.held.get(sink, -1) else PENDING
    if sink in view.held:  # followed by the catch-up driver: a child proves nothing
        return WRITTEN if row.epoch <= view.held[sink] else PENDING
    return WRITTEN if (row.pk, sink) in staged else PENDING


def sink_statuses(
    *, application: Application, snapshot_ids: Iterable[str], branch: str | None = None
) -> SinkStatuses:
    """Each snapshot's sinks' statuses, judged against `branch` (None: each snapshot's own
    branch; at most MAX_BRANCHES of them, the others' snapshots get none)."""
    ids = list(dict.fromkeys(snapshot_ids))
    if not ids:
        return SinkStatuses()
    rows = [
        _Row(pk, sid, b, epoch, chain, generation, _facts(sinks))
        for pk, sid, b, epoch, chain, generation, sinks in Snapshot.objects.filter(
            application=application, snapshot_id__in=ids
        ).values_list("pk", "snapshot_id", "branch", "epoch", "chain_id", "generation", "sinks")
    ]
    return _judge(application, rows, branch)


def snapshot_sinks(*, application: Application, snapshot: Snapshot) -> dict[str, str]:
    """One snapshot's sinks' statuses, judged against its own branch (one statement)."""
    row = _Row(
        snapshot.pk,
        snapshot.snapshot_id,
        snapshot.branch,
        snapshot.epoch,
        snapshot.chain_id,
        snapshot.generation,
        _facts(snapshot.sinks),
    )
    return _judge(application, [row], None).of(snapshot.snapshot_id)


def _judge(application: Application, rows: Sequence[_Row], branch: str | None) -> SinkStatuses:
    if not rows:
        return SinkStatuses()
    judged = [branch] if branch else list(dict.fromkeys(r.branch for r in rows))[:MAX_BRANCHES]
    views: dict[str, _Branch] = {}
    staged: set[tuple[int, str]] = set()
    children: Sequence[int] = [r.pk for r in rows]  # read with the first branch's statement
    for name in judged:
        try:
            view, kids = _read(application, name, children)
        except _Unjudged:
            continue
        staged |= kids
        children = ()
        if view is not None:
            views[name] = view
    by_snapshot: dict[str, dict[str, str]] = {}
    for row in rows:
        against = branch or row.branch
        view = views.get(against)
        if view is None:
            continue
        found = {}
        for sink, role in _roles(row, view).items():
            status = _status(row, sink, role, against, view, staged)
            if status is not None:
                found[sink] = status
        if found:
            by_snapshot[row.snapshot_id] = found
    shown = sorted({s for statuses in by_snapshot.values() for s in statuses})
    return SinkStatuses(tuple(shown), by_snapshot)


__all__ = [
    "ABANDONED",
    "ABANDONED_PUBLISHED",
    "PENDING",
    "STATUSES",
    "WRITTEN",
    "SinkStatuses",
    "sink_statuses",
    "snapshot_sinks",
]
