"""Windowed aggregation in the vectorised path: tumbling and sliding (hop) event-time windows.

A record with event time ``t`` belongs to every window ``[s, s + size)`` with ``s`` a multiple
of the slide and ``s <= t < s + size`` (Spark's ``window(ts, size, slide)``). An epoch applies
its parent's watermark ``W`` (watermark.py):

- a (record, window) pair whose window ended at or before ``W`` is dropped; a record with no
  window left (its latest window ended at or before ``W``) is a dead letter with reason
  ``late``, counted in the epoch's ``late_records``;
- output mode ``append`` emits one final row per key and window once ``W`` passes the window's
  end (``end <= W``), then drops the window's state; ``update`` emits every window the epoch
  changed with its running values, and drops a window's state once ``W`` passes its end.

The state of a key is one row in its key group's chunk: the key column(s), ``window_start``
(a sorted list of the starts of its open windows) and one list per aggregation (``count``,
``sum_value``, …) holding each open window's running value. So a key's windows move with its
key group on a rescale and are restored by a rollback or a fork, and the state operations
(rehash, transform) see ordinary keyed rows. Everything is computed with pyarrow hash
aggregation and numpy over group codes, never per record in Python.

Per key group the snapshot also records the end of its earliest open window
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

from runners.engine.eventtime import joins
from runners.engine.eventtime.watermark import LATE, EventTimeError, event_times
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
        if self.output_mode not in OUTPUT_MODES:
            raise EventTimeError(
                f"window output_mode must be one of {', '.join(OUTPUT_MODES)}, "
                f"not {self.output_mode!r}"
            )

    @property
    def per_record(self) -> int:
        """How many windows a record can belong to."""
        return -(-self.size_ms // self.slide_ms)

    def describe(self) -> dict[str, Any]:
        return {"size_ms": self.size_ms, "slide_ms": self.slide_ms, "mode": self.output_mode}


def tumbling(size_ms: int, *, output_mode: str = "append") -> Window:
    """Consecutive windows of `size_ms` (Spark's ``window(ts, size)``)."""
    return Window(size_ms, size_ms, output_mode)


def sliding(size_ms: int, slide_ms: int, *, output_mode: str = "append") -> Window:
    """Windows of `size_ms` starting every `slide_ms` (Spark's ``window(ts, size, slide)``)."""
    return Window(size_ms, slide_ms, output_mode)


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


def latest_end(window: Window, ts: np.ndarray) -> np.ndarray:
    """End of the latest window each event time belongs to."""
    return ts // window.slide_ms * window.slide_ms + window.size_ms


def drop_late(
    job: Job, watermark_ms: int, table: pa.Table, split: Split
) -> tuple[pa.Table, list[DeadLetter], np.ndarray]:
    """(records to process, dead letters, event times of the valid records): records without
    an event time are dead letters ``missing event time``; with a window, records whose every
    window ended at or before the watermark, and in an interval join records at or before
    it, are dead letters ``late``."""
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
        deadline = latest_end(job.window, ts)
    elif joins.is_join(job):  # Spark drops a join's input rows at or below the watermark
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
    """Per (key, window) partial aggregates of records (columns: keys, _kg, window_start, one
    per aggregation, _seq = the first record's position): each record expanded to its windows
    that end after the watermark."""
    assert job.window is not None and job.event_time is not None
    window = job.window
    ts = event_times(table.column(job.event_time.column))
    last = ts // window.slide_ms * window.slide_ms
    k = window.per_record
    rows = np.repeat(np.arange(len(ts), dtype=np.int64), k)
    starts = (last[:, None] - np.arange(k, dtype=np.int64)[None, :] * window.slide_ms).ravel()
    keep = (starts + window.size_ms > ts[rows]) & (starts + window.size_ms > watermark_ms)
    if not keep.all():
        rows, starts = rows[keep], starts[keep]
    keys = [*job.key_columns, KG]
    key_codes = pc.dictionary_encode(codec.lookup_key(table, job.key_columns)).indices
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
    codes = np.asarray(key_codes.to_numpy(zero_copy_only=False), dtype=np.int64)[rows]
    _, window_starts, _, combined, firsts = _group_windows(
        window.slide_ms, codes, starts, np.zeros(len(rows), dtype=np.int8), columns
    )
    out = table.select(keys).take(pa.array(rows[firsts]))
    out = out.append_column(WINDOW_START, pa.array(window_starts, pa.int64()))
    for name, column in combined.items():
        out = out.append_column(name, column)
    return out


def combine(job: Job, partials: pa.Table) -> pa.Table:
    """Combine partials of several splits (a key and window may appear once per split)."""
    keys = [*job.key_columns, KG, WINDOW_START]
    grouped = partials.group_by(keys, use_threads=False).aggregate(
        [(a.name, _combine_function(a)) for a in job.aggregations] + [(SEQ, "min")]
    )
    out = {c: grouped.column(c) for c in keys}
    for a in job.aggregations:
        out[a.name] = grouped.column(f"{a.name}_{_combine_function(a)}")
    out[SEQ] = grouped.column(f"{SEQ}_min")
    return pa.table(out)


# -- merging with the key groups' state, closing windows ---------------------------------


@dataclass
class Closed:
    """What a reducer's windows did: emitted rows, and per key group it wrote the end of its
    earliest open window (None: no window left)."""

    outputs: list[pa.Table]
    due: dict[int, int | None]


def state_schema(job: Job, partials: pa.Schema) -> pa.Schema:
    """The windowed state's columns: keys, window_start and one list per aggregation."""
    fields = [partials.field(c) for c in job.key_columns]
    fields.append(pa.field(WINDOW_START, pa.list_(pa.int64())))
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
        firsts = pc.list_element(new_state.column(WINDOW_START), 0) if new_state.num_rows else None
        closed.due[kg] = None if firsts is None else int(pc.min(firsts).as_py()) + _size(job)
    return closed


def _empty_part(job: Job, schema: pa.Schema) -> pa.Table:
    """No input for a key group: partials with no rows, in the state's types."""
    fields = [schema.field(c) for c in job.key_columns]
    fields.append(pa.field(WINDOW_START, pa.int64()))
    fields += [pa.field(a.name, schema.field(a.name).type.value_type) for a in job.aggregations]
    return pa.schema(fields).empty_table()


def _size(job: Job) -> int:
    assert job.window is not None
    return int(job.window.size_ms)


def _merge_key_group(
    job: Job, watermark_ms: int, state: pa.Table, part: pa.Table
) -> tuple[pa.Table, pa.Table, pa.Table | None] | None:
    """(delta, new state, emitted rows) of one key group, or None when nothing changes."""
    assert job.window is not None
    keys = list(job.key_columns)
    size = job.window.size_ms
    # keys of the input in first-appearance order (the partials are sorted by first position)
    part_lookup = codec.lookup_key(part, keys)
    part_keys = pc.unique(part_lookup)
    touched = np.zeros(state.num_rows, dtype=bool)
    if state.num_rows:
        state_lookup = codec.lookup_key(state, keys)
        first = pc.list_element(state.column(WINDOW_START), 0).to_numpy(zero_copy_only=False)
        touched = first + size <= watermark_ms
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
    if not touched_keys.num_rows:
        return None
    # (code, window) rows: the touched keys' open windows, then the epoch's partials
    starts = old_rows.column(WINDOW_START).combine_chunks()
    old_codes = pc.list_parent_indices(starts).to_numpy()
    part_codes = pc.index_in(part_lookup, codec.lookup_key(touched_keys, keys)).to_numpy()
    rows = {
        _CODE: np.concatenate([old_codes, part_codes]).astype(np.int64),
        WINDOW_START: pa.concat_arrays([pc.list_flatten(starts), _array(part, WINDOW_START)]),
        _NEW: np.concatenate(
            [np.zeros(len(old_codes), np.int8), np.ones(len(part_codes), np.int8)]
        ),
    }
    for a in job.aggregations:
        values = pc.list_flatten(old_rows.column(a.name).combine_chunks())
        rows[a.name] = pa.concat_arrays([values, _array(part, a.name).cast(values.type)])
    codes, window_starts, changed, values, _ = _group_windows(
        job.window.slide_ms,
        rows[_CODE], np.asarray(rows[WINDOW_START].to_numpy(), dtype=np.int64), rows[_NEW],
        {a.name: (rows[a.name], _combine_function(a)) for a in job.aggregations},
    )  # fmt: skip
    closing = window_starts + size <= watermark_ms
    emit = closing if job.window.output_mode == "append" else changed & ~closing
    emitted = None
    if emit.any():
        mask = pa.array(emit)
        emitted = touched_keys.take(pa.array(codes[emit]))
        emitted = emitted.append_column(WINDOW_START, pa.array(window_starts[emit]))
        emitted = emitted.append_column(WINDOW_END, pa.array(window_starts[emit] + size))
        for name, column in values.items():
            emitted = emitted.append_column(name, column.filter(mask))
    # the open windows left, as one list per key
    keep = ~closing
    left_codes = codes[keep]
    counts = np.bincount(left_codes, minlength=touched_keys.num_rows)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    delta = touched_keys
    schema = state.schema
    delta = delta.append_column(
        schema.field(WINDOW_START),
        pa.ListArray.from_arrays(offsets, pa.array(window_starts[keep], pa.int64())),
    )
    mask = pa.array(keep)
    for a in job.aggregations:
        field = schema.field(a.name)
        flat = values[a.name].filter(mask).cast(field.type.value_type)
        delta = delta.append_column(field, pa.ListArray.from_arrays(offsets, flat))
    flags = counts == 0
    delta = codec.with_deleted(delta, flags)
    new_state = codec.apply_delta(state, delta, keys)
    return delta, new_state, emitted


def _group_windows(
    slide: int,
    codes: np.ndarray,
    starts: np.ndarray,
    new: np.ndarray,
    columns: dict[str, tuple[pa.Array, str]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, pa.Array], np.ndarray]:
    """Rows combined per (code, window start), sorted by both: (codes, starts, whether any row
    was new, each column combined by its function — sum, min or max; null when every value of
    the group is null —, the index of each group's first row). numpy over one stable sort: a
    hash aggregation's fixed cost per call would dominate the many small key groups."""
    # one int64 sort key: windows of a group are slides apart (the sort is deterministic for
    # the same rows, whatever the parallelism or routing that brought them)
    slots = (starts - starts.min(initial=0)) // slide if len(starts) else starts
    order = np.argsort(codes * (int(slots.max(initial=0)) + 1) + slots)
    codes, starts = codes[order], starts[order]
    edge = np.ones(len(codes), dtype=bool)
    edge[1:] = (codes[1:] != codes[:-1]) | (starts[1:] != starts[:-1])
    first = np.flatnonzero(edge)
    if not len(first):
        empty = {name: column.slice(0, 0) for name, (column, _) in columns.items()}
        return codes, starts, new.astype(bool)[:0], empty, first
    combined = {}
    for name, (column, function) in columns.items():
        column = column.take(pa.array(order))
        valid = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        numeric = np.iinfo if pa.types.is_integer(column.type) else np.finfo
        dtype = column.type.to_pandas_dtype()
        identity = {"sum": 0, "min": numeric(dtype).max, "max": numeric(dtype).min}[function]
        values = np.asarray(column.fill_null(identity).to_numpy(), dtype=dtype)
        reduce = {"sum": np.add, "min": np.minimum, "max": np.maximum}[function]
        present = np.logical_or.reduceat(valid, first)
        combined[name] = pa.array(reduce.reduceat(values, first), mask=~present, type=column.type)
    changed = np.maximum.reduceat(new[order], first).astype(bool)
    return codes[first], starts[first], changed, combined, order[first]


def _array(table: pa.Table, column: str) -> pa.Array:
    values = table.column(column)
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
