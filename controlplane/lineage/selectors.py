"""Reads over the lineage index: log, ancestors, is-ancestor, merge base, graph page, refs.

How they stay fast (see docs/lineage.md): the history of a snapshot at (chain c, generation g)
is a few ranges "chain c', generation <= g'" found by one recursive walk over `ChainEdge`
rows (thousands of rows where snapshots number millions); pages are then read from the
(chain, generation) index, newest first, with the page limit pushed into every range. The hot
paths use a few hand-written SQL statements valid on PostgreSQL and SQLite alike.

Orders are deterministic. Full log and ancestors: generation descending, then snapshot id
ascending (a topological order: every child before its parents). First-parent log: the
first-parent chain from the start. Graph page: most recently indexed first. Where one
snapshot must be picked among equals (merge base), the newest `created_at` wins, ties going
to the smaller id — as in `snapshots_store`.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from django.db import connection
from django.db.models import Count
from django.db.models.expressions import RawSQL
from django.utils.dateparse import parse_datetime

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
from controlplane.lineage.revision_sql import revision_sql
from snapshots_store.errors import InvalidRevisionError
from snapshots_store.revisions import parse_revision

MAX_PAGE = 1000
_CURSOR = re.compile(r"(\d+):([0-9a-f]{64})")
_FIRST_BATCH = 4  # chains read by the first statement of a page; doubled for each next one
_UNION_TERMS = 64  # at most this many per statement (SQLite allows 500 compound terms)

_SNAPSHOT = Snapshot._meta.db_table
_CHAIN = Chain._meta.db_table
_EDGE = ChainEdge._meta.db_table
_BRANCH = Branch._meta.db_table
_TAG = Tag._meta.db_table
_SUMMARY_NAMES = [
    "id",
    "snapshot_id",
    "branch",
    "epoch",
    "kind",
    "parallelism",
    "max_parallelism",
    "code_version",
    "config_hash",
    "operation_id",
    "created_at",
    "generation",
    "parent_ids",
    "offsets",
    "stats",
    "provenance",
]
# PostgreSQL: `created_at` as ISO text in UTC. Django's time-zone handling makes psycopg parse
# timestamps in Python (~15 us each); a page of 100 summaries parses them with
# `datetime.fromisoformat` instead (`_datetime`). SQLite stores the same text already.
_CREATED_TEXT = "to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"


def summary_columns(alias: str = "") -> str:
    """The columns `summary_of_row` reads (of the snapshot table aliased `alias`, for
    statements that join a snapshot's summary to other rows)."""
    prefix = f"{alias}." if alias else ""
    columns = []
    for name in _SUMMARY_NAMES:
        column = f"{prefix}{name}"
        if name == "created_at" and connection.vendor == "postgresql":
            column = _CREATED_TEXT.format(column=column) + " AS created_at"
        columns.append(column)
    return ", ".join(columns)


@dataclass(frozen=True)
class SnapshotSummary:
    """What a history listing shows of one snapshot (the full row is `snapshot_get`).

    `offsets`, `stats` and `provenance` are decoded from their JSON on first access: a log
    page rarely shows them all, and decoding hundreds of them is most of a page's CPU.
    """

    snapshot_id: str
    branch: str
    epoch: int
    kind: str
    parallelism: int
    max_parallelism: int
    code_version: str
    config_hash: str
    operation_id: str
    created_at: datetime
    generation: int
    parent_ids: tuple[str, ...]
    offsets_json: Any = field(repr=False, compare=False)
    stats_json: Any = field(repr=False, compare=False)
    provenance_json: Any = field(repr=False, compare=False)

    @cached_property
    def offsets(self) -> dict[str, dict[str, int]]:
        return _json(self.offsets_json)  # type: ignore[no-any-return]

    @cached_property
    def stats(self) -> dict[str, int | float]:
        return _json(self.stats_json)  # type: ignore[no-any-return]

    @cached_property
    def provenance(self) -> dict[str, str]:
        return _json(self.provenance_json)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class LogPage:
    snapshots: list[SnapshotSummary]
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
    window); `refs` maps snapshot id -> ``heads/…`` and ``tags/…`` names pointing at it.
    """

    snapshots: list[SnapshotSummary]
    edges: list[GraphEdge]
    refs: dict[str, list[str]]
    next_cursor: str | None


@dataclass(frozen=True)
class _Point:
    """Where a snapshot sits in the index."""

    pk: int
    snapshot_id: str
    chain: int
    generation: int


# -- single snapshots -----------------------------------------------------------------------


def snapshot_get(*, application: Application, rev: str, with_application: bool = False) -> Snapshot:
    """The snapshot `rev` names (a revision: `snapshots_store.revisions`).
    UnknownRevisionError otherwise. One statement (`with_application`: the application's
    full row joined, for a caller that holds only its id)."""
    sql, params = _point_sql(application, rev)
    query = Snapshot.objects.filter(pk=RawSQL(f"SELECT id FROM ({sql}) AS point", params))
    if with_application:
        query = query.select_related("application")
    found = query.first()
    if found is None:
        raise UnknownRevisionError(application.name, rev)
    return found


_Seed = tuple[str, list[Any]]  # SQL selecting at most one (chain_id, generation) row, params


def _point_sql(application: Application, rev: str) -> _Seed:
    """SQL selecting (id, snapshot_id, chain_id, generation) of the snapshot `rev` names
    (no row when it names none): a revision as `Repository.resolve` reads it, compiled by
    `revision_sql`."""
    try:
        parsed = parse_revision(rev)
    except InvalidRevisionError as exc:
        raise UnknownRevisionError(application.name, str(rev)[:100], exc.detail) from None
    return revision_sql(application.pk, parsed)


def _resolve(application: Application, *revs: str) -> list[_Point]:
    """The points `revs` name, in one statement; UnknownRevisionError for the first unknown."""
    queries = [_point_sql(application, rev) for rev in revs]
    sql = " UNION ALL ".join(
        f"SELECT {k} AS k, id, snapshot_id, chain_id, generation FROM ({q}) AS p{k}"
        for k, (q, _) in enumerate(queries)
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [p for _, params in queries for p in params])
        found = {row[0]: _Point(*row[1:]) for row in cursor.fetchall()}
    for k, rev in enumerate(revs):
        if k not in found:
            raise UnknownRevisionError(application.name, rev)
    return [found[k] for k in range(len(revs))]


def _seed(application: Application, rev: str) -> _Seed:
    """Seed a walk at the snapshot `rev` names, resolving it inside the walk's statement."""
    sql, params = _point_sql(application, rev)
    return f"SELECT chain_id, generation FROM ({sql}) AS point", params


def _seed_at(point: _Point) -> _Seed:
    return (
        "SELECT CAST(%s AS BIGINT) AS chain_id, CAST(%s AS BIGINT) AS generation",
        [point.chain, point.generation],
    )


# -- history --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogStart:
    """Where a log begins: `version` names the snapshot the revision resolved to (its chain
    and generation), so a branch's log changes exactly when its head moves."""

    first_parent: bool
    version: str
    reach: Mapping[int, int] = field(default_factory=dict)
    path: Sequence[tuple[int, int, int]] = ()


def snapshot_log_start(*, application: Application, rev: str, first_parent: bool) -> LogStart:
    """Resolve `rev` and walk the chain graph (one statement); pages come from
    `snapshot_log_page`."""
    if first_parent:
        path = _first_parent_path(application, rev)
        return LogStart(True, f"{path[0][0]}.{path[0][1]}", path=path)
    reach = _reach_of(application, rev)
    chain, top = max(reach.items(), key=lambda item: item[1])  # the start outranks its history
    return LogStart(False, f"{chain}.{top}", reach=reach)


def snapshot_log_page(start: LogStart, *, limit: int = 100, cursor: str | None = None) -> LogPage:
    """A page of the log `start` began, newest first; pass `next_cursor` back for more."""
    limit = _check_limit(limit)
    after = _parse_cursor(cursor)
    if start.first_parent:
        rows = _first_parent_rows(start.path, limit + 1, after)
    else:
        found = _ancestor_rows(start.reach, limit + 1, after, summaries=True)
        rows = [_summary(row[3:]) for row in found]
    more = len(rows) > limit
    snapshots = rows[:limit]
    tail = snapshots[-1] if snapshots else None
    next_cursor = f"{tail.generation}:{tail.snapshot_id}" if more and tail else None
    return LogPage(snapshots, next_cursor)


@dataclass(frozen=True)
class LogPageJson:
    """A `LogPage` with each snapshot as (id, JSON text of its summary's members after
    `url`, built by PostgreSQL: `snapshot_summaries_json` completes them)."""

    rows: list[tuple[str, str]]
    next_cursor: str | None


def snapshot_log_page_json(
    start: LogStart, *, limit: int = 100, cursor: str | None = None
) -> LogPageJson | None:
    """`snapshot_log_page` with the summaries as JSON text built by the same statements
    (None on databases other than PostgreSQL: the caller renders `snapshot_log_page`)."""
    if connection.vendor != "postgresql":
        return None
    limit = _check_limit(limit)
    after = _parse_cursor(cursor)
    if start.first_parent:  # its statements read about the page's rows and no more
        columns = f"id, generation, snapshot_id, {_summary_json_sql(head=False)}"
        found = _first_parent_select(start.path, limit + 1, after, columns)
    else:
        text = _summary_json_sql("s", head=False)
        found = _ancestor_rows(start.reach, limit + 1, after, text=text)
    more = len(found) > limit
    rows = found[:limit]
    tail = rows[-1] if rows else None
    next_cursor = f"{tail[1]}:{tail[2]}" if more and tail else None
    return LogPageJson([(row[2], row[3]) for row in rows], next_cursor)


def snapshot_log(
    *,
    application: Application,
    rev: str,
    first_parent: bool = False,
    limit: int = 100,
    cursor: str | None = None,
) -> LogPage:
    """History of `rev`, newest first, `limit` at a time; pass `next_cursor` back for more."""
    _check_limit(limit)
    _parse_cursor(cursor)
    start = snapshot_log_start(application=application, rev=rev, first_parent=first_parent)
    return snapshot_log_page(start, limit=limit, cursor=cursor)


def snapshot_ancestors(
    *, application: Application, rev: str, limit: int = MAX_PAGE, cursor: str | None = None
) -> AncestorPage:
    """Ids of every snapshot in the history of `rev` (itself included), a page at a time,
    in topological order (generation descending, then id)."""
    limit = _check_limit(limit)
    after = _parse_cursor(cursor)
    rows = _ancestor_rows(_reach_of(application, rev), limit + 1, after)
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = f"{rows[-1][1]}:{rows[-1][2]}" if more and rows else None
    return AncestorPage([row[2] for row in rows], next_cursor)


def snapshot_is_ancestor(*, application: Application, ancestor: str, descendant: str) -> bool:
    """True when `ancestor` is in the history of `descendant` (a snapshot is its own)."""
    a, b = _resolve(application, ancestor, descendant)
    if a.chain == b.chain:
        return a.generation <= b.generation
    if a.generation >= b.generation:
        return False
    reach = _reach([_seed_at(b)], floor=a.generation)[0]
    return reach.get(a.chain, 0) >= a.generation


def snapshot_merge_bases(*, application: Application, a: str, b: str) -> list[SnapshotSummary]:
    """The best common ancestors of `a` and `b` (none an ancestor of another), newest first."""
    reach_a, reach_b = _reach([_seed(application, a), _seed(application, b)])
    for rev, reach in ((a, reach_a), (b, reach_b)):
        if not reach:
            raise UnknownRevisionError(application.name, rev)
    common = {c: min(g, reach_b[c]) for c, g in reach_a.items() if c in reach_b}
    if not common:
        return []
    bases = _summaries_at(_undominated(common) if len(common) > 1 else list(common.items()))
    bases.sort(key=lambda s: (-s.created_at.timestamp(), s.snapshot_id))
    return bases


def snapshot_merge_base(*, application: Application, a: str, b: str) -> SnapshotSummary | None:
    """The newest best common ancestor of `a` and `b`; None when their histories are disjoint."""
    bases = snapshot_merge_bases(application=application, a=a, b=b)
    return bases[0] if bases else None


# -- graph page and refs --------------------------------------------------------------------


def _graph_where(application: Application, cursor: str | None) -> tuple[str, list[Any]]:
    where, params = "application_id = %s", [application.pk]
    if cursor is not None:
        if not cursor.isdigit():
            raise InvalidCursorError(cursor)
        where += " AND id < %s"
        params.append(int(cursor))
    return where, params


# The branches and tags of an application as (target snapshot pk, "heads/…" / "tags/…").
_REFS_SQL = (
    f"SELECT head_id AS target, 'heads/' || name AS ref FROM {_BRANCH} "
    "WHERE application_id = %s AND head_id IS NOT NULL UNION ALL "
    f"SELECT target_id, 'tags/' || name FROM {_TAG} "
    "WHERE application_id = %s AND target_id IS NOT NULL"
)


def lineage_graph_page(
    *, application: Application, limit: int = 200, cursor: str | None = None
) -> GraphPage:
    """The `limit` most recently indexed snapshots (before `cursor`) with their parent edges
    and the branches and tags that point at them."""
    limit = _check_limit(limit)
    where, params = _graph_where(application, cursor)
    # The page and the refs pointing into it in one statement (a row per ref).
    sql = (
        f"SELECT s.*, r.ref FROM (SELECT {summary_columns()} FROM {_SNAPSHOT} WHERE {where} "
        f"ORDER BY id DESC LIMIT %s) AS s LEFT JOIN ({_REFS_SQL}) AS r ON r.target = s.id "
        "ORDER BY s.id DESC, r.ref"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, limit + 1, application.pk, application.pk])
        found = cursor.fetchall()
    rows: list[tuple[int, SnapshotSummary]] = []
    refs: dict[str, list[str]] = {}
    for row in found:
        if not rows or rows[-1][0] != row[0]:
            rows.append((row[0], _summary(row)))
        if row[-1] is not None:
            refs.setdefault(row[1], []).append(row[-1])
    more = len(rows) > limit
    if more:
        refs.pop(rows[limit][1].snapshot_id, None)
    rows = rows[:limit]
    snapshots = [s for _, s in rows]
    edges = [
        GraphEdge(s.snapshot_id, parent, position)
        for s in snapshots
        for position, parent in enumerate(s.parent_ids)
    ]
    pks = [pk for pk, _ in rows]
    return GraphPage(snapshots, edges, refs, str(pks[-1]) if more and pks else None)


@dataclass(frozen=True)
class GraphPageJson:
    """A `GraphPage` as the JSON text the API renders, built by PostgreSQL: the items of
    `results` (the snapshot summaries with their `url`s) and of `edges`, and the members of
    `refs`, each comma-separated without the enclosing brackets, in the page's orders."""

    results: str
    edges: str
    refs: str
    next_cursor: str | None
    #: the page's snapshot ids, in its order (the sinks' statuses are read for them)
    ids: tuple[str, ...] = ()


def _json_text(value: str) -> str:
    """SQL for the compact JSON text of `value` (as Python's `json.dumps` writes it)."""
    return f"to_json({value})::text"


# `_iso` of the API's serializers: ISO 8601 in UTC with a `Z`, microseconds only when not 0.
_ISO_CREATED = (
    "to_char({a}created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') || "
    "CASE to_char({a}created_at AT TIME ZONE 'UTC', 'US') WHEN '000000' THEN '' "
    "ELSE '.' || to_char({a}created_at AT TIME ZONE 'UTC', 'US') END || 'Z'"
)
# (key, SQL for its JSON text) of `snapshot_summaries`, in its order; `{a}` is the alias.
_SUMMARY_JSON_FIELDS = (
    ("snapshot_id", _json_text("{a}snapshot_id")),
    ("url", _json_text("%s::text || {a}snapshot_id || '/'")),
    ("branch", _json_text("{a}branch")),
    ("epoch", "{a}epoch::text"),
    ("kind", _json_text("{a}kind")),
    ("parallelism", "{a}parallelism::text"),
    ("max_parallelism", "{a}max_parallelism::text"),
    ("code_version", _json_text("{a}code_version")),
    ("config_hash", _json_text("{a}config_hash")),
    ("operation_id", _json_text("{a}operation_id")),
    ("created_at", "'\"' || " + _ISO_CREATED + " || '\"'"),
    ("generation", "{a}generation::text"),
    (
        "parents",
        "'[' || COALESCE((SELECT string_agg(to_json(p.parent)::text, ',' ORDER BY p.n) "
        "FROM jsonb_array_elements_text({a}parent_ids) WITH ORDINALITY AS p(parent, n)), '') "
        "|| ']'",
    ),
)


def _summary_json_sql(alias: str = "", *, head: bool = True) -> str:
    """SQL for a snapshot's summary (of the table aliased `alias`) as compact JSON text, the
    keys in `snapshot_summaries`' order. With `head` the whole object, whose one placeholder
    is the URL prefix; without, the members after `url` and the closing brace (the caller
    writes ``{"snapshot_id":…,"url":…,`` in front: `snapshot_summaries_json`)."""
    fields = _SUMMARY_JSON_FIELDS if head else _SUMMARY_JSON_FIELDS[2:]
    a = f"{alias}." if alias else ""
    parts = []
    for n, (name, value) in enumerate(fields):
        opening = "{" if head and n == 0 else "," if n else ""
        parts.append(f"'{opening}\"{name}\":' || {value.format(a=a)}")
    return " || ".join(parts) + " || '}'"


def lineage_graph_page_json(
    *, application: Application, url_prefix: str, limit: int = 200, cursor: str | None = None
) -> GraphPageJson | None:
    """`lineage_graph_page` as JSON text built in one PostgreSQL statement (None on other
    databases: the caller renders `lineage_graph_page`). Every snapshot's `url` is
    `url_prefix` + its id + ``/``.

    The rows never become Python objects: a page of 100 snapshots was ~4 ms of the server's
    CPU through summaries, dicts and the JSON encoder, and the statement builds the same text
    (held equal, byte for byte, to the rendered `lineage_graph_page` by the tests).
    """
    if connection.vendor != "postgresql":
        return None
    limit = _check_limit(limit)
    where, params = _graph_where(application, cursor)
    sql = f"""
        WITH page AS MATERIALIZED (
            SELECT id, snapshot_id, branch, epoch, kind, parallelism, max_parallelism,
                   code_version, config_hash, operation_id, created_at, generation, parent_ids
            FROM {_SNAPSHOT} WHERE {where} ORDER BY id DESC LIMIT %s
        ), shown AS MATERIALIZED (
            SELECT * FROM page ORDER BY id DESC LIMIT %s
        )
        SELECT
            (SELECT count(*) FROM page),
            (SELECT min(id) FROM shown),
            (SELECT string_agg({_summary_json_sql("s")}, ',' ORDER BY s.id DESC) FROM shown s),
            (SELECT string_agg(
                '{{"child":' || to_json(s.snapshot_id)::text || ',"parent":'
                || to_json(p.parent)::text || ',"position":' || (p.n - 1)::text || '}}',
                ',' ORDER BY s.id DESC, p.n)
             FROM shown s CROSS JOIN LATERAL
                jsonb_array_elements_text(s.parent_ids) WITH ORDINALITY AS p(parent, n)),
            (SELECT string_agg(to_json(t.snapshot_id)::text || ':[' || t.refs || ']', ','
                               ORDER BY t.id DESC)
             FROM (SELECT s.id, s.snapshot_id,
                          string_agg(to_json(r.ref)::text, ',' ORDER BY r.ref) AS refs
                   FROM shown s JOIN ({_REFS_SQL}) AS r ON r.target = s.id
                   GROUP BY s.id, s.snapshot_id) AS t),
            (SELECT string_agg(s.snapshot_id, ',' ORDER BY s.id DESC) FROM shown s)
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, limit + 1, limit, url_prefix, application.pk, application.pk])
        count, last, results, edges, refs, ids = cursor.fetchone()
    more = count > limit
    return GraphPageJson(
        results or "",
        edges or "",
        refs or "",
        str(last) if more and last is not None else None,
        tuple(ids.split(",")) if ids else (),
    )


def branch_list(*, application: Application, include_deleted: bool = False) -> list[Branch]:
    """Branches by name with their heads; deleted ones (head None) only when asked."""
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
    if not query.exists():
        raise UnknownRevisionError(application.name, ref, "no reflog is indexed for this ref")
    if before_seq is not None:
        query = query.filter(seq__lt=before_seq)
    return list(query.order_by("-seq")[:limit])


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


def _reach(seeds: Sequence[_Seed], floor: int = 0) -> list[dict[int, int]]:
    """For each seed, chain -> highest generation of that chain in its history (empty when
    the seed selects nothing).

    One recursive query over chain edges; `floor` prunes edges into generations below it
    (a snapshot of generation g has no ancestor of generation >= g).
    """
    edges = _edges_of("r", "e.from_generation <= r.generation AND e.to_generation >= %s")
    seeds_sql = " UNION ALL ".join(
        f"SELECT CAST({side} AS INTEGER), chain_id, generation FROM ({sql}) AS s{side}"
        for side, (sql, _) in enumerate(seeds)
    )
    sql = f"""
        WITH RECURSIVE reach(side, chain_id, generation) AS (
            {seeds_sql}
            UNION
            SELECT r.side, e.to_chain_id, e.to_generation FROM reach r {edges}
        )
        SELECT side, chain_id, MAX(generation) FROM reach GROUP BY side, chain_id
    """
    params = [p for _, seed_params in seeds for p in seed_params]
    result: list[dict[int, int]] = [{} for _ in seeds]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, floor])  # `floor` is the last placeholder
        for side, chain, generation in cursor.fetchall():
            result[side][chain] = generation
    return result


def _reach_of(application: Application, rev: str) -> dict[int, int]:
    reach = _reach([_seed(application, rev)])[0]
    if not reach:
        raise UnknownRevisionError(application.name, rev)
    return reach


def _edges_of(row: str, condition: str) -> str:
    """The join from recursive row `row` to the chain edges leaving its chain.

    On PostgreSQL a LATERAL subquery (kept unflattened by OFFSET 0) makes every step an index
    lookup; a plain join lets the planner hash the whole edge table on every iteration, which
    is ten times slower at a million snapshots. SQLite always loops over the index.
    """
    where = f"e.from_chain_id = {row}.chain_id AND {condition}"
    if connection.vendor == "postgresql":
        return (
            f"CROSS JOIN LATERAL (SELECT e.to_chain_id, e.to_generation FROM {_EDGE} e "
            f"WHERE {where} OFFSET 0) AS e"
        )
    return f"JOIN {_EDGE} e ON {where}"


def _ancestor_rows(
    reach: Mapping[int, int],
    limit: int,
    after: tuple[int, str] | None,
    *,
    summaries: bool = False,
    text: str = "",
) -> list[tuple[Any, ...]]:
    """(pk, generation, snapshot id[, summary columns…][, `text`]) of the first `limit`
    snapshots of the history `reach` after `after`, ordered by generation descending then
    id (`text`: one more column, SQL over the snapshot row aliased `s`, computed only for
    the rows a statement keeps).

    Each chain of the history contributes an index range. Chains are read in order of their
    highest reachable generation, a batch per statement, and reading stops once no unread
    chain can reach above the `limit`-th row found so far.
    """
    ranges = sorted(reach.items(), key=lambda item: -item[1])
    columns = "id, generation, snapshot_id" + (f", {summary_columns()}" if summaries else "")
    term = (
        f"SELECT * FROM (SELECT {columns} FROM {_SNAPSHOT} "
        "WHERE chain_id = %s AND generation <= %s{extra} "
        "ORDER BY generation DESC LIMIT %s) AS q{n}"
    )
    found: list[tuple[Any, ...]] = []
    offset, size = 0, _FIRST_BATCH
    with connection.cursor() as cursor:
        while offset < len(ranges):
            batch = ranges[offset : offset + size]
            offset, size = offset + size, min(size * 2, _UNION_TERMS)
            highest = batch[0][1] if after is None else min(batch[0][1], after[0])
            if len(found) >= limit and found[limit - 1][1] > highest:
                break
            terms: list[str] = []
            params: list[Any] = []
            for n, (chain, top) in enumerate(batch):
                extra = ""
                params += [chain, top]
                if after is not None:
                    extra = " AND (generation < %s OR (generation = %s AND snapshot_id > %s))"
                    params += [after[0], after[0], after[1]]
                params.append(limit)
                terms.append(term.format(extra=extra, n=n))
            sql = " UNION ALL ".join(terms) + " ORDER BY 2 DESC, 3 LIMIT %s"
            if text:  # after the LIMIT: not for every candidate row of every range
                sql = (
                    f"SELECT q.id, q.generation, q.snapshot_id, {text} FROM ({sql}) AS q "
                    f"JOIN {_SNAPSHOT} s ON s.id = q.id"
                )
            cursor.execute(sql, [*params, limit])
            found.extend(cursor.fetchall())
            found.sort(key=lambda row: (-row[1], row[2]))
            del found[limit:]
    return found


def _first_parent_rows(
    path: Sequence[tuple[int, int, int]], limit: int, after: tuple[int, str] | None
) -> list[SnapshotSummary]:
    """The first-parent chain along `path` (below `after`), newest first.

    The chain is a list of segments, each a range of one chain lying wholly below the
    previous one in generation. A segment from generation `top` down to its chain's root
    holds at most `top - root + 1` snapshots (exactly that many without merges), so one
    statement reads as many segments as can fill the page; a merge-shortened segment
    costs at most one more statement.
    """
    return [_summary(row) for row in _first_parent_select(path, limit, after, summary_columns())]


def _first_parent_select(
    path: Sequence[tuple[int, int, int]], limit: int, after: tuple[int, str] | None, columns: str
) -> list[tuple[Any, ...]]:
    """`columns` (then the segment's number) of `_first_parent_rows`' snapshots, in order."""
    segments = []
    for chain, generation, root in path:
        top = generation if after is None else min(generation, after[0] - 1)
        if top >= root:
            segments.append((chain, top, root))
    rows: list[tuple[Any, ...]] = []
    columns = columns.replace("{", "{{").replace("}", "}}")  # the term is a format string
    term = (
        f"SELECT * FROM (SELECT {columns}, %s AS segment FROM {_SNAPSHOT} "
        "WHERE chain_id = %s AND generation <= %s ORDER BY generation DESC LIMIT %s) AS q{n}"
    )
    index = 0
    while index < len(segments) and len(rows) < limit:
        need, capacity = limit - len(rows), 0
        terms: list[str] = []
        params: list[int] = []
        while index < len(segments) and capacity < need:
            chain, top, root = segments[index]
            terms.append(term.format(n=len(terms)))
            params += [index, chain, top, need]
            capacity += top - root + 1
            index += 1
        sql = " UNION ALL ".join(terms) + " ORDER BY segment, generation DESC LIMIT %s"
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, need])
            rows.extend(cursor.fetchall())
    return rows


def _first_parent_path(application: Application, rev: str) -> list[tuple[int, int, int]]:
    """(chain, top generation, root generation) segments of the first-parent chain of the
    snapshot `rev` names, newest first (resolved inside the same statement)."""
    seed, params = _seed(application, rev)
    edges = _edges_of("p", "e.first_parent")
    sql = f"""
        WITH RECURSIVE path(depth, chain_id, generation) AS (
            SELECT 0, chain_id, generation FROM ({seed}) AS start
            UNION ALL
            SELECT p.depth + 1, e.to_chain_id, e.to_generation FROM path p {edges}
        )
        SELECT p.chain_id, p.generation, c.root_generation
        FROM path p JOIN {_CHAIN} c ON c.id = p.chain_id ORDER BY p.depth
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        path = [(c, g, root) for c, g, root in cursor.fetchall()]
    if not path:
        raise UnknownRevisionError(application.name, rev)
    return path


def _undominated(common: Mapping[int, int]) -> list[tuple[int, int]]:
    """The (chain, generation) tops of the common history that are not ancestors of another.

    A top's history lies inside the common history, so its reach is computed in memory over
    the edges leaving the common chains.
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
        if top in dominated:
            continue
        reach = _reach_in_memory(top, edges)
        dominated.update(o for o in tops if o != top and reach.get(o[0], 0) >= o[1])
    return [top for top in tops if top not in dominated]


def _reach_in_memory(
    start: tuple[int, int], edges: Mapping[int, list[tuple[int, int, int]]]
) -> dict[int, int]:
    """`_reach` over preloaded edges: visits in descending generation, so each chain is
    first seen at its highest reachable generation."""
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


def _summaries_at(places: Iterable[tuple[int, int]]) -> list[SnapshotSummary]:
    places = list(places)
    where = " OR ".join(["(chain_id = %s AND generation = %s)"] * len(places))
    params = [value for place in places for value in place]
    return [
        s
        for _, s in _summaries(f"SELECT {summary_columns()} FROM {_SNAPSHOT} WHERE {where}", params)
    ]


def _summaries(sql: str, params: Sequence[Any]) -> list[tuple[int, SnapshotSummary]]:
    """Run a SELECT of `summary_columns()`; (pk, summary) in result order."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [(row[0], _summary(row)) for row in rows]


def _summary(row: Sequence[Any]) -> SnapshotSummary:
    (_, sid, branch, epoch, kind, p, m, code, config, op, created, gen, parents, *maps) = row[:16]
    return SnapshotSummary(
        snapshot_id=sid,
        branch=branch,
        epoch=epoch,
        kind=kind,
        parallelism=p,
        max_parallelism=m,
        code_version=code,
        config_hash=config,
        operation_id=op,
        created_at=_datetime(created),
        generation=gen,
        parent_ids=tuple(_json(parents)),
        offsets_json=maps[0],
        stats_json=maps[1],
        provenance_json=maps[2],
    )


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def _datetime(value: Any) -> datetime:
    """Raw SQLite rows carry naive UTC text; PostgreSQL returns aware datetimes."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            value = parse_datetime(value)
    assert isinstance(value, datetime)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def summary_of_row(row: Sequence[Any]) -> SnapshotSummary | None:
    """The summary in `row` (selected with `summary_columns`); None when the join found none."""
    return None if row[0] is None else _summary(row)


def branch_head(*, application: Application, branch: str) -> Snapshot | None:
    """The indexed head of `branch` (None when the branch is unknown or deleted), in one
    query (added for the REST API's job detail)."""
    found = (
        Branch.objects.filter(application=application, name=branch, head__isnull=False)
        .select_related("head")
        .first()
    )
    return None if found is None else found.head


# -- what the lineage page shows besides the graph -------------------------------------------


def refs_at(*, application: Application, ids: Sequence[str]) -> dict[str, list[str]]:
    """snapshot id -> the ``heads/…`` and ``tags/…`` pointing at it, for `ids`."""
    refs: dict[str, list[str]] = {}
    branches = Branch.objects.filter(application=application, head__snapshot_id__in=ids)
    for name, sid in branches.values_list("name", "head__snapshot_id"):
        refs.setdefault(sid, []).append(f"heads/{name}")
    tags = Tag.objects.filter(application=application, target__snapshot_id__in=ids)
    for name, sid in tags.values_list("name", "target__snapshot_id"):
        refs.setdefault(sid, []).append(f"tags/{name}")
    return refs


def snapshots_with_id_prefix(
    *, application: Application, prefix: str, limit: int = 2
) -> list[Snapshot]:
    """At most `limit` indexed snapshots whose id starts with `prefix`."""
    found = Snapshot.objects.filter(application=application, snapshot_id__startswith=prefix)
    return list(found[:limit])


def snapshot_find(*, application: Application, snapshot_id: str) -> Snapshot | None:
    """The indexed snapshot with that full id, or None."""
    return Snapshot.objects.filter(application=application, snapshot_id=snapshot_id).first()


def snapshot_count(*, application: Application) -> int:
    return Snapshot.objects.filter(application=application).count()


def snapshot_kind_counts(*, application: Application) -> dict[str, int]:
    """How many indexed snapshots of each kind (epoch, rescale, …) the application has."""
    rows = (
        Snapshot.objects.filter(application=application)
        .values_list("kind")
        .annotate(n=Count("id"))
        .order_by()
    )
    return dict(rows)  # type: ignore[arg-type]


def snapshot_events(*, application: Application, limit: int) -> list[dict[str, Any]]:
    """The newest commits that are not plain epochs (rescales, rollbacks, forks, …)."""
    return list(
        Snapshot.objects.filter(application=application)
        .exclude(kind="epoch")
        .order_by("-id")
        .values("snapshot_id", "kind", "branch", "epoch", "created_at")[:limit]
    )


def tag_count(*, application: Application) -> int:
    """Tags that point at a snapshot (deleted ones not counted)."""
    return Tag.objects.filter(application=application, target__isnull=False).count()


def snapshot_children(snapshot: Snapshot) -> list[tuple[str, str, str]]:
    """(id, kind, branch) of each snapshot that has `snapshot` as a parent."""
    return list(
        SnapshotParent.objects.filter(parent=snapshot)
        .select_related("child")
        .values_list("child__snapshot_id", "child__kind", "child__branch")
    )
