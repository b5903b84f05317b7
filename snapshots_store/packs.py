"""Chunk references and reading key-group chunks, loose or packed, with few large reads.

A manifest's key-group chain lists *chunk refs*: a 64-hex object id names a loose ``chunk``
object (the whole object is the key group's chunk; every snapshot written before packs, and
any writer that still writes loose chunks), ``<pack id>:<key group>`` names that key group's
member of a ``pack`` object (see `objects.encode_pack`). A writer puts all the key groups an
epoch changed in one task into a few size-bounded packs — one durable write each instead of
one per key group — and a reader restores a key-group range by reading only the byte ranges
of its members, coalesced into long sequential reads, several at a time.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from snapshots_store.backends.base import Backend
from snapshots_store.errors import CorruptObjectError, InvalidNameError, ObjectNotFoundError
from snapshots_store.objects import (
    ObjectStore,
    PackIndex,
    PackMember,
    Sink,
    member_payload,
    member_payload_into,
    object_key,
    pack_head_length,
    pack_index,
)

#: a writer starts a new pack once this many payload bytes are in the current one
PACK_BYTES: Final = 64 * 1024**2
#: first read of a pack's index (one request for any pack of a few thousand members)
HEAD_READ: Final = 256 * 1024
#: members closer than this are read in one request (the gap is read and dropped)
COALESCE_GAP: Final = 1024**2
#: longest single read: long enough for the disk's sequential rate, short enough that a
#: task's range becomes several reads whose decompression and hashing run in parallel
MAX_READ: Final = 8 * 1024**2
#: largest read buffer a reading thread keeps for its next reads (a longer read gets its own)
KEEP_BUFFER: Final = 2 * MAX_READ
#: reads in flight at once (decompression and hashing release the GIL)
READ_THREADS: Final = 4
_INDEX_CACHE: Final = 256
_REF_RE: Final = re.compile(r"([0-9a-f]{64})(?::(0|[1-9][0-9]{0,4}))?")


def chunk_ref(pack_id: str, key_group: int) -> str:
    """The chain entry naming `key_group`'s member of a pack."""
    return f"{pack_id}:{key_group}"


def split_ref(ref: str) -> tuple[str, int | None]:
    """(object id, key group of a pack member or None for a loose chunk)."""
    match = _REF_RE.fullmatch(ref) if isinstance(ref, str) else None
    if match is None:
        raise InvalidNameError(
            str(ref), "a chunk ref is an object id or <pack id>:<key group> (64 hex, ':', int)"
        )
    member = match.group(2)
    return match.group(1), None if member is None else int(member)


def is_chunk_ref(value: object) -> bool:
    return isinstance(value, str) and _REF_RE.fullmatch(value) is not None


def is_packed(ref: str) -> bool:
    return split_ref(ref)[1] is not None


def ref_object(ref: str) -> str:
    """The object a chunk ref needs: the loose chunk or the pack."""
    return split_ref(ref)[0]


def ref_objects(refs: Iterable[str]) -> list[str]:
    """The objects of chunk refs, each once, in first-use order."""
    return list(dict.fromkeys(ref_object(r) for r in refs))


def plan_packs(sizes: Mapping[int, int], pack_bytes: int = PACK_BYTES) -> list[list[int]]:
    """Key groups (sorted) cut into consecutive packs of at most `pack_bytes` payload bytes
    (a larger single member gets a pack of its own)."""
    packs: list[list[int]] = []
    current: list[int] = []
    total = 0
    for kg in sorted(sizes):
        if current and total + sizes[kg] > pack_bytes:
            packs.append(current)
            current, total = [], 0
        current.append(kg)
        total += sizes[kg]
    if current:
        packs.append(current)
    return packs


class ChunkReader:
    """Reads chunk refs of one namespace; caches verified pack indexes (packs are immutable)."""

    def __init__(self, backend: Backend, objects: ObjectStore) -> None:
        self.backend = backend
        self.objects = objects
        self._indexes: OrderedDict[str, PackIndex] = OrderedDict()
        self._lock = threading.Lock()
        #: stored bytes of the chunks `read` returned so far (a restore's disk traffic)
        self.stored_bytes_read = 0
        self._buffers = threading.local()

    def index(self, pack_id: str) -> PackIndex:
        with self._lock:
            cached = self._indexes.get(pack_id)
            if cached is not None:
                self._indexes.move_to_end(pack_id)
                return cached
        key = object_key(pack_id)
        head = self.backend.get_range(key, 0, HEAD_READ)
        if head is None:
            raise ObjectNotFoundError(pack_id, "pack of key-group chunks")
        need = pack_head_length(pack_id, head)
        if need > len(head):
            rest = self.backend.get_range(key, len(head), need - len(head)) or b""
            head += rest
        index = pack_index(pack_id, head)
        with self._lock:
            self._indexes[pack_id] = index
            while len(self._indexes) > _INDEX_CACHE:
                self._indexes.popitem(last=False)
        return index

    def member(self, ref: str) -> tuple[PackIndex, PackMember]:
        pack_id, key_group = split_ref(ref)
        if key_group is None:
            raise InvalidNameError(ref, "not a packed chunk ref")
        index = self.index(pack_id)
        member = index.members.get(key_group)
        if member is None:
            raise CorruptObjectError(pack_id, f"the pack has no member for key group {key_group}")
        return index, member

    def stored_size(self, ref: str) -> int | None:
        """Stored (compressed) bytes of one chunk; None when its object is missing."""
        oid, key_group = split_ref(ref)
        if key_group is None:
            info = self.objects.stat(oid)
            return None if info is None else info.size
        try:
            return self.member(ref)[1].stored
        except ObjectNotFoundError:
            return None

    def _reads(self, refs: Sequence[str]) -> list[_Read]:
        """The reads of chunk refs: each loose chunk alone, the members of each pack in
        long sequential ranges (sorted by offset, neighbours coalesced by `_runs`)."""
        reads: list[_Read] = []
        by_pack: dict[str, list[tuple[int, PackMember]]] = {}
        for position, ref in enumerate(refs):
            oid, key_group = split_ref(ref)
            if key_group is None:
                reads.append((oid, [(position, PackMember(-1, 0, 0, 0, oid))], None))
                continue
            by_pack.setdefault(oid, []).append((position, self.member(ref)[1]))
        for pack_id, wanted in by_pack.items():
            index = self.index(pack_id)
            for run in _runs(sorted(wanted, key=lambda w: w[1].offset)):
                reads.append((pack_id, run, index))
        return reads

    def ranges(self, refs: Sequence[str]) -> list[tuple[str, int, int]]:
        """(object id, stored offset, length) of each read `read_each` makes for `refs`
        (a loose chunk: its whole object)."""
        out: list[tuple[str, int, int]] = []
        for oid, run, index in self._reads(refs):
            if index is None:
                info = self.objects.stat(oid)
                out.append((oid, 0, 0 if info is None else info.size))
                continue
            start = run[0][1].offset
            length = run[-1][1].offset + run[-1][1].stored - start
            out.append((oid, index.data_start + start, length))
        return out

    def prefetch(self, refs: Sequence[str]) -> int:
        """Tell the backend the ranges `read_each(refs)` will read (`Backend.prefetch`: the
        local backend starts reading them into the page cache); returns their bytes. Reads
        the packs' indexes it does not have yet (as the reads would)."""
        total = 0
        for oid, start, length in self.ranges(refs):
            self.backend.prefetch(object_key(oid), start, length)
            total += length
        return total

    def read(self, refs: Sequence[str], *, threads: int = READ_THREADS) -> list[bytes]:
        """Verified payloads of chunk refs, in order (see `read_each`)."""
        out: list[bytes | None] = [None] * len(refs)

        def keep(position: int, payload: bytes | None) -> None:
            out[position] = payload

        self.read_each(refs, keep, threads=threads)
        assert all(payload is not None for payload in out)
        return [payload for payload in out if payload is not None]

    def read_each(
        self,
        refs: Sequence[str],
        each: Callable[[int, bytes | None], None],
        *,
        sink: Callable[[int], Sink | None] | None = None,
        threads: int = READ_THREADS,
    ) -> int:
        """Call ``each(position in refs, verified payload)`` for every chunk ref, from the
        reading threads, as soon as its read is verified (any order; a caller's work on a
        payload overlaps the other reads). Members of one pack are read in long sequential
        ranges (sorted by offset, neighbours coalesced); up to `threads` ranges and loose
        chunks are read at once. An error of any read or of `each` is raised here.

        With `sink`, a format 2 member's payload may go to a file instead: ``sink(position)``
        returns a `Sink` such as an open binary file (or None: bytes as usual), the verified
        payload is written into it (`member_payload_into`, without a payload-sized buffer)
        and `each` gets None as the payload. Loose chunks and format 1 members always come
        as bytes. Returns the stored bytes of the chunks read (also added to
        `stored_bytes_read`)."""
        read = [0]
        jobs = self._reads(refs)

        def fetch(job: _Read) -> None:
            oid, run, index = job
            if index is None:
                loose = self.objects.get(oid, context="key-group chunk")[1]
                stored = self.objects.stat(oid)
                self._count(0 if stored is None else stored.size, read)
                each(run[0][0], loose)
                return
            start = run[0][1].offset
            length = run[-1][1].offset + run[-1][1].stored - start
            view = self._read_range(object_key(oid), index.data_start + start, length)
            if view is None:
                raise ObjectNotFoundError(oid, "pack of key-group chunks")
            for position, member in run:
                frame = view[member.offset - start : member.offset - start + member.stored]
                out = None if sink is None or member.frame_hash is None else sink(position)
                if out is None:
                    payload: bytes | None = member_payload(index, member, frame)
                else:
                    member_payload_into(index, member, frame, out)
                    payload = None
                self._count(member.stored, read)
                each(position, payload)

        if threads <= 1 or len(jobs) <= 1:
            for job in jobs:
                fetch(job)
        else:
            with ThreadPoolExecutor(max_workers=min(threads, len(jobs))) as pool:
                list(pool.map(fetch, jobs))
        return read[0]

    def _read_range(self, key: str, start: int, length: int) -> memoryview | None:
        """`length` stored bytes of `key` from `start` (fewer at its end; None: no such
        object), read into this thread's reused buffer when it is at most `KEEP_BUFFER`
        bytes: a fresh buffer per read costs a page fault per page of it, as much CPU as
        the read itself. The view is valid until this thread's next read."""
        if length > KEEP_BUFFER:
            buffer = bytearray(length)
        else:
            buffer = getattr(self._buffers, "buffer", None) or bytearray(0)
            if len(buffer) < length:
                buffer = bytearray(max(length, min(KEEP_BUFFER, 2 * len(buffer))))
                self._buffers.buffer = buffer
        got = self.backend.get_range_into(key, start, memoryview(buffer)[:length])
        return None if got is None else memoryview(buffer)[:got]

    def _count(self, stored: int, call: list[int]) -> None:
        with self._lock:
            self.stored_bytes_read += stored
            call[0] += stored


#: one read of `ChunkReader.read_each`: (object id, [(position in refs, member)], the pack's
#: index, or None for a loose chunk)
_Read = tuple[str, list[tuple[int, PackMember]], PackIndex | None]


def _runs(members: list[tuple[int, PackMember]]) -> list[list[tuple[int, PackMember]]]:
    """Members (sorted by offset) grouped into reads: neighbours within `COALESCE_GAP`,
    each read at most `MAX_READ` bytes (a larger member is read alone)."""
    runs: list[list[tuple[int, PackMember]]] = []
    for item in members:
        member = item[1]
        if runs:
            first, last = runs[-1][0][1], runs[-1][-1][1]
            gap = member.offset - (last.offset + last.stored)
            if gap <= COALESCE_GAP and member.offset + member.stored - first.offset <= MAX_READ:
                runs[-1].append(item)
                continue
        runs.append([item])
    return runs


__all__ = [
    "PACK_BYTES",
    "ChunkReader",
    "chunk_ref",
    "is_chunk_ref",
    "is_packed",
    "plan_packs",
    "ref_object",
    "ref_objects",
    "split_ref",
]
