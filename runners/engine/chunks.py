"""Key-group state chunks: Arrow IPC payloads, base + deltas, and the executor-local cache.

A key group's state is a chain of chunk objects: a base chunk (every key) followed by delta
chunks (only the keys an epoch changed; ``_deleted`` marks removed keys). Materialising applies
the deltas in order. Chunks are immutable, so a materialised chain cached in the worker
process, keyed by the chain of chunk ids, is always valid.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runners.engine.hashing import canonical_keys
from snapshots_store import Repository

DELETED = "_deleted"
CACHE_BYTES = 2 * 1024**3


def encode_table(table: pa.Table) -> bytes:
    """Arrow IPC stream bytes of a table (the store compresses them)."""
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


def apply_delta(state: pa.Table, delta: pa.Table, key_columns: Sequence[str]) -> pa.Table:
    """State after a delta: rows of keys in the delta are replaced (or removed when deleted)."""
    if delta.num_rows == 0:
        return state
    if state.num_rows:
        keep = pc.invert(pc.is_in(lookup_key(state, key_columns), lookup_key(delta, key_columns)))
        state = state.filter(keep)
    live = delta.filter(pc.invert(delta.column(DELETED))).drop_columns([DELETED])
    return pa.concat_tables([state, live.select(state.schema.names)]) if state.num_rows else live


@dataclass(frozen=True)
class KeyGroupState:
    """Materialised state of one key group, with the stored payload size of each chunk."""

    chain: tuple[str, ...]
    table: pa.Table
    sizes: tuple[int, ...]


_cache: OrderedDict[tuple[str, ...], KeyGroupState] = OrderedDict()
_cache_bytes = 0
_lock = threading.Lock()
stats = {"hits": 0, "misses": 0}


def cache_put(entry: KeyGroupState) -> None:
    """Remember a materialised chain in this worker (LRU bounded by bytes)."""
    global _cache_bytes
    with _lock:
        if entry.chain in _cache:
            return
        _cache[entry.chain] = entry
        _cache_bytes += entry.table.nbytes
        while _cache_bytes > CACHE_BYTES and len(_cache) > 1:
            _, old = _cache.popitem(last=False)
            _cache_bytes -= old.table.nbytes


def cache_get(chain: tuple[str, ...]) -> KeyGroupState | None:
    with _lock:
        entry = _cache.get(chain)
        if entry is not None:
            _cache.move_to_end(chain)
            stats["hits"] += 1
        else:
            stats["misses"] += 1
        return entry


def cache_clear() -> None:
    global _cache_bytes
    with _lock:
        _cache.clear()
        _cache_bytes = 0


def load_key_group(
    repo: Repository, chain: Sequence[str], key_columns: Sequence[str], schema: pa.Schema | None
) -> KeyGroupState:
    """Materialised state of a chunk chain: from the cache, else from the longest cached prefix."""
    chain = tuple(chain)
    cached = cache_get(chain)
    if cached is not None:
        return cached
    start: int = 0
    table: pa.Table | None = None
    sizes: tuple[int, ...] = ()
    for cut in range(len(chain) - 1, 0, -1):
        prefix = cache_get(chain[:cut])
        if prefix is not None:
            start, table, sizes = cut, prefix.table, prefix.sizes
            break
    size_list = list(sizes)
    for chunk_id in chain[start:]:
        payload = repo.get_object(chunk_id)
        size_list.append(len(payload))
        chunk = decode_table(payload)
        if table is None:
            table = chunk.filter(pc.invert(chunk.column(DELETED))).drop_columns([DELETED])
        else:
            table = apply_delta(table, chunk, key_columns)
    assert table is not None
    entry = KeyGroupState(chain, table, tuple(size_list))
    cache_put(entry)
    return entry


def empty_state(schema: pa.Schema) -> KeyGroupState:
    return KeyGroupState((), schema.empty_table(), ())


def with_deleted(table: pa.Table, deleted: np.ndarray | None = None) -> pa.Table:
    """The table with the ``_deleted`` flag column chunks carry."""
    flags = np.zeros(table.num_rows, dtype=bool) if deleted is None else deleted
    return table.append_column(DELETED, pa.array(flags, type=pa.bool_()))
