"""Deduplication within the watermark (Spark's ``dropDuplicatesWithinWatermark``).

A job declared with ``dedup_within_watermark=True`` emits each record whose key (the job's
key columns: the columns that identify a duplicate) it has not seen while that key's first
record is within the watermark's delay, and drops the others. An epoch applying watermark
``W`` (watermark.py):

- drops a record with event time ``t <= W`` as late (a dead letter ``late``, as Spark drops
  it before looking at its state);
- forgets a key whose first record's ``t + delay <= W`` (Spark evicts it at the end of the
  micro-batch whose watermark reached it, which is the watermark the next data batch sees);
- emits the first record (in input order) of every key it does not remember, all its
  columns, and remembers the key until ``t + delay`` — later records of the key are dropped,
  even with another event time, until the watermark passes that instant.

The state of a key is one row of its key group's chunk: the key column(s) and
``expires_at`` (the first record's event time plus the delay, milliseconds), so it moves with
its key group on a rescale and is restored by a rollback or a fork. The snapshot's
``extra.event_time.due`` holds each key group's earliest ``expires_at``, so an epoch without
input forgets the keys the watermark passed, as the no-data epoch closes windows.
Everything is computed per key group with pyarrow's hash lookups, never per record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runners.engine.eventtime.watermark import Closed, EventTimeError, event_times
from runners.engine.state import codec

if TYPE_CHECKING:
    from runners.engine.state.codec import KeyGroupState
    from runners.engine.state.writer import ChunkWriter

#: a `runners.engine.job.Job` (not imported: the job module imports this one)
Job = Any

EXPIRES_AT = "expires_at"


def check(job: Job) -> None:
    """Refuse a deduplicating job the engine cannot run, naming what to change."""
    if not job.dedup_within_watermark:
        return
    if job.event_time is None:
        raise EventTimeError(
            f"job {job.name!r}: dedup_within_watermark needs event_time=EventTime(column, "
            "delay_ms) (a key is remembered until the watermark passes its first record's "
            "event time plus the delay)"
        )
    if job.window is not None:
        raise EventTimeError(
            f"job {job.name!r}: dedup_within_watermark emits records, a window aggregates "
            "them: deduplicate in one job and window its output in another"
        )
    if EXPIRES_AT in job.key_columns:
        raise EventTimeError(
            f"job {job.name!r}: key column {EXPIRES_AT!r} clashes with the deduplication state"
        )


def reduce(
    job: Job,
    watermark_ms: int,
    table: pa.Table | None,
    slices: Sequence[tuple[int, int, int]],
    due: Sequence[int],
    states: Mapping[int, KeyGroupState],
    writer: ChunkWriter,
) -> Closed:
    """Deduplicate the epoch's records (`table`: sorted by key group and input position;
    `slices`: (kg, start, length)) against their key groups' state, forget the keys the
    watermark passed — also in the key groups of `due` without input — queue each changed
    key group's chunk on `writer` and return the emitted records."""
    parts = {kg: (start, length) for kg, start, length in slices}
    closed = Closed([], {})
    for kg in sorted(set(parts) | set(due)):
        old = states.get(kg)
        part = table.slice(*parts[kg]) if kg in parts and table is not None else None
        if part is None:
            if old is None or not old.table.num_rows:
                continue
            schema = old.table.schema
        else:
            fields = [part.schema.field(c) for c in job.key_columns]
            schema = pa.schema([*fields, pa.field(EXPIRES_AT, pa.int64())])
        if old is None:
            old = codec.empty_state(schema)
        state = codec.conform(old.table, schema)
        delta, emitted = _deduplicate(job, watermark_ms, state, part)
        if not delta.num_rows:
            continue
        new_state = codec.apply_delta(state, delta, list(job.key_columns))
        writer.write(kg, old, new_state, delta)
        if emitted is not None and emitted.num_rows:
            closed.outputs.append(emitted)
        expires = new_state.column(EXPIRES_AT)
        closed.due[kg] = int(pc.min(expires).as_py()) if new_state.num_rows else None
    return closed


def _deduplicate(
    job: Job, watermark_ms: int, state: pa.Table, part: pa.Table | None
) -> tuple[pa.Table, pa.Table | None]:
    """(delta, emitted records) of one key group: the keys the watermark passed deleted,
    the first record of each key not remembered emitted and remembered."""
    keys = list(job.key_columns)
    expires = np.asarray(state.column(EXPIRES_AT).to_numpy(zero_copy_only=False), np.int64)
    expired = expires <= watermark_ms
    live = state.filter(pa.array(~expired))
    emitted = None
    remembered = state.schema.empty_table()
    if part is not None and part.num_rows:
        # the first record of each key: codes are numbered in order of first appearance
        codes = pc.dictionary_encode(codec.lookup_key(part, keys)).indices
        firsts = np.unique(codes.to_numpy(zero_copy_only=False), return_index=True)[1]
        emitted = part.take(pa.array(firsts))
        if live.num_rows:
            seen = pc.is_in(codec.lookup_key(emitted, keys), codec.lookup_key(live, keys))
            emitted = emitted.filter(pc.invert(seen))
        assert job.event_time is not None
        ts = event_times(emitted.column(job.event_time.column))
        remembered = emitted.select(keys).append_column(
            EXPIRES_AT, pa.array(ts + job.event_time.delay_ms, pa.int64())
        )
        remembered = remembered.cast(state.schema)
    gone = state.filter(pa.array(expired))
    if gone.num_rows and remembered.num_rows:  # a forgotten key seen again: remembered anew
        again = pc.is_in(codec.lookup_key(gone, keys), codec.lookup_key(remembered, keys))
        gone = gone.filter(pc.invert(again))
    delta = pa.concat_tables([
        codec.with_deleted(gone, np.ones(gone.num_rows, dtype=bool)),
        codec.with_deleted(remembered),
    ])  # fmt: skip
    return delta, emitted
