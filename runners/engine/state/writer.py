"""The one writer of key-group chunks: an epoch's reduce task and the state operations
(rehash, migrations) queue each key group's new chunk, and the writer stores them as packs
(`Repository.put_chunks`: one durable write per `PACK_BYTES` of chunks, not one per key
group), tracking the new chains and the bytes written.

It is a small state machine, as Quix Streams' state transactions are: **STARTED** accepts
writes; `prepare()` stores what is still queued and returns the chains — **PREPARED**, after
which a write is refused (it would never reach a chain the caller already took); `complete()`
closes it (**COMPLETE**). An error while storing, or leaving a ``with`` block by an
exception, makes it **FAILED**, and every later call is refused: what it wrote is
unreferenced, and the epoch or operation is retried from the start.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import TracebackType

import pyarrow as pa

from runners.engine.state.codec import KeyGroupState, empty_state, encode_table, with_deleted
from runners.engine.state.memory_cache import cache_put
from snapshots_store import Repository
from snapshots_store.packs import PACK_BYTES


class WriterState(enum.Enum):
    STARTED = "started"
    PREPARED = "prepared"
    COMPLETE = "complete"
    FAILED = "failed"


class ChunkWriterError(RuntimeError):
    """A chunk writer was used out of order (a write after `prepare`, a second `prepare`,
    any use after a failure)."""


@dataclass
class _Queued:
    """A key group's new chunk, stored with the next pack."""

    old: KeyGroupState
    new_state: pa.Table
    payload: bytes
    is_delta: bool
    first_row: int
    rows: int


class ChunkWriter:
    """Writes key groups' new chunks (see the module docstring).

    `compaction_ratio`: a key group gets a delta chunk while its deltas' bytes stay within
    this multiple of its base's, else a new base. `cache`: keep each new chain's state in the
    state caches (an epoch's tasks: the next epoch finds it)."""

    def __init__(self, repo: Repository, *, compaction_ratio: float = 1.0,
                 cache: bool = False) -> None:  # fmt: skip
        self.repo = repo
        self.compaction_ratio = compaction_ratio
        self.cache = cache
        self.state = WriterState.STARTED
        #: key group -> its new chain (complete once prepared)
        self.chains: dict[int, tuple[str, ...]] = {}
        #: stored chunk payload bytes, and the encoded deltas' bytes (the changed state)
        self.bytes_written = 0
        self.changed_state_bytes = 0
        self.chunks_written = 0
        #: (chunk ref, first row, rows) of each key group's changed rows, in write order
        self.output_refs: list[tuple[str, int, int]] = []
        self._queued: dict[int, _Queued] = {}
        self._queued_bytes = 0

    # -- writes (STARTED only) ----------------------------------------------------------------

    def write(self, kg: int, old: KeyGroupState, new_state: pa.Table, delta: pa.Table) -> None:
        """Queue a key group's new state after an epoch: one delta chunk (`delta`, with the
        ``_deleted`` flags), or a new base when the deltas outgrow it. The changed rows are
        the whole delta, or the tail of the new base (the kept rows, then the changed)."""
        self._check(WriterState.STARTED, "write")
        delta_payload = encode_table(delta)
        self.changed_state_bytes += len(delta_payload)
        deltas_bytes = sum(old.sizes[1:]) + len(delta_payload)
        if old.chain and deltas_bytes <= old.sizes[0] * self.compaction_ratio:
            queued = _Queued(old, new_state, delta_payload, True, 0, delta.num_rows)
        else:
            payload = encode_table(with_deleted(new_state))
            first = new_state.num_rows - delta.num_rows
            queued = _Queued(old, new_state, payload, False, first, delta.num_rows)
        self._queue(kg, queued)

    def write_base(self, kg: int, table: pa.Table) -> None:
        """Queue a key group's whole state as a new base chunk (a chain of one)."""
        self._check(WriterState.STARTED, "write")
        payload = encode_table(with_deleted(table))
        self._queue(kg, _Queued(empty_state(table.schema), table, payload, False, 0,
                                table.num_rows))  # fmt: skip

    def _queue(self, kg: int, queued: _Queued) -> None:
        self._queued[kg] = queued
        self._queued_bytes += len(queued.payload)
        if self._queued_bytes >= PACK_BYTES:
            self._store()

    # -- the transitions ----------------------------------------------------------------------

    def prepare(self) -> dict[int, tuple[str, ...]]:
        """Store what is queued; STARTED -> PREPARED. Returns every new chain."""
        self._check(WriterState.STARTED, "prepare")
        self._store()
        self.state = WriterState.PREPARED
        return self.chains

    def complete(self) -> None:
        """PREPARED -> COMPLETE: the caller has taken the chains."""
        self._check(WriterState.PREPARED, "complete")
        self.state = WriterState.COMPLETE

    def fail(self) -> None:
        """Any state -> FAILED: nothing more is written."""
        self.state = WriterState.FAILED

    def __enter__(self) -> ChunkWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        if kind is not None:
            self.fail()
        elif self.state is WriterState.PREPARED:
            self.complete()
        elif self.state is WriterState.STARTED:
            self.fail()
            raise ChunkWriterError(
                "a chunk writer was closed without prepare(): its queued chunks were never "
                "stored; call prepare() and use the chains it returns"
            )

    def _check(self, wanted: WriterState, action: str) -> None:
        if self.state is not wanted:
            raise ChunkWriterError(
                f"cannot {action}: the chunk writer is {self.state.value}, not "
                f"{wanted.value} ({_ADVICE[self.state]})"
            )

    def _store(self) -> None:
        """Store the queued chunks as packs and record their chains."""
        if not self._queued:
            return
        try:
            refs = self.repo.put_chunks({kg: q.payload for kg, q in self._queued.items()})
        except BaseException:
            self.fail()
            raise
        for kg, q in self._queued.items():
            ref = refs[kg]
            if q.is_delta:
                chain, sizes = (*q.old.chain, ref), (*q.old.sizes, len(q.payload))
            else:
                chain, sizes = (ref,), (len(q.payload),)
            self.bytes_written += len(q.payload)
            self.chunks_written += 1
            self.chains[kg] = chain
            if self.cache:
                state = KeyGroupState(chain, q.new_state, sizes)
                cache_put(state, payload=None if q.is_delta else q.payload)
            self.output_refs.append((ref, q.first_row, q.rows))
        self._queued.clear()
        self._queued_bytes = 0


_ADVICE = {
    WriterState.STARTED: "prepare() it first",
    WriterState.PREPARED: "it was prepared: its chains are final; start a new writer",
    WriterState.COMPLETE: "it is complete: start a new writer",
    WriterState.FAILED: "a store failed or its block raised: retry with a new writer",
}


__all__ = ["ChunkWriter", "ChunkWriterError", "WriterState"]
