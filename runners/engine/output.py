"""Reading a branch's versioned, exactly-once sink output: the union over its first-parent chain."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from runners.engine.chunks import decode_table
from snapshots_store import Repository

EPOCH = "_epoch"
#: an Arrow output's schema metadata key: what it holds ("records" or "dead_letters")
OUTPUT_KIND = b"epochal.output"
#: the JSON output of the aggregate path: the changed rows inside the epoch's chunks
CHUNK_REFS = "chunk_refs"
DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("partition", pa.string()),
        ("offset", pa.int64()),
        ("reason", pa.string()),
        ("raw", pa.string()),
    ]
)


def _epoch_tables(repo: Repository, branch: str, kind: str) -> Iterator[pa.Table]:
    if repo.read_ref(f"heads/{branch}") is None:
        return
    chain = list(repo.log(f"heads/{branch}", first_parent=True))
    for _, manifest in reversed(chain):
        yield from _manifest_tables(repo, manifest.outputs, manifest.epoch, kind)


def _manifest_tables(
    repo: Repository, outputs: Sequence[str], epoch: int, kind: str
) -> Iterator[pa.Table]:
    for output_id in outputs:
        payload = repo.get_object(output_id)
        if payload.startswith(b"{"):
            if kind == "records":
                yield _with_epoch(_resolve_refs(repo, payload), epoch)
            continue
        table = decode_table(payload)
        meta = table.schema.metadata or {}
        if meta.get(OUTPUT_KIND, b"records").decode() != kind:
            continue
        yield _with_epoch(table, epoch)


def _with_epoch(table: pa.Table, epoch: int) -> pa.Table:
    table = table.replace_schema_metadata(None)
    return table.append_column(EPOCH, pa.array([epoch] * table.num_rows, pa.int64()))


def _resolve_refs(repo: Repository, payload: bytes) -> pa.Table:
    """Rows an output names inside state chunks ((chunk id, first row, rows) references)."""
    doc = json.loads(payload)
    if doc.get("kind") != CHUNK_REFS:
        raise ValueError(f"unknown output document kind {doc.get('kind')!r}")
    refs = doc["refs"]
    payloads = repo.read_chunks([chunk_ref for chunk_ref, _, _ in refs])  # few long reads
    parts = []
    for payload, (_, start, length) in zip(payloads, refs, strict=True):
        chunk = decode_table(payload).slice(start, length)
        internal = [c for c in chunk.column_names if c.startswith("_")]
        parts.append(chunk.drop_columns(internal))
    return pa.concat_tables(parts)


def _sortable(field: pa.Field) -> bool:
    t = field.type
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_boolean(t)
        or pa.types.is_timestamp(t)
    )


def _union(tables: list[pa.Table], empty: pa.Schema) -> pa.Table:
    if not tables:
        return empty.empty_table()
    table = pa.concat_tables(tables, promote_options="permissive")
    order = [(EPOCH, "ascending")] + [
        (f.name, "ascending") for f in table.schema if f.name != EPOCH and _sortable(f)
    ]
    return table.sort_by(order)


def read_output(repo: Repository, branch: str) -> pa.Table:
    """The branch's output: every epoch's rows on its first-parent chain, with an `_epoch`
    column, sorted by epoch then by the row's values (independent of the parallelism)."""
    return _union(list(_epoch_tables(repo, branch, "records")), pa.schema([(EPOCH, pa.int64())]))


def read_dead_letters(repo: Repository, branch: str) -> pa.Table:
    """Rejected records of the branch (source, partition, offset, reason, raw, _epoch)."""
    schema = DEAD_LETTER_SCHEMA.append(pa.field(EPOCH, pa.int64()))
    return _union(list(_epoch_tables(repo, branch, "dead_letters")), schema)


def publish_output(repo: Repository, branch: str, connection: Any, table: str) -> int:
    """Publish the branch's output to an external SQL table, idempotently.

    Rows go to ``table(branch, epoch, snapshot_id, row)`` (`row` is JSON). Each epoch is
    replaced in its own transaction (delete then insert), epochs already published for the
    same snapshot are skipped, and rows of snapshots no longer on the branch's first-parent
    chain (after a rollback) are deleted. Works with any DB-API connection (sqlite3, psycopg).
    Returns the number of rows inserted.
    """
    if not table.replace("_", "").isalnum():
        raise ValueError(f"table name {table!r}: letters, digits and underscores only")
    mark = "?" if type(connection).__module__.startswith("sqlite3") else "%s"
    cur = connection.cursor()
    cur.execute(
        f"CREATE TABLE IF NOT EXISTS {table} (branch TEXT NOT NULL, epoch BIGINT NOT NULL, "
        "snapshot_id TEXT NOT NULL, row TEXT NOT NULL)"
    )
    connection.commit()
    chain = (
        []
        if repo.read_ref(f"heads/{branch}") is None
        else list(repo.log(f"heads/{branch}", first_parent=True))
    )
    cur.execute(f"SELECT DISTINCT epoch, snapshot_id FROM {table} WHERE branch = {mark}", (branch,))
    published = {(int(e), s) for e, s in cur.fetchall()}
    wanted = {(m.epoch, sid) for sid, m in chain}
    for epoch, sid in sorted(published - wanted):
        cur.execute(
            f"DELETE FROM {table} WHERE branch = {mark} AND epoch = {mark} "
            f"AND snapshot_id = {mark}",
            (branch, epoch, sid),
        )
    connection.commit()
    inserted = 0
    for sid, manifest in reversed(chain):
        if (manifest.epoch, sid) in published or not manifest.outputs:
            # no outputs: a fork / rollback / rescale / migration commit shares its parent's
            # epoch number and adds nothing (the epoch's rows belong to the parent)
            continue
        rows = [
            t.drop_columns([EPOCH]).to_pylist()
            for t in _manifest_tables(repo, manifest.outputs, manifest.epoch, "records")
        ]
        flat = [json.dumps(r, sort_keys=True, default=str) for part in rows for r in part]
        cur.execute(
            f"DELETE FROM {table} WHERE branch = {mark} AND epoch = {mark}",
            (branch, manifest.epoch),
        )
        cur.executemany(
            f"INSERT INTO {table} (branch, epoch, snapshot_id, row) VALUES "
            f"({mark}, {mark}, {mark}, {mark})",
            [(branch, manifest.epoch, sid, r) for r in flat],
        )
        connection.commit()
        inserted += len(flat)
    return inserted
