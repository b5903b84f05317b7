"""The per-key path inside a reduce task: the user's ``process`` function once per key with
input, then its ``on_timer`` function for every timer due (state/timers.py), per key group.

Per key group, in order: the keys with input, in first-appearance order, each called once with
its records in input order; then the keys with a timer due — an event-time timer at or before
the applied watermark, a processing-time timer at or before the epoch's processing time —
ordered by their earliest due timer (then first-appearance, then their row in the state), each
firing its due timers in timestamp order (event time first at equal times). A timer registered
in ``process`` for a time already passed fires in the same epoch, after the input; one
registered in ``on_timer`` for a time already passed fires in the next epoch. A timer deleted
before its turn does not fire.

A key's state is one row of its key group's chunk: the key column(s), ``_state`` (the pickled
states, keyed.py), ``_expires`` and, for a job with ``on_timer``, ``_event_timers`` and
``_processing_timers``. A key with no state and no timer left is deleted.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runners.engine.eventtime.timers import KeyGroupTimers
from runners.engine.eventtime.watermark import NO_WATERMARK
from runners.engine.state import EpochContext, KeyedState, codec, epoch_seed
from runners.engine.state.codec import KeyGroupState
from runners.engine.state.timers import COLUMNS, DOMAINS, EVENT, PROCESSING, Timers
from runners.engine.state.writer import ChunkWriter

STATE = "_state"
EXPIRES = "_expires"
_TIMER_TYPE = pa.list_(pa.int64())


@dataclass(frozen=True)
class Visit:
    """What every key group of a task's epoch shares."""

    job: Any  # runners.engine.job.Job (not imported: job.py imports the state layer)
    branch: str
    epoch: int
    parallelism: int
    task: int
    now_ms: int
    watermark_ms: int = NO_WATERMARK

    @property
    def timed(self) -> bool:
        return self.job.on_timer is not None

    def context(self, kg: int) -> EpochContext:
        return EpochContext(
            branch=self.branch,
            epoch=self.epoch,
            key_group=kg,
            parallelism=self.parallelism,
            task=self.task,
            processing_time_ms=self.now_ms,
            random=random.Random(epoch_seed(self.branch, self.epoch, kg)),
            watermark_ms=None if self.watermark_ms == NO_WATERMARK else self.watermark_ms,
        )

    def timers(self, event: Sequence[int] | None, processing: Sequence[int] | None) -> Timers:
        return Timers(
            event or (),
            processing or (),
            job=self.job.name,
            on_timer=self.timed,
            event_time=self.job.event_time is not None,
        )


@dataclass
class PerKey:
    """What a task's per-key path did: output rows, per key group its timers, timers fired."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    timers: dict[int, KeyGroupTimers] = field(default_factory=dict)
    fired: int = 0


def state_schema(job: Any, keys: pa.Schema) -> pa.Schema:
    """The per-key state's columns: the keys, the pickled states, the earliest expiry and, with
    ``on_timer``, the pending timers."""
    fields = [*keys, pa.field(STATE, pa.binary()), pa.field(EXPIRES, pa.int64())]
    if job.on_timer is not None:
        fields += [pa.field(COLUMNS[d], _TIMER_TYPE) for d in DOMAINS]
    return pa.schema(fields)


def reduce(
    visit: Visit,
    table: pa.Table | None,
    slices: Sequence[tuple[int, int, int]],
    due: Sequence[int],
    states: Mapping[int, KeyGroupState],
    writer: ChunkWriter,
) -> PerKey:
    """Run the key groups with input (`table` sorted by key group and input position,
    `slices`: (kg, start, length)) and those with timers due (`due`, this task's), queue
    each changed key group's chunk on `writer`."""
    keys = list(visit.job.key_columns)
    parts = {kg: (start, length) for kg, start, length in slices}
    rows = table.to_pylist() if table is not None else []
    result = PerKey()
    for kg in sorted(set(parts) | set(due)):
        old = states.get(kg)
        if kg in parts and table is not None:
            start, length = parts[kg]
            part, records = table.slice(start, length), rows[start : start + length]
            schema = state_schema(visit.job, part.select(keys).schema)
        elif old is not None and old.table.num_rows:
            part, records = None, []
            schema = state_schema(visit.job, old.table.select(keys).schema)
        else:
            continue  # timers due in a key group with no state left: nothing to do
        if old is None:
            old = codec.empty_state(schema)
        state = codec.conform(old.table, schema)
        delta = _key_group(visit, kg, state, part, records, result)
        if delta is None:
            continue
        new_state = codec.apply_delta(state, delta, keys)
        writer.write(kg, old, new_state, delta)
        if visit.timed:
            result.timers[kg] = _pending(new_state)
    return result


def _key_group(
    visit: Visit,
    kg: int,
    state: pa.Table,
    part: pa.Table | None,
    records: list[dict[str, Any]],
    result: PerKey,
) -> pa.Table | None:
    """The delta of one key group (None: no key touched): its keys with input called with
    their records, then its timers due fired."""
    job, keys = visit.job, list(visit.job.key_columns)
    touched, by_key = _touched_keys(visit, state, part)
    if not touched.num_rows:
        return None
    payloads, stored = _previous(visit, state, touched)
    ctx = visit.context(kg)
    entries: list[tuple[Any, KeyedState, Timers]] = []
    for code, kv in enumerate(touched.to_pylist()):
        key = kv[keys[0]] if len(keys) == 1 else tuple(kv[k] for k in keys)
        timers = visit.timers(stored[EVENT][code], stored[PROCESSING][code])
        entries.append((key, KeyedState(payloads[code], visit.now_ms), timers))
    for code, positions in enumerate(by_key):
        key, keyed, timers = entries[code]
        ctx.timers = timers
        recs = [records[i] for i in positions]
        result.rows.extend(dict(out) for out in job.process(key, recs, keyed, ctx) or ())
    if visit.timed:
        result.fired += _fire(visit, ctx, entries, result.rows)
    return _delta(visit, touched, entries)


def _previous(
    visit: Visit, state: pa.Table, touched: pa.Table
) -> tuple[list[Any], dict[str, list[Any]]]:
    """The visited keys' stored states and timers (None for a key the state lacks)."""
    none: list[Any] = [None] * touched.num_rows
    if not state.num_rows:
        return none, {d: none for d in DOMAINS}
    keys = list(visit.job.key_columns)
    found = pc.index_in(codec.lookup_key(touched, keys), codec.lookup_key(state, keys))
    previous = state.take(found)
    stored = {d: previous.column(COLUMNS[d]).to_pylist() if visit.timed else none for d in DOMAINS}
    return previous.column(STATE).to_pylist(), stored


def _touched_keys(
    visit: Visit, state: pa.Table, part: pa.Table | None
) -> tuple[pa.Table, list[list[int]]]:
    """(the key group's keys to visit: those with input in first-appearance order, then those
    of the state with a timer due; per key with input, its records' positions in `part`)."""
    keys = list(visit.job.key_columns)
    by_key: list[list[int]] = []
    touched = state.select(keys).slice(0, 0)
    if part is not None and part.num_rows:
        lookup = codec.lookup_key(part, keys)
        codes = pc.index_in(lookup, value_set=pc.unique(lookup)).to_numpy()
        first = np.unique(codes, return_index=True)[1]  # codes are in first appearance
        by_key = [[] for _ in range(len(first))]
        for i, code in enumerate(codes.tolist()):
            by_key[code].append(i)
        touched = part.take(pa.array(first)).select(keys).cast(touched.schema)
    if not visit.timed or not state.num_rows:
        return touched, by_key
    due = _due_rows(visit, state)
    if touched.num_rows:
        seen = pc.is_in(codec.lookup_key(state, keys), codec.lookup_key(touched, keys))
        due &= ~np.asarray(seen.to_numpy(zero_copy_only=False), dtype=bool)
    if due.any():
        touched = pa.concat_tables([touched, state.filter(pa.array(due)).select(keys)])
    return touched, by_key


def _due_rows(visit: Visit, state: pa.Table) -> np.ndarray:
    """Rows of the state whose earliest timer of either domain is due (lists are sorted)."""
    due = np.zeros(state.num_rows, dtype=bool)
    for domain, limit in ((EVENT, visit.watermark_ms), (PROCESSING, visit.now_ms)):
        first = pc.list_element(state.column(COLUMNS[domain]), 0)
        due |= np.asarray(pc.less_equal(first, limit).fill_null(False).to_numpy(False), dtype=bool)
    return due


def _fire(
    visit: Visit,
    ctx: EpochContext,
    entries: list[tuple[Any, KeyedState, Timers]],
    out: list[dict[str, Any]],
) -> int:
    """Call ``on_timer`` for the timers due of the visited keys (module docstring's order);
    the number fired."""
    on_timer = visit.job.on_timer
    limits = {EVENT: visit.watermark_ms, PROCESSING: visit.now_ms}
    plans = []
    for code, (_, _, timers) in enumerate(entries):
        due = sorted(
            (t, DOMAINS.index(d)) for d in DOMAINS for t in timers.pending(d) if t <= limits[d]
        )
        if due:
            plans.append((due[0][0], code, due))
    fired = 0
    for _, code, due in sorted(plans):
        key, keyed, timers = entries[code]
        ctx.timers = timers
        for timestamp, domain_index in due:
            domain = DOMAINS[domain_index]
            if not timers.pop(domain, timestamp):  # deleted by an earlier timer of the key
                continue
            ctx.timer_domain = domain
            fired += 1
            out.extend(dict(row) for row in on_timer(key, timestamp, keyed, ctx) or ())
    ctx.timer_domain = None
    return fired


def _delta(
    visit: Visit, touched: pa.Table, entries: list[tuple[Any, KeyedState, Timers]]
) -> pa.Table:
    """The visited keys' new rows; a key with no state and no timer left is deleted."""
    payloads: list[bytes | None] = []
    expiries: list[int | None] = []
    pending: dict[str, list[list[int] | None]] = {d: [] for d in DOMAINS}
    deleted: list[bool] = []
    for _, keyed, timers in entries:
        payload, expires = keyed.to_payload()
        payloads.append(payload)
        expiries.append(expires)
        for d in DOMAINS:
            pending[d].append(timers.pending(d) or None)
        deleted.append(payload is None and not len(timers))
    delta = touched.append_column(STATE, pa.array(payloads, type=pa.binary()))
    delta = delta.append_column(EXPIRES, pa.array(expiries, type=pa.int64()))
    if visit.timed:
        for d in DOMAINS:
            delta = delta.append_column(COLUMNS[d], pa.array(pending[d], type=_TIMER_TYPE))
    return codec.with_deleted(delta, np.array(deleted, dtype=bool))


def _pending(state: pa.Table) -> KeyGroupTimers:
    """(earliest event-time timer, earliest processing-time timer, count) of a key group's
    state, None when it holds no timer."""
    firsts: list[int | None] = []
    count = 0
    for d in DOMAINS:
        flat = pc.list_flatten(state.column(COLUMNS[d]))
        count += len(flat)
        firsts.append(int(pc.min(flat).as_py()) if len(flat) else None)
    return None if not count else (firsts[0], firsts[1], count)
