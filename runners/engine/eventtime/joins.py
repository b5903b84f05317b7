"""Stream-stream interval joins within a time bound (Spark's stream-stream join with
watermarks and a time-range condition, Flink's interval join).

`IntervalJoin(left, right, on, left_time, right_time, lower_ms, upper_ms, how, delay_ms)` is
the job's source: it reads both inputs (two sources, or two upstream branches of a job web)
and tags every row with its side. A left row ``l`` and a right row ``r`` with equal key(s)
match when

    l.ts - lower_ms <= r.ts <= l.ts + upper_ms

``how="inner"`` emits every matching pair once, in the epoch that brings its second row;
``how="left"`` also emits each left row that matched nothing, padded with nulls, once the
watermark guarantees no match can come (Spark's left outer stream-stream join).

**The watermark** is the minimum over both inputs' partitions (each side's partitions are
watermark partitions of their own, ``left/…`` and ``right/…``: Spark's default global
watermark policy "min"), minus `delay_ms`; a side that has brought no row yet holds it
where it is (Spark counts it at the lowest watermark). An epoch applying watermark ``W``
drops a row with event time at or below ``W`` as late (a dead letter ``late``; Spark drops
a join's input rows at or below the watermark the same way): every row still to come has
``ts > W``. So a buffered left row can match no future right row once
``l.ts + upper_ms <= W``, a right row no future left row once ``r.ts + lower_ms <= W``:
they leave the state then, and an unmatched left row of a left join is emitted then.

**State.** Each side's buffered rows live in their key group's chunk, several rows per key:
the key column(s), ``_side`` (0 left, 1 right), ``_ts`` (the row's event time in ms),
``_matched`` (a left row has matched) and the columns of both sides, each named with its
side's prefix (``left_…``, ``right_…``; the key columns are shared) — so rescale, rollback,
fork and the state operations carry it as any keyed state. An epoch rewrites the rows of the
keys it changed (new rows, matches, expired rows: a delta whose key's rows replace the old
ones, a tombstone for a key left without rows). The key group's ``due`` entry is the
smallest watermark at which one of its rows expires, so an epoch visits it even without
input (windows.py does the same for windows).

Matching is vectorised per key group: key codes from one dictionary, the right rows sorted
by code, each left row's range of equal codes found with ``searchsorted`` and expanded with
``repeat``, then the time bound filtered with numpy. An epoch pairs its new left rows with
every right row (buffered and new) and the buffered left rows with the new right rows, so a
pair is emitted exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runners.engine.eventtime.watermark import (
    Closed,
    EventTime,
    EventTimeError,
    logical_partition,
)
from runners.engine.sources import (
    AdvancesOffsets,
    PreparesEpochs,
    PropagatesWatermarks,
    RecordsLineage,
    ReportsBacklog,
    ReportsBacklogRecords,
    Source,
    Split,
    SplitData,
    end_offsets,
)
from runners.engine.state import codec

if TYPE_CHECKING:
    from runners.engine.state.codec import KeyGroupState
    from runners.engine.state.writer import ChunkWriter

#: a `runners.engine.job.Job` (not imported: the job module imports this one)
Job = Any

TIME = "_ts"
SIDE = "_side"
MATCHED = "_matched"
JOIN = "interval_join"
HOW = ("inner", "left")
SIDES = ("left", "right")
LEFT, RIGHT = 0, 1
_INTERNAL = (TIME, SIDE, MATCHED)


@dataclass
class IntervalJoin:
    """Two inputs joined on `on` within a time bound (module docstring). `prefixes` name
    each side's columns in the state and the output (the key columns are not prefixed)."""

    left: Source
    right: Source
    on: str | Sequence[str]
    left_time: str
    right_time: str
    lower_ms: int
    upper_ms: int
    how: str = "inner"
    delay_ms: int = 0
    name: str = "join"
    prefixes: tuple[str, str] = ("left_", "right_")

    def __post_init__(self) -> None:
        for name in ("lower_ms", "upper_ms", "delay_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise EventTimeError(f"IntervalJoin {name} must be an int, not {value!r}")
        if self.lower_ms + self.upper_ms < 0:
            raise EventTimeError(
                f"IntervalJoin bound left.ts - {self.lower_ms} <= right.ts <= left.ts + "
                f"{self.upper_ms} matches nothing: give lower_ms + upper_ms >= 0"
            )
        if self.how not in HOW:
            raise EventTimeError(f"IntervalJoin how must be one of {HOW}, not {self.how!r}")
        if not self.key_columns or not all(isinstance(c, str) and c for c in self.key_columns):
            raise EventTimeError(f"IntervalJoin on={self.on!r} must name the key column(s)")
        a, b = self.prefixes
        if not a or not b or a.startswith(b) or b.startswith(a):
            raise EventTimeError(
                f"IntervalJoin prefixes {self.prefixes!r} must be non-empty and neither may "
                "start with the other (they tell the sides' columns apart)"
            )
        if "/" in self.name:
            raise EventTimeError(f"IntervalJoin name {self.name!r} must not contain '/'")
        EventTime(TIME, self.delay_ms)  # the delay's own checks

    @property
    def key_columns(self) -> tuple[str, ...]:
        return (self.on,) if isinstance(self.on, str) else tuple(self.on)

    @property
    def event_time(self) -> EventTime:
        """The job's event time: the tagged rows' ``_ts`` with the join's delay."""
        return EventTime(TIME, self.delay_ms)

    def describe(self) -> dict[str, Any]:
        return {
            "on": list(self.key_columns),
            "time": [self.left_time, self.right_time],
            "lower_ms": self.lower_ms,
            "upper_ms": self.upper_ms,
            "how": self.how,
            "prefixes": list(self.prefixes),
        }

    def _sides(self) -> Iterator[tuple[str, Source]]:
        yield "left", self.left
        yield "right", self.right

    def _source(self, side: str) -> Source:
        return self.left if side == "left" else self.right

    def _per_side(self, splits: Sequence[Split]) -> Iterator[tuple[str, Source, list[Split]]]:
        for side, source in self._sides():
            prefix = f"{side}/"
            mine = [
                Split(source.name, s.partition[len(prefix) :], s.start, s.end, s.locator)
                for s in splits
                if s.partition.startswith(prefix)
            ]
            yield side, source, mine

    # -- Source protocol -------------------------------------------------------------------

    def plan(self, committed: Mapping[str, int]) -> list[Split]:
        splits = []
        for side, source in self._sides():
            for s in source.plan(_offsets(committed, side)):
                splits.append(Split(self.name, f"{side}/{s.partition}", s.start, s.end, s.locator))
        return splits

    def read(self, split: Split) -> SplitData:
        side, partition = split.partition.split("/", 1)
        source = self._source(side)
        data = source.read(Split(source.name, partition, split.start, split.end, split.locator))
        return SplitData(self._tag(side, data.table), data.dead_letters)

    def _tag(self, side: str, table: pa.Table) -> pa.Table:
        """A side's rows as the join reads them: keys, the side's columns with its prefix,
        ``_side`` and ``_ts`` (the side's event time in ms; null stays null)."""
        index = SIDES.index(side)
        time = (self.left_time, self.right_time)[index]
        if time not in table.column_names:
            raise EventTimeError(
                f"IntervalJoin {side} side has no event-time column {time!r} "
                f"(columns: {table.column_names})"
            )
        ts = table.column(time)
        if pa.types.is_timestamp(ts.type):
            ts = pc.cast(ts, pa.timestamp("ms", ts.type.tz), safe=False)
        elif not pa.types.is_integer(ts.type):
            raise EventTimeError(
                f"IntervalJoin {side} event-time column {time!r} has type {ts.type}: give "
                "int64 milliseconds or a timestamp"
            )
        keys = self.key_columns
        names = [c if c in keys else self.prefixes[index] + c for c in table.column_names]
        clash = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(_INTERNAL)))
        if clash:
            raise EventTimeError(
                f"IntervalJoin {side} side: columns {clash} clash with the key or the join's "
                "own columns once prefixed; choose other prefixes="
            )
        table = table.rename_columns(names)
        table = table.append_column(SIDE, pa.array(np.full(table.num_rows, index, np.int8)))
        return table.append_column(TIME, ts.cast(pa.int64()))

    def retained(self, offsets: Mapping[str, int]) -> str | None:
        for side, source in self._sides():
            problem = source.retained(_offsets(offsets, side))
            if problem is not None:
                return f"{side} side of {self.name}: {problem}"
        return None

    # -- optional capabilities, delegated to the sides ----------------------------------------

    def watermark_partition(self, partition: str) -> str:
        """Each side's partitions are watermark partitions of their own: the watermark is
        the minimum over both inputs."""
        side, inner = partition.split("/", 1)
        return f"{side}/{logical_partition(self._source(side), inner)}"

    def prepare_epoch(self, control: Mapping[str, Any], epoch: int) -> None:
        """A hot-swap re-points a side by the edge name ``<join>/<side>``."""
        points = control.get("repoint")
        points = points if isinstance(points, Mapping) else {}
        for side, source in self._sides():
            if isinstance(source, PreparesEpochs):
                mine = points.get(f"{self.name}/{side}")
                repoint = {getattr(source, "name", side): mine} if mine is not None else {}
                source.prepare_epoch({**control, "repoint": repoint}, epoch)

    def end_offsets(self, committed: Mapping[str, int], splits: Sequence[Split]) -> dict[str, int]:
        result = dict(committed)
        for side, source, mine in self._per_side(splits):
            sub = _offsets(committed, side)
            after = (
                source.end_offsets(sub, mine)
                if isinstance(source, AdvancesOffsets)
                else end_offsets(sub, mine)
            )
            result.update({f"{side}/{k}": v for k, v in after.items()})
        return result

    def lineage(self, committed: Mapping[str, int], splits: Sequence[Split]) -> dict[str, Any]:
        """The sides that record lineage (upstream branches), as a fan-in records its
        upstreams: the web has an edge ``<join>/<side>`` per upstream."""
        inputs = {
            side: source.lineage(_offsets(committed, side), mine)
            for side, source, mine in self._per_side(splits)
            if isinstance(source, RecordsLineage)
        }
        return {"kind": JOIN, "inputs": inputs}

    def backlog(self, offsets: Mapping[str, int]) -> int | None:
        """Epochs of input waiting: the larger side's (both are read in every epoch); None
        when a side cannot tell."""
        waiting = [
            source.backlog(_offsets(offsets, side)) if isinstance(source, ReportsBacklog) else None
            for side, source in self._sides()
        ]
        return None if None in waiting else max(w for w in waiting if w is not None)

    def backlog_records(self, offsets: Mapping[str, int]) -> int | None:
        """Records waiting on both sides; None when a side cannot tell."""
        waiting = [
            source.backlog_records(_offsets(offsets, side))
            if isinstance(source, ReportsBacklogRecords)
            else None
            for side, source in self._sides()
        ]
        return None if None in waiting else sum(w for w in waiting if w is not None)

    def upstream_watermarks(self, splits: Sequence[Split]) -> dict[str, dict[str, Any]]:
        """Per upstream a side read, named as its web edge: ``<join>/<side>`` (a side that
        is a fan-in: ``<join>/<side>/<its upstream>``)."""
        found: dict[str, dict[str, Any]] = {}
        for side, source, mine in self._per_side(splits):
            if isinstance(source, PropagatesWatermarks):
                for name, doc in source.upstream_watermarks(mine).items():
                    own = name == source.name  # a branch output: the side is the edge
                    found[f"{self.name}/{side}" + ("" if own else f"/{name}")] = doc
        return found


def _offsets(committed: Mapping[str, int], side: str) -> dict[str, int]:
    prefix = f"{side}/"
    return {k[len(prefix) :]: v for k, v in committed.items() if k.startswith(prefix)}


def is_join(job: Job) -> bool:
    return isinstance(job.source, IntervalJoin)


def check(job: Job) -> None:
    """Refuse a join job the engine cannot run, naming what to change; give it the join's
    event time when it declares none."""
    join = job.source
    if not isinstance(join, IntervalJoin):
        return
    if job.aggregate is not None or job.process is not None or job.window is not None:
        raise EventTimeError(
            f"job {job.name!r}: an IntervalJoin source's output is the joined rows: give "
            "neither aggregate, process nor window"
        )
    if tuple(job.key_columns) != join.key_columns:
        raise EventTimeError(
            f"job {job.name!r}: key {list(job.key_columns)} must be the join's "
            f"on={list(join.key_columns)}"
        )
    if job.event_time is None:
        job.event_time = join.event_time
    elif job.event_time != join.event_time:
        raise EventTimeError(
            f"job {job.name!r}: event_time {job.event_time} is not the join's "
            f"{join.event_time}: leave event_time out (the join sets it from delay_ms)"
        )


def waits_for_a_side(job: Job, partitions: Mapping[str, Any]) -> bool:
    """Whether a join's watermark is held because a side has brought no row yet (Spark
    counts an input without data at the lowest watermark: the policy "min" then holds)."""
    if not is_join(job):
        return False
    return not all(any(p.startswith(f"{side}/") for p in partitions) for side in SIDES)


# -- matching, per key group -------------------------------------------------------------


def reduce(
    job: Job,
    watermark_ms: int,
    table: pa.Table | None,
    slices: Sequence[tuple[int, int, int]],
    due: Sequence[int],
    states: Mapping[int, KeyGroupState],
    writer: ChunkWriter,
) -> Closed:
    """Join the epoch's rows (`table`, sorted by key group and input position; `slices`:
    (kg, start, length)) with their key groups' buffered rows, and expire what the watermark
    passed — also in the key groups of `due` the input did not touch; queue each changed key
    group's chunk on `writer`."""
    join = job.source
    assert isinstance(join, IntervalJoin)
    parts = {kg: (start, length) for kg, start, length in slices}
    joined = Closed()
    for kg in sorted(set(parts) | set(due)):
        old = states.get(kg)
        rows = [] if old is None else [old.table]
        if kg in parts and table is not None:
            new = table.slice(*parts[kg])
            rows.append(new.append_column(MATCHED, pa.array(np.zeros(new.num_rows, bool))))
        rows = [r for r in rows if r.num_rows]
        if not rows:
            continue
        buffered = pa.concat_tables(rows, promote_options="permissive")
        fresh = np.arange(buffered.num_rows) >= (0 if old is None else old.table.num_rows)
        step = _join_key_group(join, watermark_ms, buffered, fresh)
        if step is None:
            continue
        delta, emitted, next_due = step
        before = old if old is not None else codec.empty_state(delta.schema)
        new_state = codec.apply_delta(before.table, delta, join.key_columns)
        writer.write(kg, before, new_state, delta)
        joined.outputs.extend(t for t in emitted if t.num_rows)
        joined.due[kg] = next_due
    return joined


def _join_key_group(
    join: IntervalJoin, watermark_ms: int, rows: pa.Table, fresh: np.ndarray
) -> tuple[pa.Table, list[pa.Table], int | None] | None:
    """(delta with ``_deleted`` flags, emitted tables, the key group's next due watermark)
    of one key group's buffered and new rows, or None when nothing changes."""
    keys = list(join.key_columns)
    lookup = codec.lookup_key(rows, keys)
    codes = np.asarray(pc.index_in(lookup, value_set=pc.unique(lookup)).to_numpy(), np.int64)
    side = rows.column(SIDE).to_numpy()
    ts = np.asarray(rows.column(TIME).to_numpy(), np.int64)
    is_left = side == LEFT
    left_new, left_old = np.flatnonzero(is_left & fresh), np.flatnonzero(is_left & ~fresh)
    right_all, right_new = np.flatnonzero(~is_left), np.flatnonzero(~is_left & fresh)
    li, ri = (
        np.concatenate(pair)
        for pair in zip(
            _pairs(join, codes, ts, left_new, right_all),
            _pairs(join, codes, ts, left_old, right_new),
            strict=True,
        )
    )
    order = np.lexsort((ri, li))  # by left row, then right row
    li, ri = li[order], ri[order]
    matched = np.asarray(rows.column(MATCHED).to_numpy(zero_copy_only=False), bool).copy()
    matched[li] = True
    expires = np.where(is_left, ts + join.upper_ms, ts + join.lower_ms)
    expired = expires <= watermark_ms
    if not (fresh.any() or expired.any()):
        return None
    rows = rows.set_column(rows.schema.get_field_index(MATCHED), MATCHED, pa.array(matched))
    emitted = [_output(join, rows, li, ri)]
    if join.how == "left":
        alone = np.flatnonzero(is_left & expired & ~matched)
        emitted.append(_output(join, rows, alone, None))
    changed = np.isin(codes, np.unique(codes[fresh | expired]))
    kept = np.flatnonzero(changed & ~expired)
    gone = np.setdiff1d(np.unique(codes[changed]), np.unique(codes[kept]))
    tombstones = np.unique(codes, return_index=True)[1][gone]  # one row per emptied key
    delta = rows.take(pa.array(np.concatenate([kept, tombstones])))
    flags = np.concatenate([np.zeros(len(kept), bool), np.ones(len(tombstones), bool)])
    remaining = expires[~expired]
    next_due = int(remaining.min()) if len(remaining) else None
    return codec.with_deleted(delta, flags), emitted, next_due


def _pairs(
    join: IntervalJoin, codes: np.ndarray, ts: np.ndarray, left: np.ndarray, right: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(left rows, right rows) of every pair with equal key within the time bound."""
    order = np.argsort(codes[right], kind="stable")
    right_sorted, right_codes = right[order], codes[right][order]
    start = np.searchsorted(right_codes, codes[left], "left")
    counts = np.searchsorted(right_codes, codes[left], "right") - start
    li = np.repeat(left, counts)
    first = np.repeat(start - (np.cumsum(counts) - counts), counts)
    ri = right_sorted[first + np.arange(len(li))]
    within = (ts[li] - join.lower_ms <= ts[ri]) & (ts[ri] <= ts[li] + join.upper_ms)
    return li[within], ri[within]


def _output(
    join: IntervalJoin, rows: pa.Table, left: np.ndarray, right: np.ndarray | None
) -> pa.Table:
    """The joined rows: the key(s), the left side's columns, the right side's (null-padded
    when `right` is None)."""
    keys = list(join.key_columns)
    names = rows.column_names
    lefts = [c for c in names if c.startswith(join.prefixes[0]) and c not in keys]
    rights = [c for c in names if c.startswith(join.prefixes[1]) and c not in keys]
    taken = rows.take(pa.array(left, pa.int64()))
    columns = {c: taken.column(c) for c in [*keys, *lefts]}
    if right is None:
        columns.update({c: pa.nulls(len(left), rows.schema.field(c).type) for c in rights})
    else:
        other = rows.take(pa.array(right, pa.int64()))
        columns.update({c: other.column(c) for c in rights})
    return pa.table(columns)
