"""Key-group state chunks as bytes and tables: Arrow IPC payloads, base + deltas.

A key group's state is a chain of chunk objects: a base chunk (every key) followed by delta
chunks (only the keys an epoch changed; ``_deleted`` marks removed keys). Materialising applies
the deltas in order. Chunks are immutable, so a materialised chain, keyed by its chunk ids, is
always valid (the caches rely on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runners.engine.hashing import canonical_keys

DELETED = "_deleted"


@dataclass(frozen=True)
class KeyGroupState:
    """Materialised state of one key group, with the stored payload size of each chunk."""

    chain: tuple[str, ...]
    table: pa.Table
    sizes: tuple[int, ...]


def encode_table(table: pa.Table) -> bytes:
    """Arrow IPC stream bytes of a table as one record batch, so equal tables always encode to
    equal bytes whatever their chunking (the store compresses them)."""
    table = table.combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    payload: bytes = sink.getvalue().to_pybytes()
    return payload


def decode_table(payload: bytes) -> pa.Table:
    """The table encoded by `encode_table`."""
    return pa.ipc.open_stream(pa.py_buffer(payload)).read_all()


def lookup_key(table: pa.Table, key_columns: Sequence[str]) -> pa.Array:
    """One array identifying each row's key: the key column, or canonical bytes of a tuple."""
    if len(key_columns) == 1:
        column = table.column(key_columns[0])
        return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    encoded = canonical_keys([table.column(c) for c in key_columns])
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(encoded),
        [None, pa.py_buffer(encoded.offsets), pa.py_buffer(encoded.data)],
    )


def conform(state: pa.Table, schema: pa.Schema) -> pa.Table:
    """State in the columns of `schema`: a missing column is null, an extra one is dropped.

    This is how a new code version (fork) that adds or drops an aggregation, or a state
    migration that added a column, meets the state written before it."""
    if state.schema.equals(schema):
        return state
    columns = []
    for f in schema:
        if f.name in state.column_names:
            columns.append(state.column(f.name).cast(f.type))
        else:
            columns.append(pa.nulls(state.num_rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def apply_delta(state: pa.Table, delta: pa.Table, key_columns: Sequence[str]) -> pa.Table:
    """State after a delta: rows of keys in the delta are replaced (or removed when deleted).

    The result has the delta's columns (the epoch that wrote it conformed the whole key group
    to them), so a chain read from the store equals the state the epoch held in memory."""
    if delta.num_rows == 0:
        return state
    if state.num_rows:
        keep = pc.invert(pc.is_in(lookup_key(state, key_columns), lookup_key(delta, key_columns)))
        state = state.filter(keep)
    live = delta.filter(pc.invert(delta.column(DELETED))).drop_columns([DELETED])
    if not state.num_rows:
        return live
    return pa.concat_tables([conform(state, live.schema), live])


def base_state(chunk: pa.Table) -> pa.Table:
    """The state a chain's first chunk holds: its live rows (no copy when none is deleted)."""
    if not pc.any(chunk.column(DELETED)).as_py():
        return chunk.drop_columns([DELETED])
    return chunk.filter(pc.invert(chunk.column(DELETED))).drop_columns([DELETED])


def materialise(
    chain: tuple[str, ...],
    start: int,
    table: pa.Table | None,
    sizes: tuple[int, ...],
    payloads: Sequence[bytes],
    key_columns: Sequence[str],
) -> KeyGroupState:
    """The state of `chain` from the state of its first `start` chunks (`table`, `sizes`;
    None and () for none) and the payloads of the rest."""
    size_list = list(sizes)
    for payload in payloads:
        size_list.append(len(payload))
        chunk = decode_table(payload)
        table = base_state(chunk) if table is None else apply_delta(table, chunk, key_columns)
    assert table is not None
    return KeyGroupState(chain, table, tuple(size_list))


def empty_state(schema: pa.Schema) -> KeyGroupState:
    return KeyGroupState((), schema.empty_table(), ())


def with_deleted(table: pa.Table, deleted: np.ndarray | None = None) -> pa.Table:
    """The table with the ``_deleted`` flag column chunks carry."""
    flags = np.zeros(table.num_rows, dtype=bool) if deleted is None else deleted
    return table.append_column(DELETED, pa.array(flags, type=pa.bool_()))
