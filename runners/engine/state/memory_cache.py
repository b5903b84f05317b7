"""The worker process's cache of materialised key-group state, in front of the machine's
disk cache: an LRU bounded by the tables' bytes, keyed by the chain of chunk ids (chunks are
immutable, so an entry is always valid)."""

from __future__ import annotations

import threading
from collections import OrderedDict

from runners.engine.state import disk_cache
from runners.engine.state.codec import KeyGroupState

CACHE_BYTES = 2 * 1024**3

_cache: OrderedDict[tuple[str, ...], KeyGroupState] = OrderedDict()
_cache_bytes = 0
_lock = threading.Lock()
#: lookups of this process that found a chain (in memory or on disk) or did not
stats = {"hits": 0, "misses": 0}


def cache_put(entry: KeyGroupState, *, disk: bool = True, payload: bytes | None = None) -> None:
    """Remember a materialised chain in this worker and, with `disk`, in the machine's disk
    cache (`payload`: the chunk of a one-chunk chain, written to disk as it is)."""
    global _cache_bytes
    if disk:
        disk_cache.put(entry, payload)
    with _lock:
        if entry.chain in _cache:
            return
        _cache[entry.chain] = entry
        _cache_bytes += entry.table.nbytes
        while _cache_bytes > CACHE_BYTES and len(_cache) > 1:
            _, old = _cache.popitem(last=False)
            _cache_bytes -= old.table.nbytes


def cache_get(chain: tuple[str, ...]) -> KeyGroupState | None:
    """The chain's state from this worker's memory, else from the disk cache (then kept in
    memory too), else None."""
    with _lock:
        entry = _cache.get(chain)
        if entry is not None:
            _cache.move_to_end(chain)
            stats["hits"] += 1
            return entry
    entry = disk_cache.get(chain)
    with _lock:
        stats["hits" if entry is not None else "misses"] += 1
    if entry is not None:
        cache_put(entry, disk=False)
    return entry


def cached_prefix(chain: tuple[str, ...]) -> tuple[int, KeyGroupState | None]:
    """The longest cached proper prefix of `chain`: (its length, its state); (0, None) when
    none is cached."""
    for cut in range(len(chain) - 1, 0, -1):
        prefix = cache_get(chain[:cut])
        if prefix is not None:
            return cut, prefix
    return 0, None


def cache_clear() -> None:
    """Forget this worker's entries (the disk cache stays)."""
    global _cache_bytes
    with _lock:
        _cache.clear()
        _cache_bytes = 0
