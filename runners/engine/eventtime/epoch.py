"""The event-time part of one epoch: what the driver plans before the tasks (the watermark to
apply, the key groups whose windows or timers are due) and records after them (the new
watermark, late records, the key groups' earliest open windows and timers), and what a task
reports."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from runners.engine.eventtime import joins, timers
from runners.engine.eventtime.timers import KeyGroupTimers
from runners.engine.eventtime.watermark import (
    EXTRA,
    NO_WATERMARK,
    Watermark,
    advance,
    bounded,
    logical_partition,
    merge_maxima,
    of_manifest,
)
from runners.engine.eventtime.windows import drop_late
from runners.engine.sources import DeadLetter, PropagatesWatermarks, Split

#: a `runners.engine.job.Job` (not imported: the job module imports this package)
Job = Any


@dataclass
class TaskEventTime:
    """What a task saw of event time: the largest event time per watermark partition, the
    records it dropped as late, and (reducers of a windowed job) per key group it wrote the end
    of its earliest open window (None: none left)."""

    maxima: dict[str, int] = field(default_factory=dict)
    late: int = 0
    due: dict[int, int | None] = field(default_factory=dict)
    #: per-key functions with ``on_timer``: per key group written, its timers (timers.py) and
    #: how many timers fired
    timers: dict[int, KeyGroupTimers] = field(default_factory=dict)
    fired: int = 0

    def add(self, other: TaskEventTime | None) -> None:
        if other is None:
            return
        self.maxima = merge_maxima([self.maxima, other.maxima])
        self.late += other.late
        self.due.update(other.due)
        self.timers.update(other.timers)
        self.fired += other.fired


@dataclass(frozen=True)
class EpochEventTime:
    """What the driver hands the tasks: the watermark the epoch applies (its parent's) and the
    key groups whose earliest open window it closes."""

    watermark_ms: int = NO_WATERMARK
    due: tuple[int, ...] = ()
    #: key groups with a timer due (a per-key function's ``on_timer``, timers.py)
    timers: tuple[int, ...] = ()


def plan_epoch(job: Job, parent: Any, now_ms: int = 0) -> EpochEventTime:
    """The parent's watermark and the key groups with a window ending at or before it, and
    those with a timer due at it or at the epoch's processing time `now_ms`. After a
    migration (rehash: another M, transform: other windows) every key group with state is
    visited once."""
    if job.event_time is None:
        return EpochEventTime(timers=timers.due_key_groups(job, parent, NO_WATERMARK, now_ms))
    previous = of_manifest(parent)
    timed = timers.due_key_groups(job, parent, previous.value, now_ms)
    if not job.closes_by_watermark or parent is None or previous.value == NO_WATERMARK:
        return EpochEventTime(previous.value, timers=timed)
    if parent.kind == "migration" or previous.max_parallelism != parent.max_parallelism:
        due = sorted(int(kg) for kg in parent.key_groups)
    else:
        due = sorted(kg for kg, end in previous.due.items() if end <= previous.value)
    return EpochEventTime(previous.value, tuple(due), timed)


def on_read(
    job: Job, watermark_ms: int, table: pa.Table, split: Split
) -> tuple[pa.Table, list[DeadLetter], TaskEventTime]:
    """A split's valid records as a task read them: drop those without an event time and
    (windowed jobs) the late ones, and note the largest event time of the split's partition."""
    table, dead, ts = drop_late(job, watermark_ms, table, split)
    report = TaskEventTime(late=sum(1 for d in dead if d.reason == "late"))
    if len(ts):
        report.maxima[logical_partition(job.source, split.partition)] = int(np.max(ts))
    return table, dead, report


def after_epoch(
    job: Job,
    parent: Any,
    planned: EpochEventTime,
    reports: Iterable[TaskEventTime | None],
    now_ms: int,
    max_parallelism: int,
    splits: Sequence[Split] = (),
) -> tuple[dict[str, Any], dict[str, int]]:
    """(the manifest's ``extra`` entries, its stats) of an epoch of an event-time job or of a
    job with timers. A job reading upstream branches (`PropagatesWatermarks`, the epoch's
    `splits`) never gets a watermark past theirs."""
    total = TaskEventTime()
    for report in reports:
        total.add(report)
    timed, timer_stats = timers.after_epoch(job, parent, [total.timers], total.fired,
                                            max_parallelism)  # fmt: skip
    if job.event_time is None:
        return timed, timer_stats
    previous = of_manifest(parent)
    own, partitions = advance(job.event_time, previous, total.maxima, now_ms)
    if joins.waits_for_a_side(job, partitions):
        own = previous.value if previous.own is None else previous.own
    read = (
        job.source.upstream_watermarks(splits)
        if isinstance(job.source, PropagatesWatermarks)
        else {}
    )
    value, upstreams, held_by = bounded(own, previous.upstreams, read)
    value = max(previous.value, value)  # a newly read upstream never moves it back
    due = dict(previous.due) if previous.max_parallelism == max_parallelism else {}
    for kg, end in total.due.items():
        if end is None:
            due.pop(kg, None)
        else:
            due[kg] = end
    doc = Watermark(
        value=value,
        applied=planned.watermark_ms,
        partitions=partitions,
        late=total.late,
        due=due if job.closes_by_watermark else {},
        max_parallelism=max_parallelism,
        upstreams=upstreams,
        own=own,
        held_by=held_by,
    ).to_doc()
    doc["spec"] = job.event_time.describe()
    if job.window is not None:
        doc["window"] = job.window.describe()
    stats = {"late_records": total.late, **timer_stats}
    if value != NO_WATERMARK:  # the control plane's index keeps the stats: lag, charts
        stats["watermark_ms"] = value
    return {EXTRA: doc, **timed}, stats


def merged(reports: Sequence[TaskEventTime | None]) -> TaskEventTime | None:
    """The reports of a task's shares as one (None when there is none)."""
    present = [r for r in reports if r is not None]
    if not present:
        return None
    total = TaskEventTime()
    for report in present:
        total.add(report)
    return total
