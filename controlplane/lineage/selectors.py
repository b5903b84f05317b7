"""Reads over the lineage index: log, ancestors, is-ancestor, merge base, graph page, refs.

How they stay fast (see docs/lineage.md): the history of a snapshot at (chain c, generation g)
is a few ranges "chain c', generation <= g'" found by one recursive walk over `ChainEdge`
rows (thousands of rows where snapshots number millions); pages are then read from the
(chain, generation) index, newest first, with the limit pushed into every range.

Orders are deterministic. Full log and ancestors: generation descending, then snapshot id
ascending (a topological order: every child before its parents). First-parent log: the
first-parent chain from the start. Graph page: most recently indexed first. Where one
snapshot must be picked among equals (merge base), the newest `created_at` wins, ties going
to the smaller id — as in `snapshots_store`.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from django.db import connection

from controlplane.applications.models import Application
from controlplane.lineage.errors import InvalidCursorError, UnknownRevisionError
from controlplane.lineage.models import (
    Branch,
    Chain,
    ChainEdge,
    ReflogEntry,
    Snapshot,
    SnapshotParent,
    Tag,
)

MAX_PAGE = 1000
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CURSOR = re.compile(r"(\d+):([0-9a-f]{64})")
_UNION_TERMS = 200  # SQLite allows at most 500 terms in one compound SELECT


@dataclass(frozen=True)
class Point:
    """Where a snapshot sits in the index."""

    pk: int
    snapshot_id: str
    chain: int
    generation: int


@dataclass(frozen=True)
class LogPage:
    """Snapshots (each with `.parent_ids`, parents in order) and the cursor of the next page."""

    snapshots: list[Snapshot]
    next_cursor: str | None


@dataclass(frozen=True)
class AncestorPage:
    snapshot_ids: list[str]
    next_cursor: str | None


@dataclass(frozen=True)
class GraphEdge:
    child: str
    parent: str
    position: int


@dataclass(frozen=True)
class GraphPage:
    """A window of recently indexed snapshots across branches, for drawing the graph.

    `edges` are the parent links of the window's snapshots (parents may lie outside the
    window); `refs` maps snapshot id -> branch and tag names pointing at it.
    """

    snapshots: list[Snapshot]
    edges: list[GraphEdge]
    refs: dict[str, list[str]]
    next_cursor: str | None


# -- single snapshots -----------------------------------------------------------------------


def snapshot_get(*, application: Application, rev: str) -> Snapshot:
    """The snapshot `rev` names: a 64-hex id, ``heads/x``, ``tags/y``, or a bare branch
    then tag name. UnknownRevisionError otherwise."""
    return Snapshot.objects.get(pk=_resolve(application, rev).pk)


def _resolve(application: Application, rev: str) -> Point:
    fields = ("id", "snapshot_id", "chain", "generation")
    row = None
    if isinstance(rev, str) and _HEX64.fullmatch(rev):
        row = (
            Snapshot.objects.filter(application=application, snapshot_id=rev)
            .values_list(*fields)
            .first()
        )
    elif isinstance(rev, str) and rev:
        candidates: list[tuple[type[Branch] | type[Tag], str]] = []
        if rev.startswith("heads/"):
            candidates = [(Branch, rev.removeprefix("heads/"))]
        elif rev.startswith("tags/"):
            candidates = [(Tag, rev.removeprefix("tags/"))]
        else:
            candidates = [(Branch, rev), (Tag, rev)]
        for model, name in candidates:
            field = "head" if model is Branch else "target"
            row = (
                model.objects.filter(
                    application=application, name=name, **{f"{field}__isnull": False}
                )
                .values_list(*(f"{field}__{f}" for f in fields))
                .first()
            )
            if row is not None:
                break
    if row is None:
        raise UnknownRevisionError(application.name, str(rev))
    return Point(*row)


# -- history --------------------------------------------------------------------------------


def snapshot_log(
    *,
    application: Application,
    rev: str,
    first_parent: bool = False,
    limit: int = 100,
    cursor: str | None = None,
) -> LogPage:
    """History of `rev`, newest first, `limit` at a time; pass `next_cursor` back for more."""
    limit = _check_limit(limit)
    start = _resolve(application, rev)
    after = _parse_cursor(cursor)
    if first_parent:
        pks = _first_parent_pks(start, limit + 1, after)
    else:
        pks = [pk for pk, _, _ in _ancestor_rows(start, limit + 1, after)]
    more = len(pks) > limit
    pks = pks[:limit]
    by_pk = Snapshot.objects.in_bulk(pks)
    snapshots = [by_pk[pk] for pk in pks]
    parents: dict[int, list[str]] = {pk: [] for pk in pks}
    links = (
        SnapshotParent.objects.filter(child_id__in=pks)
        .order_by("child_id", "position")
        .values_list("child_id", "parent__snapshot_id")
    )
    for child, parent in links:
        parents[child].append(parent)
    for snapshot in snapshots:
        snapshot.parent_ids = parents[snapshot.pk]  # type: ignore[attr-defined]
    next_cursor = None
    if more and snapshots:
        tail = snapshots[-1]
        next_cursor = f"{tail.generation}:{tail.snapshot_id}"
    return LogPage(snapshots, next_cursor)


def snapshot_ancestors(
    *, application: Application, rev: str, limit: int = MAX_PAGE, cursor: str | None = None
) -> AncestorPage:
    """Ids of every snapshot in the history of `rev` (itself included), a page at a time,
    in topological order (generation descending, then id)."""
    limit = _check_limit(limit)
    rows = _ancestor_rows(_resolve(application, rev), limit + 1, _parse_cursor(cursor))
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = f"{rows[-1][1]}:{rows[-1][2]}" if more and rows else None
    return AncestorPage([sid for _, _, sid in rows], next_cursor)


def snapshot_is_ancestor(*, application: Application, ancestor: str, descendant: str) -> bool:
    """True when `ancestor` is in the history of `descendant` (a snapshot is its own)."""
    a = _resolve(application, ancestor)
    b = _resolve(application, descendant)
    if a.chain == b.chain:
        return a.generation <= b.generation
    if a.generation >= b.generation:
        return False
    reach = _reach([b], floor=a.generation)[0]
    return reach.get(a.chain, 0) >= a.generation


def snapshot_merge_bases(*, application: Application, a: str, b: str) -> list[Snapshot]:
    """The best common ancestors of `a` and `b` (none an ancestor of another), newest first."""
    pa, pb = _resolve(application, a), _resolve(application, b)
    reach_a, reach_b = _reach([pa, pb])
    common = {c: min(g, reach_b[c]) for c, g in reach_a.items() if c in reach_b}
    if not common:
        return []
    best = _undominated(common)
    rows = _points_at(best)
    snapshots = list(Snapshot.objects.filter(pk__in=[p.pk for p in rows]))
    snapshots.sort(key=lambda s: (-s.created_at.timestamp(), s.snapshot_id))
    return snapshots


def snapshot_merge_base(*, application: Application, a: str, b: str) -> Snapshot | None:
    """The newest best common ancestor of `a` and `b`; None when their histories are disjoint."""
    bases = snapshot_merge_bases(application=application, a=a, b=b)
    return bases[0] if bases else None


# -- graph page and refs --------------------------------------------------------------------


def lineage_graph_page(
    *, application: Application, limit: int = 200, cursor: str | None = None
) -> GraphPage:
    """The `limit` most recently indexed snapshots (before `cursor`) with their parent edges
    and the branches and tags that point at them."""
    limit = _check_limit(limit)
    query = Snapshot.objects.filter(application=application).order_by("-id")
    if cursor is not None:
        if not cursor.isdigit():
            raise InvalidCursorError(cursor)
        query = query.filter(id__lt=int(cursor))
    snapshots = list(query[: limit + 1])
    more = len(snapshots) > limit
    snapshots = snapshots[:limit]
    pks = [s.pk for s in snapshots]
    by_pk = {s.pk: s.snapshot_id for s in snapshots}
    edges = [
        GraphEdge(by_pk[child], parent, position)
        for child, parent, position in SnapshotParent.objects.filter(child_id__in=pks)
        .order_by("child_id", "position")
        .values_list("child_id", "parent__snapshot_id", "position")
    ]
    refs: dict[str, list[str]] = {}
    for name, sid in Branch.objects.filter(application=application, head_id__in=pks).values_list(
        "name", "head__snapshot_id"
    ):
        refs.setdefault(sid, []).append(f"heads/{name}")
    for name, sid in Tag.objects.filter(application=application, target_id__in=pks).values_list(
        "name", "target__snapshot_id"
    ):
        refs.setdefault(sid, []).append(f"tags/{name}")
    return GraphPage(snapshots, edges, refs, str(pks[-1]) if more and pks else None)


def branch_list(*, application: Application, include_deleted: bool = False) -> list[Branch]:
    query = Branch.objects.filter(application=application).select_related("head")
    if not include_deleted:
        query = query.filter(head__isnull=False)
    return list(query.order_by("name"))


def tag_list(*, application: Application, include_deleted: bool = False) -> list[Tag]:
    query = Tag.objects.filter(application=application).select_related("target")
    if not include_deleted:
        query = query.filter(target__isnull=False)
    return list(query.order_by("name"))


def reflog_list(
    *, application: Application, ref: str, limit: int = 100, before_seq: int | None = None
) -> list[ReflogEntry]:
    """Moves of `ref` (``heads/x`` / ``tags/y``), newest first; `before_seq` pages back."""
    limit = _check_limit(limit)
    query = ReflogEntry.objects.filter(application=application, ref=ref)
    if before_seq is not None:
        query = query.filter(seq__lt=before_seq)
    entries = list(query.order_by("-seq")[:limit])
    if not entries and before_seq is None and not query.exists():
        raise UnknownRevisionError(application.name, ref, "no reflog is indexed for this ref")
    return entries


# -- the machinery --------------------------------------------------------------------------


def _check_limit(limit: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be an integer from 1 to {MAX_PAGE}, not {limit!r}")
    return limit


def _parse_cursor(cursor: str | None) -> tuple[int, str] | None:
    if cursor is None:
        return None
    match = _CURSOR.fullmatch(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise InvalidCursorError(str(cursor))
    return int(match.group(1)), match.group(2)


def _reach(starts: Sequence[Point], floor: int = 0) -> list[dict[int, int]]:
    """For each start, chain -> highest generation of that chain in its history.

    One recursive query over chain edges; `floor` prunes edges into generations below it
    (a snapshot of generation g has no ancestor of generation >= g).
    """
    edge = ChainEdge._meta.db_table
    seeds = " UNION ALL ".join(
        "SELECT CAST(%s AS INTEGER), CAST(%s AS BIGINT), CAST(%s AS BIGINT)" for _ in starts
    )
    sql = f"""
        WITH RECURSIVE reach(side, chain_id, generation) AS (
            {seeds}
            UNION
            SELECT r.side, e.to_chain_id, e.to_generation
            FROM reach r JOIN {edge} e
              ON e.from_chain_id = r.chain_id AND e.from_generation <= r.generation
            WHERE e.to_generation >= %s
        )
        SELECT side, chain_id, MAX(generation) FROM reach GROUP BY side, chain_id
    """
    params: list[int] = []
    for side, point in enumerate(starts):
        params += [side, point.chain, point.generation]
    result: list[dict[int, int]] = [{} for _ in starts]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, floor])
        for side, chain, generation in cursor.fetchall():
            result[side][chain] = generation
    return result


def _ancestor_rows(
    start: Point, limit: int, after: tuple[int, str] | None
) -> list[tuple[int, int, str]]:
    """(pk, generation, snapshot id) of the first `limit` ancestors of `start` after `after`,
    ordered by generation descending then id: one index range per chain of its history."""
    reach = _reach([start])[0]
    ranges = sorted(reach.items(), key=lambda item: -item[1])
    table = Snapshot._meta.db_table
    term = (
        f"SELECT * FROM (SELECT id, generation, snapshot_id FROM {table} "
        "WHERE chain_id = %s AND generation <= %s{extra} "
        "ORDER BY generation DESC LIMIT %s) AS q{n}"
    )
    found: list[tuple[int, int, str]] = []
    for offset in range(0, len(ranges), _UNION_TERMS):
        terms, params = [], []
        for n, (chain, top) in enumerate(ranges[offset : offset + _UNION_TERMS]):
            extra = ""
            params += [chain, top]
            if after is not None:
                extra = " AND (generation < %s OR (generation = %s AND snapshot_id > %s))"
                params += [after[0], after[0], after[1]]
            params.append(limit)
            terms.append(term.format(extra=extra, n=n))
        sql = " UNION ALL ".join(terms) + " ORDER BY 2 DESC, 3 LIMIT %s"
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, limit])
            found.extend(cursor.fetchall())
    found.sort(key=lambda row: (-row[1], row[2]))
    return found[:limit]


def _first_parent_pks(start: Point, limit: int, after: tuple[int, str] | None) -> list[int]:
    """pks along the first-parent chain of `start` (below `after`), a chain segment at a time.

    Segments come newest first and each lies wholly below the previous one in generation.
    """
    table = Snapshot._meta.db_table
    pks: list[int] = []
    with connection.cursor() as cursor:
        for chain, generation, root in _first_parent_path(start):
            top = generation if after is None else min(generation, after[0] - 1)
            if top < root:
                continue
            cursor.execute(
                f"SELECT id FROM {table} WHERE chain_id = %s AND generation <= %s "
                "ORDER BY generation DESC LIMIT %s",
                [chain, top, limit - len(pks)],
            )
            pks.extend(row[0] for row in cursor.fetchall())
            if len(pks) >= limit:
                break
    return pks


def _first_parent_path(start: Point) -> list[tuple[int, int, int]]:
    """(chain, top generation, root generation) segments of the first-parent chain of
    `start`, newest first."""
    edge = ChainEdge._meta.db_table
    chain = Chain._meta.db_table
    sql = f"""
        WITH RECURSIVE path(depth, chain_id, generation) AS (
            SELECT 0, CAST(%s AS BIGINT), CAST(%s AS BIGINT)
            UNION ALL
            SELECT p.depth + 1, e.to_chain_id, e.to_generation
            FROM path p JOIN {edge} e ON e.from_chain_id = p.chain_id AND e.first_parent
        )
        SELECT p.chain_id, p.generation, c.root_generation
        FROM path p JOIN {chain} c ON c.id = p.chain_id ORDER BY p.depth
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [start.chain, start.generation])
        return [(c, g, root) for c, g, root in cursor.fetchall()]


def _undominated(common: Mapping[int, int]) -> list[tuple[int, int]]:
    """The (chain, generation) tops of the common history that are not ancestors of another.

    Each top's own reach is computed over the edges of the common chains only (its history
    lies inside the common history), in memory.
    """
    edges: dict[int, list[tuple[int, int, int]]] = {}
    rows = ChainEdge.objects.filter(from_chain_id__in=list(common)).values_list(
        "from_chain_id", "from_generation", "to_chain_id", "to_generation"
    )
    for from_chain, from_gen, to_chain, to_gen in rows:
        edges.setdefault(from_chain, []).append((from_gen, to_chain, to_gen))
    tops = list(common.items())
    dominated: set[tuple[int, int]] = set()
    for top in tops:
        reach = _reach_in_memory(top, edges)
        for other in tops:
            if other != top and other not in dominated and reach.get(other[0], 0) >= other[1]:
                dominated.add(other)
    return [top for top in tops if top not in dominated]


def _reach_in_memory(
    start: tuple[int, int], edges: Mapping[int, list[tuple[int, int, int]]]
) -> dict[int, int]:
    reach: dict[int, int] = {}
    queue = [(-start[1], start[0])]
    while queue:
        neg_gen, chain = heapq.heappop(queue)
        if reach.get(chain, 0) >= -neg_gen:
            continue
        reach[chain] = -neg_gen
        for from_gen, to_chain, to_gen in edges.get(chain, ()):
            if from_gen <= -neg_gen and reach.get(to_chain, 0) < to_gen:
                heapq.heappush(queue, (-to_gen, to_chain))
    return reach


def _points_at(places: Iterable[tuple[int, int]]) -> list[Point]:
    query = Snapshot.objects.none()
    for chain, generation in places:
        query = query | Snapshot.objects.filter(chain_id=chain, generation=generation)
    return [Point(*row) for row in query.values_list("pk", "snapshot_id", "chain_id", "generation")]
