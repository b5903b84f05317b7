"""Windowed aggregation in the vectorised path: tumbling, sliding (hop) and session event-time
windows.

A record with event time ``t`` belongs to every window ``[s, s + size)`` with ``s`` a multiple
of the slide and ``s <= t < s + size`` (Spark's ``window(ts, size, slide)``). With session
windows of gap ``g`` (Spark's ``session_window(ts, g)``, Flink's ``EventTimeSessionWindows``) a
record opens ``[t, t + g)`` and the windows of a key that overlap or touch merge into one
session ``[first event, last event + g)`` — within an epoch and with the sessions its key
kept from earlier epochs, so a record can bridge two open sessions (grouping.py). An epoch
applies its parent's watermark ``W`` (watermark.py):

- a (record, window) pair whose window ended at or before ``W`` is dropped; a record with no
  window left (its latest window ended at or before ``W``) is a dead letter with reason
  ``late``, counted in the epoch's ``late_records``;
- output mode ``append`` emits one final row per key and window once ``W`` passes the window's
  end (``end <= W``), then drops the window's state; ``update`` emits every window the epoch
  changed with its running values, and drops a window's state once ``W`` passes its end.

For sessions, the windows the watermark passed close first (as Spark evicts them in the
no-data batch the moved watermark runs, before the next input); a record whose own session
``[t, t + g)`` ended at or before ``W`` is late, even when it touches an open session (Spark
drops it before merging); the others merge with the open sessions.

The state of a key is one row in its key group's chunk: the key column(s), ``window_start``
(a sorted list of the starts of its open windows; sessions also ``window_end``, their ends)
and one list per aggregation (``count``, ``sum_value``, …) holding each open window's running
value. So a key's windows move with its
key group on a rescale and are restored by a rollback or a fork, and the state operations
(rehash, transform) see ordinary keyed rows. Everything is computed with pyarrow hash
aggregation and numpy over group codes, never per record in Python.

Per key group the snapshot also records the earliest end of its open windows
(``extra.event_time.due``): an epoch visits the key groups its input touches and those whose
earliest window the watermark has passed, so a window closes even when its key brings no more
records; when the source has no new data but windows are due, the runner commits an epoch
without input that only closes them (as Spark's no-data micro-batch).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runners.engine.eventtime import grouping, joins
from runners.engine.eventtime.watermark import LATE, Closed, EventTimeError, event_times
from runners.engine.sources import DeadLetter, Split
from runners.engine.state import codec

if TYPE_CHECKING:
    from runners.engine.aggregations import Aggregation
    from runners.engine.state.codec import KeyGroupState
    from runners.engine.state.writer import ChunkWriter

#: a `runners.engine.job.Job` (not imported: the job module imports this one)
Job = Any

WINDOW_START = "window_start"
WINDOW_END = "window_end"
OUTPUT_MODES = ("append", "update")
#: the built-in aggregations a window can compute (order-free, so any split of the input
#: combines to the same value)
WINDOW_AGGREGATIONS = ("count", "sum", "min", "max")
KG = "_kg"
SEQ = "_seq"
_CODE = "_code"
_NEW = "_new"


def _check_mode(output_mode: str) -> None:
    if output_mode not in OUTPUT_MODES:
        raise EventTimeError(
            f"window output_mode must be one of {', '.join(OUTPUT_MODES)}, not {output_mode!r}"
        )


@dataclass(frozen=True)
class Window:
    """Windows of `size_ms` starting every `slide_ms` (tumbling: slide = size)."""

    size_ms: int
    slide_ms: int
    output_mode: str = "append"

    def __post_init__(self) -> None:
        for name in ("size_ms", "slide_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise EventTimeError(f"window {name} must be a positive int, not {value!r}")
        if self.slide_ms > self.size_ms:
            raise EventTimeError(
                f"window slide {self.slide_ms} ms exceeds its size {self.size_ms} ms: records "
                "between windows would belong to none"
            )
        _check_mode(self.output_mode)

    @property
    def per_record(self) -> int:
        """How many windows a record can belong to."""
        return -(-self.size_ms // self.slide_ms)

    def latest_end(self, ts: np.ndarray) -> np.ndarray:
        """End of the latest window each event time belongs to."""
        return ts // self.slide_ms * self.slide_ms + self.size_ms

    def describe(self) -> dict[str, Any]:
        return {"size_ms": self.size_ms, "slide_ms": self.slide_ms, "mode": self.output_mode}


@dataclass(frozen=True)
class SessionWindow:
    """Sessions of a key: records less than `gap_ms` apart, ended `gap_ms` after the last."""

    gap_ms: int
    output_mode: str = "append"

    def __post_init__(self) -> None:
        value = self.gap_ms
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise EventTimeError(f"session gap_ms must be a positive int, not {value!r}")
        _check_mode(self.output_mode)

    def latest_end(self, ts: np.ndarray) -> np.ndarray:
        """End of each record's own session ``[t, t + gap)``."""
        return ts + self.gap_ms

    def describe(self) -> dict[str, Any]:
        return {"gap_ms": self.gap_ms, "mode": self.output_mode}


def tumbling(size_ms: int, *, output_mode: str = "append") -> Window:
    """Consecutive windows of `size_ms` (Spark's ``window(ts, size)``)."""
    return Window(size_ms, size_ms, output_mode)


def sliding(size_ms: int, slide_ms: int, *, output_mode: str = "append") -> Window:
    """Windows of `size_ms` starting every `slide_ms` (Spark's ``window(ts, size, slide)``)."""
    return Window(size_ms, slide_ms, output_mode)


def session(gap_ms: int, *, output_mode: str = "append") -> SessionWindow:
    """Session windows closing `gap_ms` after a key's last record (Spark's
    ``session_window(ts, gap)``, Flink's ``EventTimeSessionWindows.withGap``)."""
    return SessionWindow(gap_ms, output_mode)


def check(job: Job) -> None:
    """Refuse a windowed job the engine cannot run, naming what to change."""
    if job.window is None:
        return
    if job.event_time is None:
        raise EventTimeError(
            f"job {job.name!r}: a window needs event_time=EventTime(column, delay_ms) "
            "(the watermark closes windows)"
        )
    if job.aggregate is None:
        raise EventTimeError(f"job {job.name!r}: a window needs aggregate=[…] (built-ins)")
    for a in job.aggregations:
        if a.kind not in WINDOW_AGGREGATIONS:
            raise EventTimeError(
                f"job {job.name!r}: aggregation {a.name!r} cannot run in a window; use "
                f"{', '.join(WINDOW_AGGREGATIONS)}"
            )
    clash = {WINDOW_START, WINDOW_END} & set(job.key_columns)
    if clash:
        raise EventTimeError(f"job {job.name!r}: key columns {sorted(clash)} clash with a window")


# -- reading: late records, event-time maxima --------------------------------------------


def drop_late(
    job: Job, watermark_ms: int, table: pa.Table, split: Split
) -> tuple[pa.Table, list[DeadLetter], np.ndarray]:
    """(records to process, dead letters, event times of the valid records): records without
    an event time are dead letters ``missing event time``; with a window, records whose every
    window (their own session) ended at or before the watermark, and in an interval join or
    with deduplication records whose event time is at or before it, are dead letters ``late``."""
    assert job.event_time is not None
    column = job.event_time.column
    if column not in table.column_names:
        raise EventTimeError(
            f"job {job.name!r}: the source's records have no event-time column {column!r} "
            f"(columns: {table.column_names})"
        )
    dead: list[DeadLetter] = []
    positions = np.arange(table.num_rows, dtype=np.int64)  # rows of the split as read
    nulls = table.column(column).is_null()
    if table.num_rows and pc.any(nulls).as_py():
        dead += _dead(table, nulls, positions, split, "missing event time")
        valid = pc.invert(nulls)
        table = table.filter(valid)
        positions = positions[np.asarray(valid.to_numpy(zero_copy_only=False), dtype=bool)]
    ts = event_times(table.column(column))
    if job.window is not None:
        deadline = job.window.latest_end(ts)
    elif joins.is_join(job) or job.dedup_within_watermark:  # Spark drops their t <= W
        deadline = ts
    else:
        return table, dead, ts
    late = deadline <= watermark_ms
    if late.any():
        dead += _dead(table, pa.array(late), positions, split, LATE)
        table = table.filter(pa.array(~late))
        ts = ts[~late]
    return table, dead, ts


def _dead(
    table: pa.Table,
    mask: pa.Array | pa.ChunkedArray,
    positions: np.ndarray,
    split: Split,
    reason: str,
) -> list[DeadLetter]:
    """Dead letters of the masked rows; the offset is the split's start plus the row's
    position among the rows the split's reader returned (as for a missing key)."""
    rows = positions[np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)]
    records = table.filter(mask).to_pylist()
    return [
        DeadLetter(split.source, split.partition, split.start + int(i), reason,
                   json.dumps(record, default=str))
        for i, record in zip(rows.tolist(), records, strict=True)
    ]  # fmt: skip


# -- partial aggregation per (key, window) -----------------------------------------------


def _combine_function(a: Aggregation) -> str:
    return "sum" if a.kind == "count" else a.kind


def partial(job: Job, table: pa.Table, watermark_ms: int) -> pa.Table:
    """Per (key, window) partial aggregates of records (columns: keys, _kg, window_start,
    sessions also window_end, one per aggregation, _seq = the first record's position): each
    record expanded to its windows that end after the watermark, or its own session merged
    with the other records' of its key."""
    assert job.window is not None and job.event_time is not None
    window = job.window
    ts = event_times(table.column(job.event_time.column))
    if isinstance(window, SessionWindow):
        rows = np.arange(len(ts), dtype=np.int64)
        starts, ends = ts, window.latest_end(ts)
    else:
        last = ts // window.slide_ms * window.slide_ms
        k = window.per_record
        rows = np.repeat(np.arange(len(ts), dtype=np.int64), k)
        starts = (last[:, None] - np.arange(k, dtype=np.int64)[None, :] * window.slide_ms).ravel()
        keep = (starts + window.size_ms > ts[rows]) & (starts + window.size_ms > watermark_ms)
        if not keep.all():
            rows, starts = rows[keep], starts[keep]
        ends = starts + window.size_ms
    taken = pa.array(rows)
    columns: dict[str, tuple[pa.Array, str]] = {}
    for a in job.aggregations:
        if a.kind == "count":
            values = pa.array(np.ones(len(rows), dtype=np.int64))
        else:
            values = _array(table, a.column).take(taken)
            if a.kind == "sum":  # as pyarrow's sum: 64-bit integers or doubles
                wide = pa.int64() if pa.types.is_integer(values.type) else pa.float64()
                values = values.cast(wide)
        columns[a.name] = (values, _combine_function(a))
    columns[SEQ] = (_array(table, SEQ).take(taken), "min")
    return _grouped(job, table, rows, starts, ends, columns)


def combine(job: Job, partials: pa.Table) -> pa.Table:
    """Combine partials of several splits (a key and window may appear once per split; a
    key's sessions of several splits may overlap)."""
    if isinstance(job.window, SessionWindow):
        columns = {a.name: (_array(partials, a.name), _combine_function(a))
                   for a in job.aggregations}  # fmt: skip
        columns[SEQ] = (_array(partials, SEQ), "min")
        starts = np.asarray(_array(partials, WINDOW_START).to_numpy(), dtype=np.int64)
        ends = np.asarray(_array(partials, WINDOW_END).to_numpy(), dtype=np.int64)
        rows = np.arange(partials.num_rows, dtype=np.int64)
        return _grouped(job, partials, rows, starts, ends, columns)
    keys = [*job.key_columns, KG, WINDOW_START]
    grouped = partials.group_by(keys, use_threads=False).aggregate(
        [(a.name, _combine_function(a)) for a in job.aggregations] + [(SEQ, "min")]
    )
    out = {c: grouped.column(c) for c in keys}
    for a in job.aggregations:
        out[a.name] = grouped.column(f"{a.name}_{_combine_function(a)}")
    out[SEQ] = grouped.column(f"{SEQ}_min")
    return pa.table(out)


def _grouped(
    job: Job,
    table: pa.Table,
    rows: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    columns: dict[str, tuple[pa.Array, str]],
) -> pa.Table:
    """Partials of (table row, window) pairs combined per key and window."""
    key_codes = pc.dictionary_encode(codec.lookup_key(table, job.key_columns)).indices
    codes = np.asarray(key_codes.to_numpy(zero_copy_only=False), dtype=np.int64)[rows]
    groups = _group(job, codes, starts, ends, np.zeros(len(rows), dtype=np.int8), columns)
    out = table.select([*job.key_columns, KG]).take(pa.array(rows[groups.firsts]))
    out = out.append_column(WINDOW_START, pa.array(groups.starts, pa.int64()))
    if isinstance(job.window, SessionWindow):
        out = out.append_column(WINDOW_END, pa.array(groups.ends, pa.int64()))
    for name, column in groups.values.items():
        out = out.append_column(name, column)
    return out


def _group(
    job: Job,
    codes: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    new: np.ndarray,
    columns: dict[str, tuple[pa.Array, str]],
) -> grouping.Groups:
    """(code, window) rows combined: fixed windows by start, sessions merged."""
    window = job.window
    if isinstance(window, SessionWindow):
        return grouping.sessions(codes, starts, ends, new, columns)
    assert window is not None
    return grouping.fixed_windows(window.size_ms, window.slide_ms, codes, starts, new, columns)


# -- merging with the key groups' state, closing windows ---------------------------------


def _bounds(job: Job) -> list[str]:
    """The state's list columns bounding each window: its start (sessions: and end)."""
    return [WINDOW_START, WINDOW_END] if isinstance(job.window, SessionWindow) else [WINDOW_START]


def state_schema(job: Job, partials: pa.Schema) -> pa.Schema:
    """The windowed state's columns: keys, window_start (sessions: window_end) and one list
    per aggregation."""
    fields = [partials.field(c) for c in job.key_columns]
    fields += [pa.field(c, pa.list_(pa.int64())) for c in _bounds(job)]
    fields += [pa.field(a.name, pa.list_(partials.field(a.name).type)) for a in job.aggregations]
    return pa.schema(fields)


def reduce(
    job: Job,
    watermark_ms: int,
    table: pa.Table | None,
    slices: Sequence[tuple[int, int, int]],
    due: Sequence[int],
    states: Mapping[int, KeyGroupState],
    writer: ChunkWriter,
) -> Closed:
    """Merge the epoch's partials (`table`: keys, window_start, aggregations, sorted by key
    group and first position; `slices`: (kg, start, length)) with the state of their key
    groups, close the windows the watermark passed — also in the key groups of `due` the
    input did not touch (`states`: their state, read by the caller) — queue each changed key
    group's chunk on `writer` and return
    the emitted rows."""
    parts = {kg: (start, length) for kg, start, length in slices}
    groups = sorted(set(parts) | set(due))
    closed = Closed([], {})
    schema = None if table is None else state_schema(job, table.schema)
    for kg in groups:
        old = states.get(kg)
        if schema is None:  # only due key groups: their state has the schema
            if old is None or not old.table.num_rows:
                continue
            schema = old.table.schema
        if old is None:
            old = codec.empty_state(schema)
        if kg in parts and table is not None:
            part = table.slice(*parts[kg])
        else:
            part = _empty_part(job, schema)
        result = _merge_key_group(job, watermark_ms, codec.conform(old.table, schema), part)
        if result is None:
            continue
        delta, new_state, emitted = result
        writer.write(kg, old, new_state, delta)
        if emitted is not None and emitted.num_rows:
            closed.outputs.append(emitted)
        ends = _first_ends(job, new_state)
        closed.due[kg] = int(ends.min()) if len(ends) else None
    return closed


def _empty_part(job: Job, schema: pa.Schema) -> pa.Table:
    """No input for a key group: partials with no rows, in the state's types."""
    fields = [schema.field(c) for c in job.key_columns]
    fields += [pa.field(c, pa.int64()) for c in _bounds(job)]
    fields += [pa.field(a.name, schema.field(a.name).type.value_type) for a in job.aggregations]
    return pa.schema(fields).empty_table()


def _first_ends(job: Job, state: pa.Table) -> np.ndarray:
    """Per state row, the end of its earliest window (windows and sessions are sorted)."""
    if not state.num_rows:
        return np.zeros(0, dtype=np.int64)
    column = WINDOW_END if isinstance(job.window, SessionWindow) else WINDOW_START
    first = pc.list_element(state.column(column), 0).to_numpy(zero_copy_only=False)
    return np.asarray(first, dtype=np.int64) + _size(job)


def _merge_key_group(
    job: Job, watermark_ms: int, state: pa.Table, part: pa.Table
) -> tuple[pa.Table, pa.Table, pa.Table | None] | None:
    """(delta, new state, emitted rows) of one key group, or None when nothing changes.

    The touched keys' windows the watermark passed close first (as Spark evicts them in the
    no-data batch the moved watermark runs, before the next input): only the open ones merge
    with the epoch's partials, whose windows all end after the watermark."""
    assert job.window is not None
    keys = list(job.key_columns)
    touched = _touched(job, watermark_ms, state, part)
    if touched is None:
        return None
    old_rows, touched_keys = touched
    # (code, window) rows: the touched keys' windows, then the epoch's partials
    bounds = {c: old_rows.column(c).combine_chunks() for c in _bounds(job)}
    old_codes = pc.list_parent_indices(bounds[WINDOW_START]).to_numpy()
    part_codes = pc.index_in(
        codec.lookup_key(part, keys), codec.lookup_key(touched_keys, keys)
    ).to_numpy()
    rows = {
        c: np.concatenate([pc.list_flatten(column).to_numpy(), _array(part, c).to_numpy()])
        for c, column in bounds.items()
    }
    codes = np.concatenate([old_codes, part_codes]).astype(np.int64)
    starts = np.asarray(rows[WINDOW_START], dtype=np.int64)
    ends = np.asarray(rows.get(WINDOW_END, starts + _size(job)), dtype=np.int64)
    new = np.concatenate([np.zeros(len(old_codes), np.int8), np.ones(len(part_codes), np.int8)])
    values = []
    for a in job.aggregations:
        old = pc.list_flatten(old_rows.column(a.name).combine_chunks())
        values.append(pa.concat_arrays([old, _array(part, a.name).cast(old.type)]))

    def group(mask: np.ndarray) -> grouping.Groups:
        taken = pa.array(mask)
        columns = {a.name: (v.filter(taken), _combine_function(a))
                   for a, v in zip(job.aggregations, values, strict=True)}  # fmt: skip
        return _group(job, codes[mask], starts[mask], ends[mask], new[mask], columns)

    closing = ends <= watermark_ms  # only state rows: the partials end after the watermark
    groups = group(~closing)
    if job.window.output_mode == "append":
        emitted = _rows(touched_keys, group(closing), None)
    else:
        emitted = _rows(touched_keys, groups, groups.changed)
    delta = _open_windows(job, state.schema, touched_keys, groups)
    return delta, codec.apply_delta(state, delta, keys), emitted


def _size(job: Job) -> int:
    """A fixed window's size (sessions: 0, their ends are stored)."""
    return 0 if isinstance(job.window, SessionWindow) else int(job.window.size_ms)


def _rows(keys: pa.Table, groups: grouping.Groups, emit: np.ndarray | None) -> pa.Table | None:
    """Output rows of the windows of `groups` (those `emit` selects): key column(s),
    window_start, window_end, one column per aggregation."""
    if emit is None:
        emit = np.ones(len(groups.codes), dtype=bool)
    if not emit.any():
        return None
    mask = pa.array(emit)
    out = keys.take(pa.array(groups.codes[emit]))
    out = out.append_column(WINDOW_START, pa.array(groups.starts[emit], pa.int64()))
    out = out.append_column(WINDOW_END, pa.array(groups.ends[emit], pa.int64()))
    for name, column in groups.values.items():
        out = out.append_column(name, column.filter(mask))
    return out


def _touched(
    job: Job, watermark_ms: int, state: pa.Table, part: pa.Table
) -> tuple[pa.Table, pa.Table] | None:
    """(the state rows of the keys the epoch changes, every such key: those rows' keys, then
    the input's new keys in first-appearance order), or None when no key changes. A key
    changes when the input brings it or the watermark passed the end of its earliest window."""
    keys = list(job.key_columns)
    # keys of the input in first-appearance order (the partials are sorted by first position)
    part_lookup = codec.lookup_key(part, keys)
    part_keys = pc.unique(part_lookup)
    touched = np.zeros(state.num_rows, dtype=bool)
    if state.num_rows:
        state_lookup = codec.lookup_key(state, keys)
        touched = _first_ends(job, state) <= watermark_ms
        if len(part_keys):
            touched |= np.asarray(pc.is_in(state_lookup, part_keys).to_numpy(False), dtype=bool)
        known = pc.is_in(part_keys, state_lookup)
    else:
        known = pa.array(np.zeros(len(part_keys), dtype=bool))
    old_rows = state.filter(pa.array(touched))
    first_rows = np.unique(
        pc.index_in(part_lookup, part_keys).to_numpy(zero_copy_only=False), return_index=True
    )[1]
    new_keys = part.take(pa.array(first_rows)).select(keys).filter(pc.invert(known))
    touched_keys = pa.concat_tables(
        [old_rows.select(keys), new_keys.cast(old_rows.select(keys).schema)]
    )
    return (old_rows, touched_keys) if touched_keys.num_rows else None


def _open_windows(job: Job, schema: pa.Schema, keys: pa.Table, groups: grouping.Groups) -> pa.Table:
    """The delta of the touched keys: their open windows, as one list per key (a key without
    any is deleted)."""
    counts = np.bincount(groups.codes, minlength=keys.num_rows)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    delta = keys
    bounds = {WINDOW_START: groups.starts, WINDOW_END: groups.ends}
    for c in _bounds(job):
        flat = pa.array(bounds[c], pa.int64())
        delta = delta.append_column(schema.field(c), pa.ListArray.from_arrays(offsets, flat))
    for a in job.aggregations:
        field = schema.field(a.name)
        flat = groups.values[a.name].cast(field.type.value_type)
        delta = delta.append_column(field, pa.ListArray.from_arrays(offsets, flat))
    return codec.with_deleted(delta, counts == 0)


def _array(table: pa.Table, column: str) -> pa.Array:
    values = table.column(column)
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
