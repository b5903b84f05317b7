"""Key-group state chunks: Arrow IPC payloads, base + deltas, and the executor-local cache.

A key group's state is a chain of chunk objects: a base chunk (every key) followed by delta
chunks (only the keys an epoch changed; ``_deleted`` marks removed keys). Materialising applies
the deltas in order. Chunks are immutable, so a materialised chain cached in the worker
process, keyed by the chain of chunk ids, is always valid.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runners.engine.hashing import canonical_keys
from snapshots_store import Repository
from snapshots_store.packs import READ_THREADS

DELETED = "_deleted"
CACHE_BYTES = 2 * 1024**3
#: Materialised chains are also written as Arrow files under this directory (machine-local),
#: so a task that lands on another Python worker still finds its key groups.
DISK_CACHE_ENV = "EPOCHAL_STATE_CACHE_DIR"
DISK_CACHE_BYTES = int(os.environ.get("EPOCHAL_STATE_CACHE_DISK_MB", "4096")) * 1024**2


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


def _disk_dir() -> str:
    return os.environ.get(DISK_CACHE_ENV) or os.path.join(
        tempfile.gettempdir(), f"epochal-state-cache-{os.getuid()}"
    )


def _disk_path(chain: tuple[str, ...]) -> str:
    digest = hashlib.sha256("\n".join(chain).encode()).hexdigest()
    return os.path.join(_disk_dir(), digest[:2], digest + ".arrow")


#: bytes this process wrote to the disk cache since its last eviction pass; a pass walks the
#: whole directory (every worker's files: tens of thousands after a run at M = 32,768), so it
#: runs once per 1/16 of the budget written, not per a number of files
_disk_written = 0


def _disk_put(entry: KeyGroupState, payload: bytes | None = None) -> None:
    """Write a materialised chain for the other workers of this machine (best effort: a full or
    read-only disk only costs a cache miss): a chain of one chunk as that chunk's payload as it
    is (an Arrow IPC stream, written without re-encoding), a longer one as an uncompressed
    Arrow file. The directory may exceed its budget by what the workers write between
    eviction passes (1/16 each)."""
    if DISK_CACHE_BYTES <= 0 or not entry.chain:
        return
    path = _disk_path(entry.chain)
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
        _disk_account(os.path.getsize(path))
    except OSError:  # a full disk: no partial file stays behind to fill it further
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _disk_account(size: int) -> None:
    """Count a file written to the disk cache; every 1/16 of the budget, evict."""
    global _disk_written
    with _lock:
        _disk_written += size
        evict = _disk_written >= DISK_CACHE_BYTES // 16
        if evict:
            _disk_written = 0
    if evict:
        _disk_evict()


_ARROW_FILE_MAGIC = b"ARROW1"


def _disk_get(chain: tuple[str, ...]) -> KeyGroupState | None:
    if DISK_CACHE_BYTES <= 0:
        return None
    try:
        source = pa.memory_map(_disk_path(chain), "r")
        if source.read(len(_ARROW_FILE_MAGIC)) == _ARROW_FILE_MAGIC:
            table = pa.ipc.open_file(source).read_all()
            sizes = tuple(json.loads((table.schema.metadata or {})[b"epochal.sizes"]))
            return KeyGroupState(chain, table.replace_schema_metadata(None), sizes)
        if len(chain) != 1:
            return None
        source.seek(0)
        chunk = pa.ipc.open_stream(source).read_all()
        return KeyGroupState(chain, _base(chunk), (source.size(),))
    except (OSError, pa.ArrowInvalid, KeyError, ValueError):
        return None


def _disk_evict() -> None:
    """Delete the least recently written files above the disk budget."""
    files = []
    for root, _, names in os.walk(_disk_dir()):
        for name in names:
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, full))
    total = sum(f[1] for f in files)
    for _, size, full in sorted(files):
        if total <= DISK_CACHE_BYTES:
            break
        with contextlib.suppress(OSError):
            os.remove(full)
        total -= size


def cache_put(entry: KeyGroupState, *, disk: bool = True, payload: bytes | None = None) -> None:
    """Remember a materialised chain in this worker (LRU bounded by bytes) and on local disk
    (`payload`: the chunk of a one-chunk chain, written to disk as it is)."""
    global _cache_bytes
    if disk:
        _disk_put(entry, payload)
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
            return entry
    entry = _disk_get(chain)
    with _lock:
        stats["hits" if entry is not None else "misses"] += 1
    if entry is not None:
        cache_put(entry, disk=False)
    return entry


def cache_clear() -> None:
    global _cache_bytes
    with _lock:
        _cache.clear()
        _cache_bytes = 0


def load_key_group(
    repo: Repository,
    chain: Sequence[str],
    key_columns: Sequence[str],
    schema: pa.Schema | None = None,
    *,
    use_cache: bool = True,
) -> KeyGroupState:
    """Materialised state of a chunk chain: from the cache, else from the longest cached prefix
    (``use_cache=False`` reads every chunk from the store, for verification)."""
    chain = tuple(chain)
    cached = cache_get(chain) if use_cache else None
    if cached is not None:
        return cached
    start: int = 0
    table: pa.Table | None = None
    sizes: tuple[int, ...] = ()
    for cut in range(len(chain) - 1 if use_cache else 0, 0, -1):
        prefix = cache_get(chain[:cut])
        if prefix is not None:
            start, table, sizes = cut, prefix.table, prefix.sizes
            break
    entry = _materialise(chain, start, table, sizes, repo.read_chunks(chain[start:]), key_columns)
    if use_cache:
        cache_put(entry)
    return entry


def _materialise(
    chain: tuple[str, ...],
    start: int,
    table: pa.Table | None,
    sizes: tuple[int, ...],
    payloads: Sequence[bytes],
    key_columns: Sequence[str],
) -> KeyGroupState:
    """The state of `chain` from the state of its first `start` chunks and the payloads of
    the rest."""
    size_list = list(sizes)
    for payload in payloads:
        size_list.append(len(payload))
        chunk = decode_table(payload)
        table = _base(chunk) if table is None else apply_delta(table, chunk, key_columns)
    assert table is not None
    return KeyGroupState(chain, table, tuple(size_list))


def _base(chunk: pa.Table) -> pa.Table:
    """The state a chain's first chunk holds: its live rows (no copy when none is deleted)."""
    if not pc.any(chunk.column(DELETED)).as_py():
        return chunk.drop_columns([DELETED])
    return chunk.filter(pc.invert(chunk.column(DELETED))).drop_columns([DELETED])


@dataclass
class Restore:
    """What `load_key_groups` read from the store: stored (compressed) and payload bytes, and
    the wall-clock (`time.time()`) span of reading and materialising them."""

    stored_bytes: int = 0
    payload_bytes: int = 0
    started: float = 0.0
    ended: float = 0.0


def load_key_groups(
    repo: Repository,
    chains: Mapping[int, Sequence[str]],
    key_columns: Sequence[str],
    *,
    disk: bool = False,
    threads: int = READ_THREADS,
) -> tuple[dict[int, KeyGroupState], Restore]:
    """Materialised state of many key groups (a task's range): cached chains from the cache,
    every other chunk in one `Repository.read_chunks` call, so the members of each pack are
    read in long sequential ranges, several at once. Materialised chains are cached in this
    worker's memory, and with `disk` in the machine's disk cache too (the restore stage: the
    epoch's tasks may run in other Python workers). `threads`: reads in flight at once."""
    states: dict[int, KeyGroupState] = {}
    todo: list[tuple[int, tuple[str, ...], int, pa.Table | None, tuple[int, ...]]] = []
    for kg, raw in chains.items():
        chain = tuple(raw)
        cached = cache_get(chain)
        if cached is not None:
            states[kg] = cached
            continue
        start: int = 0
        table: pa.Table | None = None
        sizes: tuple[int, ...] = ()
        for cut in range(len(chain) - 1, 0, -1):
            prefix = cache_get(chain[:cut])
            if prefix is not None:
                start, table, sizes = cut, prefix.table, prefix.sizes
                break
        todo.append((kg, chain, start, table, sizes))
    restore = Restore()
    if not todo:
        return states, restore
    restore.started = time.time()
    refs: list[str] = []
    slots: list[tuple[int, int]] = []  # per ref: (index in todo, index in its chain's rest)
    for i, (_, chain, start, _, _) in enumerate(todo):
        refs.extend(chain[start:])
        slots.extend((i, j) for j in range(len(chain) - start))
    got: list[list[bytes | None]] = [
        [None] * (len(chain) - start) for _, chain, start, _, _ in todo
    ]
    left = [len(chain) - start for _, chain, start, _, _ in todo]
    payload_bytes = 0
    files: dict[int, _CacheFile] = {}  # position -> the disk-cache file its payload went to

    def sink(position: int) -> _CacheFile | None:
        # a one-chunk chain's payload goes straight into its disk-cache file: no payload-sized
        # buffer, no second copy; the worker maps the file (a chain that is already there, or
        # a file that cannot be opened, comes as bytes)
        i, _ = slots[position]
        chain = todo[i][1]
        if len(chain) != 1 or DISK_CACHE_BYTES <= 0:
            return None
        path = _disk_path(chain)
        if os.path.exists(path):
            return None
        try:
            files[position] = _CacheFile(path)
        except OSError:
            return None
        return files[position]

    def each(position: int, payload: bytes | None) -> None:
        # in a reading thread: the key group's state once its last chunk is read
        nonlocal payload_bytes
        i, j = slots[position]
        kg, chain, start, table, sizes = todo[i]
        if payload is None:
            entry = files[position].finish(chain)
            if entry is not None:
                cache_put(entry, disk=False)
                with _lock:
                    states[kg] = entry
                    payload_bytes += entry.sizes[0]
                return
            payload = repo.read_chunk(refs[position])  # the file failed: read it again
        with _lock:
            got[i][j] = payload
            left[i] -= 1
            payload_bytes += len(payload)
            if left[i]:
                return
            payloads = [p for p in got[i] if p is not None]
            got[i] = []
        entry = _materialise(chain, start, table, sizes, payloads, key_columns)
        cache_put(entry, disk=disk, payload=payloads[0] if len(chain) == 1 else None)
        with _lock:
            states[kg] = entry

    try:
        restore.stored_bytes = repo.chunks.read_each(
            refs, each, sink=sink if disk else None, threads=threads
        )
    finally:
        for file in files.values():
            file.discard()
    restore.payload_bytes = payload_bytes
    restore.ended = time.time()
    return states, restore


#: stored bytes a restore task asks the store to read ahead of its claims
#: (`ChunkReader.prefetch`; ``$EPOCHAL_RESTORE_READ_AHEAD_MB``, 0: none): enough to keep the
#: disk streaming while the threads verify and decompress, bounded so a state larger than
#: memory is not read into the page cache long before it is needed (and evicted again)
READ_AHEAD = int(os.environ.get("EPOCHAL_RESTORE_READ_AHEAD_MB", "256")) * 1024**2


class Claims:
    """Batches of a restore stage's key groups, each taken by exactly one thread of one of
    the stage's tasks: a claim is a file created with ``O_EXCL`` in a directory every task
    sees (the driver's, with a local Spark master). A thread takes the next batch in order
    that nobody has taken, so the tasks share the work as they go, however late each
    starts and however fast each runs. Claims are never released: a batch whose task failed
    after claiming it is left to the epoch's tasks, which read what the cache lacks."""

    def __init__(self, directory: str, batches: int) -> None:
        self.directory = directory
        self.batches = batches
        self._next = 0  # next batch this process has not tried
        self._lock = threading.Condition()

    @property
    def position(self) -> int:
        """The next batch this process will try (every batch before it is taken)."""
        with self._lock:
            return self._next

    def claim(self) -> int | None:
        """The next batch nobody has taken, now this caller's; None when every batch is."""
        with self._lock:
            try:
                while self._next < self.batches:
                    batch = self._next
                    self._next += 1
                    try:
                        fd = os.open(
                            os.path.join(self.directory, str(batch)),
                            os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                            0o600,
                        )
                    except FileExistsError:
                        continue
                    except FileNotFoundError:  # the stage is over: its directory is gone
                        self._next = self.batches
                        return None
                    os.close(fd)
                    return batch
                return None
            finally:
                self._lock.notify_all()

    def wait_moved(self, position: int, timeout: float) -> None:
        """Until this process's position is past `position` (or `timeout` seconds)."""
        with self._lock:
            self._lock.wait_for(lambda: self._next > position, timeout)


def batches_of(key_groups: Sequence[int], count: int) -> list[list[int]]:
    """`key_groups` (sorted) cut into at most `count` consecutive batches of near-equal
    size: the units a restore stage's tasks claim."""
    groups = sorted(key_groups)
    count = max(1, min(count, len(groups)))
    return [groups[len(groups) * i // count : len(groups) * (i + 1) // count] for i in range(count)]


def restore_claimed(
    repo: Repository,
    chains: Mapping[int, Sequence[str]],
    batches: Sequence[Sequence[int]],
    claims: Claims,
    key_columns: Sequence[str],
    *,
    threads: int = READ_THREADS,
    read_ahead: int = READ_AHEAD,
) -> tuple[list[int], Restore]:
    """One restore task that shares the work with the stage's other tasks: `threads`
    threads each claim the next free batch (`claims`) and load its key groups into the
    machine's state cache (`load_key_groups` with ``disk``, one read at a time per
    thread), until none is left; meanwhile a read-ahead thread asks the store to start
    reading the batches ahead of the claims, up to `read_ahead` stored bytes ahead
    (`ChunkReader.prefetch`; 0: none). Returns the key groups of the batches this task
    claimed (in no order) and what it read for them."""
    loaded: list[int] = []
    payload_bytes = stored_bytes = 0
    firsts: list[float] = []
    errors: list[BaseException] = []
    done = threading.Event()
    guard = threading.Lock()

    def work() -> None:
        nonlocal payload_bytes, stored_bytes
        try:
            while not done.is_set():
                batch = claims.claim()
                if batch is None:
                    return
                mine = {kg: chains[kg] for kg in batches[batch]}
                _, got = load_key_groups(repo, mine, key_columns, disk=True, threads=1)
                with guard:
                    loaded.extend(mine)
                    payload_bytes += got.payload_bytes
                    stored_bytes += got.stored_bytes
                    if got.started:
                        firsts.append(got.started)
        except BaseException as exc:  # raised below, in the task
            with guard:
                errors.append(exc)
            done.set()

    def ahead() -> None:
        sizes: dict[int, int] = {}
        batch = 0
        while not done.is_set():
            position = claims.position
            batch = max(batch, position)
            if batch >= len(batches):
                return
            if sum(sizes.get(b, 0) for b in range(position, batch)) >= read_ahead:
                claims.wait_moved(position, 0.05)
                continue
            try:
                sizes[batch] = repo.chunks.prefetch(
                    [ref for kg in batches[batch] for ref in chains[kg]]
                )
            except Exception:  # a hint only: the reads themselves report any problem
                return
            batch += 1

    helpers = [threading.Thread(target=work, name=f"restore-{i}") for i in range(threads)]
    if read_ahead > 0:
        helpers.append(threading.Thread(target=ahead, name="restore-read-ahead", daemon=True))
    for thread in helpers:
        thread.start()
    for thread in helpers[:threads]:
        thread.join()
    done.set()
    for thread in helpers[threads:]:
        thread.join()
    if errors:
        raise errors[0]
    restore = Restore(
        stored_bytes=stored_bytes,
        payload_bytes=payload_bytes,
        started=min(firsts, default=0.0),
        ended=time.time() if loaded else 0.0,
    )
    return loaded, restore


class _CacheFile:
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
                _disk_account(os.path.getsize(self.path))
                return _disk_get(chain)
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


def empty_state(schema: pa.Schema) -> KeyGroupState:
    return KeyGroupState((), schema.empty_table(), ())


def with_deleted(table: pa.Table, deleted: np.ndarray | None = None) -> pa.Table:
    """The table with the ``_deleted`` flag column chunks carry."""
    flags = np.zeros(table.num_rows, dtype=bool) if deleted is None else deleted
    return table.append_column(DELETED, pa.array(flags, type=pa.bool_()))
