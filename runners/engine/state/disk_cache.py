"""The machine's disk cache of materialised key-group state: Arrow files under one directory
(``$EPOCHAL_STATE_CACHE_DIR``, budget ``$EPOCHAL_STATE_CACHE_DISK_MB``: runners/config.py), so
a task that lands on another Python worker of the machine still finds its key groups.

Best effort throughout: a full or read-only disk only costs a cache miss. A chain of one chunk
is stored as that chunk's payload as it is (an Arrow IPC stream, written without
re-encoding), a longer one as an uncompressed Arrow file. The directory may exceed its budget
by what the workers write between eviction passes (1/16 of the budget each).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from typing import BinaryIO

import pyarrow as pa

from runners import config
from runners.engine.state.codec import KeyGroupState, base_state

_ARROW_FILE_MAGIC = b"ARROW1"
_lock = threading.Lock()
#: bytes this process wrote to the disk cache since its last eviction pass; a pass walks the
#: whole directory (every worker's files: tens of thousands after a run at M = 32,768), so it
#: runs once per 1/16 of the budget written, not per a number of files
_written = 0


def budget() -> int:
    """The disk cache's budget in bytes (0: off)."""
    return config.current().state_cache_disk_bytes


def path_of(chain: tuple[str, ...]) -> str:
    """The cache file of a chain."""
    digest = hashlib.sha256("\n".join(chain).encode()).hexdigest()
    return os.path.join(config.current().state_cache_path, digest[:2], digest + ".arrow")


def put(entry: KeyGroupState, payload: bytes | None = None) -> None:
    """Write a materialised chain for the other workers of this machine (`payload`: the chunk
    of a one-chunk chain, written as it is)."""
    if budget() <= 0 or not entry.chain:
        return
    path = path_of(entry.chain)
    if os.path.exists(path):
        return
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if payload is not None and len(entry.chain) == 1:
            with open(tmp, "wb") as handle:
                handle.write(payload)
        else:
            meta = {b"epochal.sizes": json.dumps(list(entry.sizes)).encode()}
            table = entry.table.replace_schema_metadata(meta)
            with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        os.replace(tmp, path)
        _account(os.path.getsize(path))
    except OSError:  # a full disk: no partial file stays behind to fill it further
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _account(size: int) -> None:
    """Count a file written to the disk cache; every 1/16 of the budget, evict."""
    global _written
    with _lock:
        _written += size
        due = _written >= budget() // 16
        if due:
            _written = 0
    if due:
        evict()


def get(chain: tuple[str, ...]) -> KeyGroupState | None:
    """The chain's cached state (memory-mapped), or None."""
    if budget() <= 0:
        return None
    try:
        source = pa.memory_map(path_of(chain), "r")
        if source.read(len(_ARROW_FILE_MAGIC)) == _ARROW_FILE_MAGIC:
            table = pa.ipc.open_file(source).read_all()
            sizes = tuple(json.loads((table.schema.metadata or {})[b"epochal.sizes"]))
            return KeyGroupState(chain, table.replace_schema_metadata(None), sizes)
        if len(chain) != 1:
            return None
        source.seek(0)
        chunk = pa.ipc.open_stream(source).read_all()
        return KeyGroupState(chain, base_state(chunk), (source.size(),))
    except (OSError, pa.ArrowInvalid, KeyError, ValueError):
        return None


def evict() -> None:
    """Delete the least recently written files above the disk budget."""
    files = []
    for root, _, names in os.walk(config.current().state_cache_path):
        for name in names:
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, full))
    total = sum(f[1] for f in files)
    limit = budget()
    for _, size, full in sorted(files):
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            os.remove(full)
        total -= size


class CacheFile:
    """A disk-cache file the store writes a verified chunk payload into (in a reading
    thread). A failed write (a full disk) is remembered, not raised: the chunk is then read
    again as bytes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.handle: BinaryIO | None = open(self.tmp, "wb")  # noqa: SIM115 (closed in finish)
        self.failed = False

    def write(self, data: bytes | memoryview, /) -> int:
        if not self.failed and self.handle is not None:
            try:
                self.handle.write(data)
            except OSError:
                self.failed = True
        return len(data)

    def finish(self, chain: tuple[str, ...]) -> KeyGroupState | None:
        """The cached state, the file renamed into place; None when writing it failed."""
        handle, self.handle = self.handle, None
        try:
            if handle is not None:
                handle.close()
            if not self.failed:
                os.replace(self.tmp, self.path)
                _account(os.path.getsize(self.path))
                return get(chain)
        except OSError:
            pass
        self.discard()
        return None

    def discard(self) -> None:
        """Close and remove the temp file (nothing when it was renamed into place)."""
        if self.handle is not None:
            with contextlib.suppress(OSError):
                self.handle.close()
            self.handle = None
        with contextlib.suppress(OSError):
            os.remove(self.tmp)
