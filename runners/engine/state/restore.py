"""Reading key-group state from the store into the caches: one key group, a task's key
groups at once, and the restore stage's tasks sharing the work by claiming batches.

A task reads every chunk it lacks in one `Repository.read_chunks` / ``read_each`` call, so
the members of each pack are read in long sequential ranges, several at once; each key group
is materialised in the reading thread as soon as its last chunk arrives, overlapping the
other reads (docs/engine.md, "Epoch execution and the commit protocol").
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from runners import config
from runners.engine.state import disk_cache
from runners.engine.state.codec import KeyGroupState, materialise
from runners.engine.state.memory_cache import cache_get, cache_put, cached_prefix
from snapshots_store import Repository
from snapshots_store.packs import READ_THREADS


@dataclass
class Restore:
    """What `load_key_groups` read from the store: stored (compressed) and payload bytes, and
    the wall-clock (`time.time()`) span of reading and materialising them."""

    stored_bytes: int = 0
    payload_bytes: int = 0
    started: float = 0.0
    ended: float = 0.0


def load_key_group(
    repo: Repository,
    chain: Sequence[str],
    key_columns: Sequence[str],
    *,
    use_cache: bool = True,
) -> KeyGroupState:
    """Materialised state of a chunk chain: from the cache, else from the longest cached prefix
    (``use_cache=False`` reads every chunk from the store, for verification)."""
    chain = tuple(chain)
    if not use_cache:
        return materialise(chain, 0, None, (), repo.read_chunks(chain), key_columns)
    cached = cache_get(chain)
    if cached is not None:
        return cached
    start, prefix = cached_prefix(chain)
    table, sizes = (None, ()) if prefix is None else (prefix.table, prefix.sizes)
    entry = materialise(chain, start, table, sizes, repo.read_chunks(chain[start:]), key_columns)
    cache_put(entry)
    return entry


@dataclass
class _Todo:
    """A key group to read: its chain and the cached state of its first `start` chunks."""

    kg: int
    chain: tuple[str, ...]
    start: int
    prefix: KeyGroupState | None
    got: list[bytes | None] = field(default_factory=list)
    left: int = 0


class _Loading:
    """One `load_key_groups` call: the refs it reads, and each key group's payloads as
    they arrive (in the store's reading threads)."""

    def __init__(self, repo: Repository, todo: list[_Todo], key_columns: Sequence[str],
                 disk: bool) -> None:  # fmt: skip
        self.repo, self.todo, self.key_columns, self.disk = repo, todo, key_columns, disk
        self.refs: list[str] = []
        self.slots: list[tuple[int, int]] = []  # per ref: (index in todo, index in its rest)
        for i, item in enumerate(todo):
            rest = item.chain[item.start :]
            self.refs.extend(rest)
            self.slots.extend((i, j) for j in range(len(rest)))
            item.got, item.left = [None] * len(rest), len(rest)
        self.states: dict[int, KeyGroupState] = {}
        self.payload_bytes = 0
        self.files: dict[int, disk_cache.CacheFile] = {}  # position -> its disk-cache file
        self.lock = threading.Lock()

    def sink(self, position: int) -> disk_cache.CacheFile | None:
        """A one-chunk chain's payload goes straight into its disk-cache file: no
        payload-sized buffer, no second copy; the worker maps the file (a chain that is
        already there, or a file that cannot be opened, comes as bytes)."""
        chain = self.todo[self.slots[position][0]].chain
        if len(chain) != 1 or disk_cache.budget() <= 0:
            return None
        path = disk_cache.path_of(chain)
        if os.path.exists(path):
            return None
        try:
            self.files[position] = disk_cache.CacheFile(path)
        except OSError:
            return None
        return self.files[position]

    def each(self, position: int, payload: bytes | None) -> None:
        """In a reading thread: the key group's state once its last chunk is read."""
        i, j = self.slots[position]
        item = self.todo[i]
        if payload is None:
            entry = self.files[position].finish(item.chain)
            if entry is not None:
                cache_put(entry, disk=False)
                with self.lock:
                    self.states[item.kg] = entry
                    self.payload_bytes += entry.sizes[0]
                return
            payload = self.repo.read_chunk(self.refs[position])  # the file failed: again
        with self.lock:
            item.got[j] = payload
            item.left -= 1
            self.payload_bytes += len(payload)
            if item.left:
                return
            payloads = [p for p in item.got if p is not None]
            item.got = []
        prefix = item.prefix
        table, sizes = (None, ()) if prefix is None else (prefix.table, prefix.sizes)
        entry = materialise(item.chain, item.start, table, sizes, payloads, self.key_columns)
        one = payloads[0] if len(item.chain) == 1 else None
        cache_put(entry, disk=self.disk, payload=one)
        with self.lock:
            self.states[item.kg] = entry


def load_key_groups(
    repo: Repository,
    chains: Mapping[int, Sequence[str]],
    key_columns: Sequence[str],
    *,
    disk: bool = False,
    threads: int = READ_THREADS,
) -> tuple[dict[int, KeyGroupState], Restore]:
    """Materialised state of many key groups (a task's range): cached chains from the cache,
    every other chunk in one read of the store, so the members of each pack are read in long
    sequential ranges, several at once. Materialised chains are cached in this worker's
    memory, and with `disk` in the machine's disk cache too (the restore stage: the epoch's
    tasks may run in other Python workers). `threads`: reads in flight at once."""
    states: dict[int, KeyGroupState] = {}
    todo: list[_Todo] = []
    for kg, raw in chains.items():
        chain = tuple(raw)
        cached = cache_get(chain)
        if cached is not None:
            states[kg] = cached
        else:
            todo.append(_Todo(kg, chain, *cached_prefix(chain)))
    restore = Restore()
    if not todo:
        return states, restore
    restore.started = time.time()
    loading = _Loading(repo, todo, key_columns, disk)
    try:
        restore.stored_bytes = repo.chunks.read_each(
            loading.refs, loading.each, sink=loading.sink if disk else None, threads=threads
        )
    finally:
        for file in loading.files.values():
            file.discard()
    states.update(loading.states)
    restore.payload_bytes = loading.payload_bytes
    restore.ended = time.time()
    return states, restore


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


class _ClaimedRestore:
    """The threads of one `restore_claimed` task and what they loaded."""

    def __init__(self, repo: Repository, chains: Mapping[int, Sequence[str]],
                 batches: Sequence[Sequence[int]], claims: Claims,
                 key_columns: Sequence[str]) -> None:  # fmt: skip
        self.repo, self.chains, self.batches = repo, chains, batches
        self.claims, self.key_columns = claims, key_columns
        self.loaded: list[int] = []
        self.payload_bytes = self.stored_bytes = 0
        self.firsts: list[float] = []
        self.errors: list[BaseException] = []
        self.done = threading.Event()
        self.guard = threading.Lock()

    def work(self) -> None:
        """A loading thread: claim the next free batch and load it, until none is left."""
        try:
            while not self.done.is_set():
                batch = self.claims.claim()
                if batch is None:
                    return
                mine = {kg: self.chains[kg] for kg in self.batches[batch]}
                _, got = load_key_groups(self.repo, mine, self.key_columns, disk=True, threads=1)
                with self.guard:
                    self.loaded.extend(mine)
                    self.payload_bytes += got.payload_bytes
                    self.stored_bytes += got.stored_bytes
                    if got.started:
                        self.firsts.append(got.started)
        except BaseException as exc:  # raised by restore_claimed, in the task
            with self.guard:
                self.errors.append(exc)
            self.done.set()

    def ahead(self, read_ahead: int) -> None:
        """The read-ahead thread: ask the store to read the batches after the claims."""
        sizes: dict[int, int] = {}
        batch = 0
        while not self.done.is_set():
            position = self.claims.position
            batch = max(batch, position)
            if batch >= len(self.batches):
                return
            if sum(sizes.get(b, 0) for b in range(position, batch)) >= read_ahead:
                self.claims.wait_moved(position, 0.05)
                continue
            refs = [ref for kg in self.batches[batch] for ref in self.chains[kg]]
            try:
                sizes[batch] = self.repo.chunks.prefetch(refs)
            except Exception:  # a hint only: the reads themselves report any problem
                return
            batch += 1


def restore_claimed(
    repo: Repository,
    chains: Mapping[int, Sequence[str]],
    batches: Sequence[Sequence[int]],
    claims: Claims,
    key_columns: Sequence[str],
    *,
    threads: int = READ_THREADS,
    read_ahead: int | None = None,
) -> tuple[list[int], Restore]:
    """One restore task that shares the work with the stage's other tasks: `threads`
    threads each claim the next free batch (`claims`) and load its key groups into the
    machine's state cache (`load_key_groups` with ``disk``, one read at a time per
    thread), until none is left; meanwhile a read-ahead thread asks the store to start
    reading the batches ahead of the claims, up to `read_ahead` stored bytes ahead
    (`ChunkReader.prefetch`; 0: none; default ``$EPOCHAL_RESTORE_READ_AHEAD_MB``). Returns
    the key groups of the batches this task claimed (in no order) and what it read."""
    if read_ahead is None:
        read_ahead = config.current().restore_read_ahead_bytes
    run = _ClaimedRestore(repo, chains, batches, claims, key_columns)
    helpers = [threading.Thread(target=run.work, name=f"restore-{i}") for i in range(threads)]
    if read_ahead > 0:
        helpers.append(threading.Thread(target=run.ahead, args=(read_ahead,),
                                        name="restore-read-ahead", daemon=True))  # fmt: skip
    for thread in helpers:
        thread.start()
    for thread in helpers[:threads]:
        thread.join()
    run.done.set()
    for thread in helpers[threads:]:
        thread.join()
    if run.errors:
        raise run.errors[0]
    restore = Restore(
        stored_bytes=run.stored_bytes,
        payload_bytes=run.payload_bytes,
        started=min(run.firsts, default=0.0),
        ended=time.time() if run.loaded else 0.0,
    )
    return run.loaded, restore


__all__ = [
    "Claims",
    "Restore",
    "batches_of",
    "load_key_group",
    "load_key_groups",
    "restore_claimed",
]
