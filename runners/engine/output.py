"""Reading a branch's versioned, exactly-once sink output: the union over its first-parent chain."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa

from runners.engine.chunks import decode_table
from runners.engine.tasks import CHUNK_REFS, DEAD_LETTER_SCHEMA, OUTPUT_KIND
from snapshots_store import Repository

EPOCH = "_epoch"


def _epoch_tables(repo: Repository, branch: str, kind: str) -> Iterator[pa.Table]:
    if repo.read_ref(f"heads/{branch}") is None:
        return
    chain = list(repo.log(f"heads/{branch}", first_parent=True))
    for _, manifest in reversed(chain):
        for output_id in manifest.outputs:
            payload = repo.get_object(output_id)
            if payload.startswith(b"{"):
                if kind == "records":
                    yield _with_epoch(_resolve_refs(repo, payload), manifest.epoch)
                continue
            table = decode_table(payload)
            meta = table.schema.metadata or {}
            if meta.get(OUTPUT_KIND, b"records").decode() != kind:
                continue
            yield _with_epoch(table, manifest.epoch)


def _with_epoch(table: pa.Table, epoch: int) -> pa.Table:
    table = table.replace_schema_metadata(None)
    return table.append_column(EPOCH, pa.array([epoch] * table.num_rows, pa.int64()))


def _resolve_refs(repo: Repository, payload: bytes) -> pa.Table:
    """Rows an output names inside state chunks ((chunk id, first row, rows) references)."""
    doc = json.loads(payload)
    if doc.get("kind") != CHUNK_REFS:
        raise ValueError(f"unknown output document kind {doc.get('kind')!r}")
    parts = []
    for chunk_id, start, length in doc["refs"]:
        chunk = decode_table(repo.get_object(chunk_id)).slice(start, length)
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
