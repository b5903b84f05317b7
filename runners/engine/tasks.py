"""What runs inside Spark tasks: map (read, route, partially aggregate) and reduce (merge with
state, write chunks and outputs). Both are pure functions of a `TaskPlan` and their input, so a
re-run of an epoch writes byte-identical objects.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runners.engine import aggregations as agg
from runners.engine import eventtime, exchange, per_key
from runners.engine.crash import maybe_crash
from runners.engine.eventtime import dedup, joins
from runners.engine.eventtime import windows as windowing
from runners.engine.exchange import MapShare
from runners.engine.hashing import key_groups, owners
from runners.engine.job import Job
from runners.engine.keygroups import key_group_range
from runners.engine.output import CHUNK_REFS, DEAD_LETTER_SCHEMA, OUTPUT_KIND
from runners.engine.repos import repository
from runners.engine.routing import Piece
from runners.engine.sources import DeadLetter, Split, SplitData
from runners.engine.state import codec, memory_cache
from runners.engine.state.codec import KeyGroupState
from runners.engine.state.restore import (
    Claims,
    Restore,
    batches_of,
    load_key_groups,
    restore_claimed,
)
from runners.engine.state.writer import ChunkWriter
from snapshots_store import Repository

KG = "_kg"
SEQ = "_seq"  # (split index << 40) + row: a record's position in the epoch's input
NO_EVENT_TIME = eventtime.EpochEventTime()


@dataclass(frozen=True)
class TaskPlan:
    """Everything a task needs to process its share of one epoch."""

    job: Job
    store_url: str
    namespace: str
    branch: str
    epoch: int
    parallelism: int
    max_parallelism: int
    key_groups: dict[int, tuple[str, ...]]
    processing_time_ms: int
    crash: tuple[str, int] | None = None
    driver_pid: int = 0
    compaction_ratio: float = 1.0
    #: the event time the epoch applies (eventtime.EpochEventTime: watermark, due windows)
    event_time: eventtime.EpochEventTime = NO_EVENT_TIME

    def repo(self) -> Repository:
        return repository(self.store_url, self.namespace)


@dataclass
class ReduceResult:
    """What a reducer reports to the driver."""

    task: int
    key_groups: dict[int, tuple[str, ...]]
    outputs: list[str]
    records_in: int
    output_rows: int
    dead_letters: int
    bytes_written: int
    changed_state_bytes: int
    chunks_written: int
    cache_hits: int
    cache_misses: int
    map_s: float = 0.0
    reduce_s: float = 0.0
    #: stored bytes of the chunks this task read from the store (not in the state cache)
    state_read_bytes: int = 0
    #: seconds this task's work kept a core busy: the reduce (a scan task: reading its whole
    #: share too) plus, after a shuffle, the map time of the splits homed on this task
    busy_s: float = 0.0
    #: event-time jobs: the largest event times read, late records, earliest open windows
    event_time: eventtime.TaskEventTime | None = None


# -- map ---------------------------------------------------------------------------------


def read_split(source: Any, split: Split, key_columns: Sequence[str]) -> SplitData:
    """Read `split`; a source that decodes records itself (JSON lines, streams) rejects a
    record without its key as it reads it, so the dead letter keeps the record's own bytes
    (`_valid_rows` below only sees the decoded row)."""
    if "required" in inspect.signature(source.read).parameters:
        return source.read(split, required=tuple(key_columns))  # type: ignore[no-any-return]
    return source.read(split)  # type: ignore[no-any-return]


def _valid_rows(
    table: pa.Table, key_columns: Sequence[str], split: Split
) -> tuple[pa.Table, list[DeadLetter]]:
    """Rows whose key columns exist and are non-null; the others as dead letters."""
    missing = [c for c in key_columns if c not in table.column_names]
    if missing:
        reason = f"missing key column(s) {missing}"
        dead = [DeadLetter(split.source, split.partition, split.start, reason, "")]
        return table.slice(0, 0), dead
    bad = None
    for c in key_columns:
        nulls = pc.is_null(table.column(c))
        bad = nulls if bad is None else pc.or_(bad, nulls)
    assert bad is not None
    if not pc.any(bad).as_py():
        return table, []
    rows = np.flatnonzero(bad.to_numpy(zero_copy_only=False))
    dead = []
    for i in rows.tolist():
        raw = json.dumps(table.slice(i, 1).to_pylist()[0], default=str)
        dead.append(DeadLetter(split.source, split.partition, split.start + i, "missing key", raw))
    return table.filter(pc.invert(bad)), dead


def _partial(job: Job, table: pa.Table, watermark_ms: int) -> pa.Table:
    """Per-key partial aggregates of records, columns: keys, _kg, state columns, _seq."""
    if job.window is not None:  # per key and window
        return windowing.partial(job, table, watermark_ms)
    keys = [*job.key_columns, KG]
    simple = [a for a in job.aggregations if a.kind not in agg.SPECIAL]
    specs = [(*a.partial(),) for a in simple] + [(SEQ, "min")]
    grouped = table.group_by(keys, use_threads=False).aggregate(specs)
    special: dict[str, pa.Array] = {}
    if len(simple) < len(job.aggregations):
        codes = _codes(table, grouped, job.key_columns)
        n = grouped.num_rows
        for a in job.aggregations:
            if a.kind not in agg.SPECIAL:
                continue
            assert a.column is not None
            values = table.column(a.column).combine_chunks()
            valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            if a.kind == "distinct_count":
                sets = agg.sorted_sets(codes[valid], values.filter(pa.array(valid)), n)
                special[a.name] = pc.list_value_length(sets).cast(pa.int64())
                special[agg.aux_column(a)] = sets
            else:
                assert a.width is not None
                ts = values.filter(pa.array(valid)).to_numpy().astype(np.int64)
                windows = ts // a.width * a.width
                latest, counts = agg.latest_window(
                    codes[valid], windows, np.ones(len(ts), dtype=np.int64), n
                )
                special[a.name] = pa.array(counts)
                special[agg.aux_column(a)] = pa.array(latest)
    columns = {k: grouped.column(k) for k in keys}
    for a in job.aggregations:
        if a.kind in agg.SPECIAL:
            columns[a.name] = special[a.name]
            columns[agg.aux_column(a)] = special[agg.aux_column(a)]
        else:
            columns[a.name] = grouped.column(a.partial_column())
    columns[SEQ] = grouped.column(f"{SEQ}_min")
    return pa.table(columns)


def _codes(rows: pa.Table, groups: pa.Table, key_columns: Sequence[str]) -> np.ndarray:
    """For every row, the index of its key among the grouped keys."""
    lookup = codec.lookup_key
    found = pc.index_in(lookup(rows, key_columns), value_set=lookup(groups, key_columns))
    return np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.int64)


def _concat(tables: Sequence[pa.Table]) -> pa.Table:
    """Rows of several splits as one table (an interval join's sides have their own
    columns: missing ones are null)."""
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")


def _with_seq(table: pa.Table, split_index: int, first_row: int = 0) -> pa.Table:
    rows = np.arange(first_row, first_row + table.num_rows, dtype=np.int64)
    seq = (np.int64(split_index) << np.int64(40)) + rows
    return table.append_column(SEQ, pa.array(seq))


def map_split(
    plan: TaskPlan,
    split_index: int,
    split: Split,
    *,
    part: int = 0,
    first_row: int = 0,
    partial: bool = True,
) -> Iterator[tuple[int, MapShare]]:
    """Read one split (or one piece of it: rows from `first_row` of split `split_index`),
    route records to key groups, and hand each reducer its share: per-key partial aggregates
    (`partial`, the shuffle routing) or the rows themselves (the split routing)."""
    started = time.perf_counter()
    job = plan.job
    data = read_split(job.source, split, job.key_columns)
    table, dead = _valid_rows(data.table, job.key_columns, split)
    seen = None
    if job.event_time is not None:
        table, late, seen = eventtime.on_read(job, plan.event_time.watermark_ms, table, split)
        dead += late
    dead = data.dead_letters + dead
    records_in = data.table.num_rows + len(data.dead_letters)
    if job.aggregate is not None:
        table = table.select(job.input_columns)
    groups = key_groups([table.column(c) for c in job.key_columns], plan.max_parallelism)
    table = _with_seq(table, split_index, first_row)
    table = table.append_column(KG, pa.array(groups, type=pa.int32()))
    if job.aggregate is not None and partial:
        table = _partial(job, table, plan.event_time.watermark_ms)
        groups = table.column(KG).to_numpy()
    owner = owners(np.asarray(groups), plan.parallelism, plan.max_parallelism)
    order = np.argsort(owner, kind="stable")
    table = table.take(pa.array(order))
    counts = np.bincount(owner, minlength=plan.parallelism)
    home = split_index % plan.parallelism
    start = 0
    shares: list[tuple[int, MapShare]] = []
    for task in range(plan.parallelism):
        n = int(counts[task])
        if n or task == home:
            share = MapShare(split_index, codec.encode_table(table.slice(start, n)), part)
            if task == home:
                share.records_in, share.dead_letters = records_in, dead
                share.event_time = seen
            shares.append((task, share))
        start += n
    map_s = time.perf_counter() - started
    for task, share in shares:
        share.map_s = map_s
        yield task, share


# -- reduce ------------------------------------------------------------------------------


def _combine(job: Job, partial: pa.Table) -> pa.Table:
    """Combine partials of several splits (a key may appear once per split)."""
    if job.window is not None:
        return windowing.combine(job, partial)
    keys = [*job.key_columns, KG]
    simple = [a for a in job.aggregations if a.kind not in agg.SPECIAL]
    grouped = partial.group_by(keys, use_threads=False).aggregate(
        [(a.name, a.combine()) for a in simple] + [(SEQ, "min")]
    )
    codes = None
    if len(simple) < len(job.aggregations):
        codes = _codes(partial, grouped, job.key_columns)
    columns = {k: grouped.column(k) for k in keys}
    n = grouped.num_rows
    for a in job.aggregations:
        if a.kind not in agg.SPECIAL:
            columns[a.name] = grouped.column(f"{a.name}_{a.combine()}")
            continue
        assert codes is not None
        aux = agg.aux_column(a)
        if a.kind == "distinct_count":
            sets = agg.union_sets(codes, partial.column(aux).combine_chunks(), n)
            columns[a.name] = pc.list_value_length(sets).cast(pa.int64())
            columns[aux] = sets
        else:
            latest, counts = agg.latest_window(
                codes, partial.column(aux).to_numpy(), partial.column(a.name).to_numpy(), n
            )
            columns[a.name] = pa.array(counts)
            columns[aux] = pa.array(latest)
    columns[SEQ] = grouped.column(f"{SEQ}_min")
    return pa.table(columns)


def _merge_special(a: agg.Aggregation, previous: pa.Table, part: pa.Table) -> dict[str, pa.Array]:
    """Running state of a distinct or windowed count after merging an epoch's partial."""
    n = part.num_rows
    aux = agg.aux_column(a)
    codes = np.concatenate([np.arange(n), np.arange(n)])
    if a.kind == "distinct_count":
        lists = pa.concat_arrays(
            [previous.column(aux).combine_chunks(), part.column(aux).combine_chunks()]
        )
        sets = agg.union_sets(codes, lists, n)
        return {a.name: pc.list_value_length(sets).cast(pa.int64()), aux: sets}
    low = np.iinfo(np.int64).min
    old_w = previous.column(aux).fill_null(low).to_numpy()
    old_c = previous.column(a.name).fill_null(0).to_numpy()
    windows = np.concatenate([old_w, part.column(aux).to_numpy()])
    counts = np.concatenate([old_c, part.column(a.name).to_numpy()])
    latest, total = agg.latest_window(codes, windows, counts, n)
    return {a.name: pa.array(total), aux: pa.array(latest)}


def _kg_slices(table: pa.Table) -> tuple[pa.Table, list[tuple[int, int, int]]]:
    """The table sorted by key group, then by first position in the input (a canonical order,
    whatever the routing and the hash aggregation's group order), and (kg, start, length) of
    each group."""
    groups = table.column(KG).to_numpy()
    seq = table.column(SEQ).to_numpy()
    if bool(np.all(seq[1:] > seq[:-1])):  # already in input order: a stable sort by group is
        order = np.argsort(groups, kind="stable")  # the same order, and cheaper (radix)
    else:
        order = np.lexsort((seq, groups))
    table = table.take(pa.array(order)).drop_columns([KG, SEQ])
    sorted_groups = groups[order]
    values, starts, counts = np.unique(sorted_groups, return_index=True, return_counts=True)
    return table, list(zip(values.tolist(), starts.tolist(), counts.tolist(), strict=True))


def _output_payload(table: pa.Table, kind: str) -> bytes:
    meta = dict(table.schema.metadata or {})
    meta[OUTPUT_KIND] = kind.encode()
    return codec.encode_table(table.replace_schema_metadata(meta))


def _load_states(
    plan: TaskPlan, kgs: Iterable[int], key_columns: Sequence[str]
) -> tuple[dict[int, KeyGroupState], Restore]:
    """The state of the key groups this task will change, read all at once."""
    chains = {kg: plan.key_groups[kg] for kg in kgs if plan.key_groups.get(kg)}
    return load_key_groups(plan.repo(), chains, key_columns)


def _reduce_aggregate(plan: TaskPlan, partial: pa.Table, writer: ChunkWriter) -> Restore:
    job = plan.job
    keys = list(job.key_columns)
    table, slices = _kg_slices(partial)
    states, restore = _load_states(plan, (kg for kg, _, _ in slices), keys)
    for kg, start, length in slices:
        part = table.slice(start, length)
        old = states.get(kg)
        if old is None or old.table.num_rows == 0:
            new_state = part
            old = codec.empty_state(part.schema)
            delta = codec.with_deleted(part)
        else:
            state = codec.conform(old.table, part.schema)
            idx = pc.index_in(codec.lookup_key(part, keys), value_set=codec.lookup_key(state, keys))
            previous = state.take(idx)
            columns = {k: part.column(k) for k in keys}
            for a in job.aggregations:
                if a.kind in agg.SPECIAL:
                    columns.update(_merge_special(a, previous, part))
                    continue
                columns[a.name] = a.merge(
                    previous.column(a.name).combine_chunks(), part.column(a.name).combine_chunks()
                )
            changed = pa.table(columns)
            matched = np.zeros(state.num_rows, dtype=bool)
            hit = idx.drop_null().to_numpy()
            matched[hit] = True
            kept = state.filter(pa.array(~matched))
            new_state = (
                pa.concat_tables([kept, changed.cast(kept.schema)]) if kept.num_rows else changed
            )
            delta = codec.with_deleted(changed)
        writer.write(kg, old, new_state, delta)
    return restore


def _reduce_process(
    plan: TaskPlan, records: pa.Table | None, writer: ChunkWriter, task: int
) -> tuple[list[pa.Table], Restore, eventtime.TaskEventTime | None]:
    """Per-key path (per_key.py): the user's function for each key with input, in
    first-appearance order, then ``on_timer`` for the timers due in this task's key groups."""
    table, slices = _kg_slices(records) if records is not None else (None, [])
    mine = key_group_range(task, plan.parallelism, plan.max_parallelism)
    due = [kg for kg in plan.event_time.timers if kg in mine]
    groups = sorted({kg for kg, _, _ in slices} | set(due))
    states, restore = _load_states(plan, groups, plan.job.key_columns)
    visit = per_key.Visit(plan.job, plan.branch, plan.epoch, plan.parallelism, task,
                          plan.processing_time_ms, plan.event_time.watermark_ms)  # fmt: skip
    done = per_key.reduce(visit, table, slices, due, states, writer)
    outputs = [pa.Table.from_pylist(done.rows)] if done.rows else []
    timed = eventtime.TaskEventTime(timers=done.timers, fired=done.fired)
    return outputs, restore, timed if plan.job.on_timer is not None else None


def reduce_partition(
    plan: TaskPlan, task: int, shares: Iterable[tuple[int, MapShare]], *, partial: bool = True
) -> Iterator[ReduceResult]:
    """Merge this task's partials (`partial`) or rows with its key groups' state at the parent;
    write chunks and outputs; report the new chains. Runs once per task (key-group range).

    Rows (the split routing) are concatenated in input order and aggregated here, exactly as a
    scan task aggregates the rows it kept, so both routings write the same bytes."""
    started = time.perf_counter()
    received = sorted((s for _, s in shares), key=lambda s: (s.split_index, s.part))
    tables = [
        exchange.read_table(s.path) if s.path else codec.decode_table(s.payload) for s in received
    ]
    tables = [t for t in tables if t.num_rows]
    merged = None
    if tables:
        merged = _concat(tables)
        if plan.job.aggregate is not None and not partial:
            merged = _partial(plan.job, merged, plan.event_time.watermark_ms)
        elif plan.job.aggregate is not None and len(tables) > 1:
            merged = _combine(plan.job, merged)
    records_in = sum(s.records_in for s in received)
    dead: list[DeadLetter] = [d for s in received for d in s.dead_letters]
    map_s = max((s.map_s for s in received), default=0.0)
    result = _reduce(plan, task, merged, records_in, dead, started, map_s)
    result.event_time = eventtime.merged([result.event_time, *(s.event_time for s in received)])
    # Each split's map time counts once, on its home task (the one it reports records_in to).
    home_map_s = sum(s.map_s for s in received if s.split_index % plan.parallelism == task)
    result.busy_s = result.reduce_s + home_map_s
    yield result


def split_partition(
    plan: TaskPlan, task: int, pieces: Sequence[Piece], directory: str
) -> Iterator[ReduceResult]:
    """The split routing in one stage of p tasks. Every piece is mapped by the task that
    claims it first (a claim file in the exchange directory): this task maps its own pieces
    (every p-th), then claims and maps every other task's piece that nobody has claimed yet
    (the last ones of each task first) — as when p exceeds the free slots and the owner has
    not started — and waits only for pieces another task claimed and is mapping. So a task
    never idles while work it could do is unclaimed. A claimed piece that is never published
    (its task failed: Spark retries a task, never its claims) is mapped after
    `CLAIMED_TIMEOUT_S`; a retried attempt maps its own pieces whoever claimed them. Maps are
    deterministic, so a piece mapped twice writes the same bytes. Then it reduces the rows
    sent to it."""
    p = plan.parallelism
    map_s = 0.0

    def run(piece: Piece) -> list[tuple[int, MapShare]]:
        nonlocal map_s
        t0 = time.perf_counter()
        shares = map_split(
            plan,
            piece.split_index,
            piece.split,
            part=piece.part,
            first_row=piece.first_row,
            partial=False,
        )
        written = exchange.write_shares(directory, shares)
        exchange.publish(directory, (piece.split_index, piece.part), written)
        map_s += time.perf_counter() - t0
        return written

    retry = _attempt_number() > 0
    mine = list(pieces[task::p])
    others = [q for i, q in enumerate(pieces) if i % p != task][::-1]
    everything: list[tuple[int, MapShare]] = []
    claimed_elsewhere: list[Piece] = []
    for piece in [*mine, *others]:
        key = (piece.split_index, piece.part)
        got = exchange.published(directory, key)
        if got is None and (exchange.claim(directory, key) or (retry and piece in mine)):
            got = run(piece)
        if got is None:
            claimed_elsewhere.append(piece)
        else:
            everything.extend(got)
    for piece in claimed_elsewhere:
        key = (piece.split_index, piece.part)
        got = exchange.wait_published(directory, key, exchange.CLAIMED_TIMEOUT_S)
        everything.extend(got if got is not None else run(piece))
    received = [(owner, share) for owner, share in everything if owner == task]
    for result in reduce_partition(plan, task, received, partial=False):
        result.busy_s = map_s + result.reduce_s  # each map counted on the task that ran it
        yield result


def _attempt_number() -> int:
    """The Spark task attempt running this code (0 first, 1 on the first retry)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return 0 if context is None else int(context.attemptNumber())


def restore_tasks(parallelism: int, cores: int) -> int:
    """Tasks of a restore stage with fixed slices (`restore_partition` without claims): p
    rounded up to a multiple of the cores, so every core stays busy to the end (p = 3 on 2
    cores runs 4 tasks: with 3, one core would idle for the last third)."""
    cores = max(1, cores)
    return -(-parallelism // cores) * cores


#: batches of key groups per task of a restore stage that claims them: small enough that the
#: last batches end close together, large enough that a batch's reads are long (128 key
#: groups on 2 cores: 128 batches of one; 32,768: 128 batches of 256)
RESTORE_BATCHES_PER_TASK = 64


def restore_batches(key_groups: int, tasks: int) -> int:
    """How many batches a claiming restore stage cuts `key_groups` into."""
    return max(1, min(key_groups, RESTORE_BATCHES_PER_TASK * max(1, tasks)))


def restore_partition(
    plan: TaskPlan, index: int, tasks: int, claims: str | None = None
) -> Iterator[Restore]:
    """Restore task `index` of `tasks` (a runner's first epoch, or a new parallelism): load
    key groups' state into the machine's state cache, memory and local disk, with long
    sequential reads, so the epoch's tasks find it wherever they run. With `claims` (a
    directory every task of the stage sees, empty at the start) the tasks share the key
    groups as they go: each of the task's threads claims the next free batch
    (`state.restore.restore_claimed`, the store reading ahead of the claims); without, the task
    loads the `index`-th of `tasks` consecutive slices (`state.restore.load_key_groups`)."""
    groups = sorted(plan.key_groups)
    repo = plan.repo()
    if claims is not None:
        batches = batches_of(groups, restore_batches(len(groups), tasks))
        count = len(batches)
        _, restore = restore_claimed(
            repo, plan.key_groups, batches, Claims(claims, count), plan.job.key_columns
        )
        yield restore
        return
    low, high = len(groups) * index // tasks, len(groups) * (index + 1) // tasks
    mine = {kg: plan.key_groups[kg] for kg in groups[low:high]}
    _, restore = load_key_groups(repo, mine, plan.job.key_columns, disk=True)
    yield restore


def scan_partition(plan: TaskPlan, task: int, splits: Sequence[Split]) -> Iterator[ReduceResult]:
    """One-stage variant without a shuffle: the task reads every split of the epoch and keeps
    the records of its own key groups (cheaper than a shuffle when p is small)."""
    started = time.perf_counter()
    job = plan.job
    tables: list[pa.Table] = []
    records_in = 0
    dead: list[DeadLetter] = []
    reports: list[eventtime.TaskEventTime | None] = []
    for index, split in enumerate(splits):
        data = read_split(job.source, split, job.key_columns)
        table, bad = _valid_rows(data.table, job.key_columns, split)
        if job.event_time is not None:
            table, late, seen = eventtime.on_read(job, plan.event_time.watermark_ms, table, split)
            if index % plan.parallelism == task:
                bad += late
                reports.append(seen)
        if index % plan.parallelism == task:
            records_in += data.table.num_rows + len(data.dead_letters)
            dead.extend(data.dead_letters + bad)
        if job.aggregate is not None:
            table = table.select(job.input_columns)
        groups = key_groups([table.column(c) for c in job.key_columns], plan.max_parallelism)
        mine = owners(groups, plan.parallelism, plan.max_parallelism) == task
        table = _with_seq(table, index)
        table = table.append_column(KG, pa.array(groups, type=pa.int32())).filter(pa.array(mine))
        tables.append(table)
    merged = _concat(tables) if tables else None
    if merged is not None and merged.num_rows == 0:
        merged = None
    if merged is not None and job.aggregate is not None:
        merged = _partial(job, merged, plan.event_time.watermark_ms)
    map_s = time.perf_counter() - started
    result = _reduce(plan, task, merged, records_in, dead, started, map_s)
    result.event_time = eventtime.merged([result.event_time, *reports])
    result.busy_s = result.reduce_s  # measured from the scan's start: reading included
    yield result


def _reduce(
    plan: TaskPlan,
    task: int,
    merged: pa.Table | None,
    records_in: int,
    dead: list[DeadLetter],
    started: float,
    map_s: float,
) -> ReduceResult:
    job = plan.job
    maybe_crash(plan.crash, "before_chunks", plan.epoch, plan.driver_pid)
    hits0, misses0 = memory_cache.stats["hits"], memory_cache.stats["misses"]
    out_tables: list[pa.Table] = []
    restore = Restore()
    closed = None
    timed = None
    with ChunkWriter(plan.repo(), compaction_ratio=plan.compaction_ratio, cache=True) as writer:
        if job.closes_by_watermark:  # windows close also in key groups without input
            closed, restore = _reduce_windows(plan, task, merged, writer)
            out_tables = closed.outputs
        elif merged is not None and job.aggregate is not None:
            restore = _reduce_aggregate(plan, merged, writer)
        elif merged is not None or plan.event_time.timers:  # timers fire without input too
            out_tables, restore, timed = _reduce_process(plan, merged, writer, task)
        chains = writer.prepare()
    maybe_crash(plan.crash, "after_chunks", plan.epoch, plan.driver_pid)
    # the aggregate path's output rows are exactly the changed state rows: its output object
    # names where they live in this epoch's chunks instead of copying them
    refs = writer.output_refs if job.aggregate is not None and job.window is None else []
    outputs, output_bytes, output_rows = _write_outputs(plan, refs, out_tables, dead)
    maybe_crash(plan.crash, "after_outputs", plan.epoch, plan.driver_pid)
    return ReduceResult(
        task=task,
        key_groups=chains,
        outputs=outputs,
        records_in=records_in,
        output_rows=output_rows,
        dead_letters=len(dead),
        bytes_written=writer.bytes_written + output_bytes,
        changed_state_bytes=writer.changed_state_bytes,
        chunks_written=writer.chunks_written,
        cache_hits=memory_cache.stats["hits"] - hits0,
        cache_misses=memory_cache.stats["misses"] - misses0,
        map_s=map_s,
        reduce_s=time.perf_counter() - started,
        state_read_bytes=restore.stored_bytes,
        event_time=timed if closed is None else eventtime.TaskEventTime(due=closed.due),
    )


def _write_outputs(
    plan: TaskPlan,
    refs: list[tuple[str, int, int]],
    tables: list[pa.Table],
    dead: list[DeadLetter],
) -> tuple[list[str], int, int]:
    """The task's output objects: (their ids, their bytes, the output rows)."""
    repo = plan.repo()
    payloads: list[bytes] = []
    output_rows = 0
    if refs:
        payloads.append(json.dumps({"kind": CHUNK_REFS, "refs": refs}, sort_keys=True).encode())
        output_rows = sum(r[2] for r in refs)
    if tables:
        out = pa.concat_tables(tables, promote_options="permissive")
        output_rows = out.num_rows
        payloads.append(_output_payload(out, "records"))
    if dead:
        dl = pa.Table.from_pylist([d.__dict__ for d in dead], schema=DEAD_LETTER_SCHEMA)
        payloads.append(_output_payload(dl, "dead_letters"))
    outputs = [repo.put_object("output", payload) for payload in payloads]
    return outputs, sum(len(p) for p in payloads), output_rows


def _reduce_windows(
    plan: TaskPlan, task: int, merged: pa.Table | None, writer: ChunkWriter
) -> tuple[eventtime.Closed, Restore]:
    """Windowed aggregation: merge the partials per key and window, close the windows the
    watermark passed in this task's key groups (eventtime/windows.py); an interval join: match
    the rows with their key groups' buffered ones, expire what the watermark passed
    (eventtime/joins.py); or deduplication: drop the keys remembered, forget those the
    watermark passed (eventtime/dedup.py)."""
    table, slices = _kg_slices(merged) if merged is not None else (None, [])
    mine = key_group_range(task, plan.parallelism, plan.max_parallelism)
    due = [kg for kg in plan.event_time.due if kg in mine]
    groups = sorted({kg for kg, _, _ in slices} | set(due))
    states, restore = _load_states(plan, groups, plan.job.key_columns)
    watermark = plan.event_time.watermark_ms
    if joins.is_join(plan.job):
        reduce = joins.reduce
    elif plan.job.dedup_within_watermark:
        reduce = dedup.reduce
    else:
        reduce = windowing.reduce
    closed = reduce(plan.job, watermark, table, slices, due, states, writer)
    return closed, restore
