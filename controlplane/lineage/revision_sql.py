"""A parsed revision (`snapshots_store.revisions`) compiled to one SQL statement over the
lineage index: the same grammar as the store's `Repository.resolve`, answered by the index.

The statement selects (id, snapshot_id, chain_id, generation) of the snapshot the revision
names, or no row. The base is a full id, the refs in the parsed order (a bare name: branch,
then tag), then a unique id prefix; ``^N`` joins the N-th parent link; ``~N`` walks N first
parents with a recursive query that stops at a root (no row when the walk falls short).
Valid on PostgreSQL and SQLite alike.
"""

from __future__ import annotations

from typing import Any

from controlplane.lineage.models import Branch, Snapshot, SnapshotParent, Tag
from snapshots_store.revisions import Revision, Step

_SNAPSHOT = Snapshot._meta.db_table
_PARENT = SnapshotParent._meta.db_table
_REF_TABLES = {
    "heads/": (Branch._meta.db_table, "head_id"),
    "tags/": (Tag._meta.db_table, "target_id"),
}
POINT = "id, snapshot_id, chain_id, generation"
_POINT_OF_S = (
    "s.id AS id, s.snapshot_id AS snapshot_id, s.chain_id AS chain_id, s.generation AS generation"
)

Sql = tuple[str, list[Any]]


def revision_sql(application_pk: int, revision: Revision) -> Sql:
    """SQL selecting at most one (id, snapshot_id, chain_id, generation) row: the snapshot
    `revision` names in the application's index."""
    sql, params = _base_sql(application_pk, revision)
    for depth, step in enumerate(revision.steps):
        sql, params = _step_sql(sql, params, step, depth)
    return sql, params


def _base_sql(application_pk: int, revision: Revision) -> Sql:
    if revision.object_id is not None:
        return (
            f"SELECT {_POINT_OF_S} FROM {_SNAPSHOT} s "
            "WHERE s.application_id = %s AND s.snapshot_id = %s",
            [application_pk, revision.object_id],
        )
    terms: list[str] = []
    params: list[Any] = []
    for order, ref in enumerate(revision.refs):
        kind = "heads/" if ref.startswith("heads/") else "tags/"
        table, column = _REF_TABLES[kind]
        terms.append(
            f"SELECT {order} AS o, {_POINT_OF_S} FROM {table} r JOIN {_SNAPSHOT} s "
            f"ON s.id = r.{column} WHERE r.application_id = %s AND r.name = %s"
        )
        params += [application_pk, ref.removeprefix(kind)]
    if revision.prefix is not None:
        # Ids are 64 lowercase hex digits: those starting with the prefix lie between the
        # prefix padded with 0s and with fs (a range the unique index answers). Unique only.
        pad = 64 - len(revision.prefix)
        low, high = revision.prefix + "0" * pad, revision.prefix + "f" * pad
        within = "application_id = %s AND snapshot_id BETWEEN %s AND %s"
        terms.append(
            f"SELECT {len(terms)} AS o, {_POINT_OF_S} FROM {_SNAPSHOT} s WHERE s.{within} "
            f"AND (SELECT COUNT(*) FROM (SELECT 1 FROM {_SNAPSHOT} WHERE {within} LIMIT 2) "
            "AS matches) = 1"
        )
        params += [application_pk, low, high, application_pk, low, high]
    return (
        f"SELECT {POINT} FROM ({' UNION ALL '.join(terms)}) AS refs ORDER BY o LIMIT 1",
        params,
    )


def _step_sql(sql: str, params: list[Any], step: Step, depth: int) -> Sql:
    if step.count == 0:
        return sql, params
    if step.kind == "^":
        return (
            f"SELECT {_POINT_OF_S} FROM ({sql}) AS b{depth} "
            f"JOIN {_PARENT} p ON p.child_id = b{depth}.id AND p.position = %s "
            f"JOIN {_SNAPSHOT} s ON s.id = p.parent_id",
            [*params, step.count - 1],
        )
    walk = f"walk{depth}"
    return (
        f"SELECT {_POINT_OF_S} FROM (WITH RECURSIVE {walk}(id, k) AS ("
        f"SELECT id, 0 FROM ({sql}) AS b{depth} UNION ALL "
        f"SELECT f.first_parent_id, {walk}.k + 1 FROM {walk} JOIN {_SNAPSHOT} f "
        f"ON f.id = {walk}.id WHERE {walk}.k < %s AND f.first_parent_id IS NOT NULL"
        f") SELECT id FROM {walk} WHERE k = %s) AS w{depth} "
        f"JOIN {_SNAPSHOT} s ON s.id = w{depth}.id",
        [*params, step.count, step.count],
    )
