"""Watermarks as part of the snapshot.

A job declares its event-time column and the delay it allows (`EventTime`, Spark's
``withWatermark``, Flink's bounded-out-of-orderness strategy). Every epoch records, in its
manifest's ``extra.event_time``, the watermark it applied (its parent's) and the watermark
after it: the minimum over the source's partitions of each partition's maximum event time,
minus the delay, never moving backwards. A partition that brought no record for
`idle_timeout_ms` of the epochs' processing time is left out of the minimum (Flink's
``withIdleness``). The next epoch applies that value, so a replay, a rescale, a rollback or a
fork (which carry the document along) see the same watermark sequence as the original run.

Partitions are the source's own (a Kafka partition) when it says so with the optional
capability `sources.PartitionsEventTime` (``watermark_partition(partition) -> str``); a source
without it (a directory of files read in order, a generator) is one ordered stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runners.engine.sources import PartitionsEventTime

#: the manifest's ``extra`` key holding the event-time document
EXTRA = "event_time"
#: the watermark before any record was seen (nothing is late, no window closes)
NO_WATERMARK = int(np.iinfo(np.int64).min)
LATE = "late"


class EventTimeError(ValueError):
    """An event-time declaration the engine cannot run."""


@dataclass(frozen=True)
class EventTime:
    """The job's event-time column (int64 milliseconds since the epoch, or an Arrow
    timestamp) and the out-of-orderness it allows, in milliseconds. `idle_timeout_ms`: a
    partition without records for that long (epochs' processing time) stops holding the
    watermark back until it brings records again."""

    column: str
    delay_ms: int
    idle_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise EventTimeError("EventTime(column=…) must name the event-time column")
        if isinstance(self.delay_ms, bool) or not isinstance(self.delay_ms, int):
            raise EventTimeError(f"EventTime delay_ms must be an int, not {self.delay_ms!r}")
        if self.delay_ms < 0:
            raise EventTimeError(f"EventTime delay_ms {self.delay_ms} must not be negative")
        idle = self.idle_timeout_ms
        if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int) or idle <= 0):
            raise EventTimeError(f"EventTime idle_timeout_ms must be a positive int, not {idle!r}")

    def describe(self) -> dict[str, Any]:
        return {"column": self.column, "delay_ms": self.delay_ms, "idle_ms": self.idle_timeout_ms}


def event_times(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The column as int64 milliseconds (a timestamp of any unit is converted; nulls must
    have been removed)."""
    if pa.types.is_timestamp(column.type):
        column = pc.cast(column, pa.timestamp("ms", column.type.tz), safe=False)
        column = column.cast(pa.int64())
    elif not pa.types.is_integer(column.type):
        raise EventTimeError(
            f"the event-time column has type {column.type}: give int64 milliseconds or a timestamp"
        )
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)


def merge_maxima(reports: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Per partition, the largest event time any report saw."""
    merged: dict[str, int] = {}
    for report in reports:
        for partition, value in report.items():
            merged[partition] = max(merged.get(partition, value), value)
    return merged


def logical_partition(source: Any, partition: str) -> str:
    """The watermark partition a source partition belongs to (see the module docstring)."""
    if isinstance(source, PartitionsEventTime):
        return source.watermark_partition(partition)
    return ""


@dataclass
class Closed:
    """What a reducer of watermark-closed state did (windows, join buffers, remembered keys):
    the rows it emitted, and per key group it wrote the earliest watermark at which something
    of its state closes (None: nothing left)."""

    outputs: list[pa.Table] = field(default_factory=list)
    due: dict[int, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Watermark:
    """The event-time document of one snapshot (``extra.event_time``)."""

    #: the watermark after the epoch (what the next epoch applies)
    value: int = NO_WATERMARK
    #: the watermark the epoch applied (its parent's value)
    applied: int = NO_WATERMARK
    #: per watermark partition: the largest event time read and the processing time of the
    #: last epoch that brought it records
    partitions: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: records of the epoch dropped as late (later than `applied`)
    late: int = 0
    #: per key group with open windows: the end of its earliest one (windows.py)
    due: Mapping[int, int] = field(default_factory=dict)
    #: M the key groups of `due` belong to
    max_parallelism: int = 0
    #: a job reading upstream branches (a job web): per upstream read, the watermark its
    #: newest epoch read recorded (``{"watermark": ms or None, "epoch": n}``)
    upstreams: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: the job's own watermark from its records, before the upstreams' bound it (None: `value`)
    own: int | None = None
    #: the upstream whose watermark held `value` below `own` (None: none did)
    held_by: str | None = None

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "watermark": _ms(self.value),
            "applied": _ms(self.applied),
            "partitions": {p: list(v) for p, v in sorted(dict(self.partitions).items())},
            "late": self.late,
            "due": {str(kg): end for kg, end in sorted(dict(self.due).items())},
            "max_parallelism": self.max_parallelism,
        }
        if self.upstreams:  # a job outside a web keeps its document
            doc["upstreams"] = {u: dict(v) for u, v in sorted(dict(self.upstreams).items())}
            doc["own"] = _ms(self.value if self.own is None else self.own)
            doc["held_by"] = self.held_by
        return doc

    @classmethod
    def from_doc(cls, doc: Any) -> Watermark:
        if not isinstance(doc, dict):
            return cls()

        def value(v: Any) -> int:
            return NO_WATERMARK if v is None else int(v)

        upstreams = doc.get("upstreams")
        return cls(
            upstreams=dict(upstreams) if isinstance(upstreams, dict) else {},
            own=value(doc.get("own")) if "own" in doc else None,
            held_by=doc.get("held_by"),
            value=value(doc.get("watermark")),
            applied=value(doc.get("applied")),
            partitions={str(p): (int(v[0]), int(v[1])) for p, v in doc["partitions"].items()},
            late=int(doc.get("late", 0)),
            due={int(kg): int(end) for kg, end in doc.get("due", {}).items()},
            max_parallelism=int(doc.get("max_parallelism", 0)),
        )


def _ms(value: int) -> int | None:
    return None if value == NO_WATERMARK else value


def of_manifest(manifest: Any) -> Watermark:
    """The event-time document a snapshot carries (an empty one before the first epoch)."""
    if manifest is None:
        return Watermark()
    return Watermark.from_doc(manifest.extra.get(EXTRA))


def advance(
    spec: EventTime,
    previous: Watermark,
    maxima: Mapping[str, int],
    now_ms: int,
) -> tuple[int, dict[str, tuple[int, int]]]:
    """(watermark after an epoch, partitions) from the parent's document and the largest event
    time the epoch read per watermark partition. Never moves backwards."""
    partitions = dict(previous.partitions)
    for partition, high in maxima.items():
        old = partitions.get(partition)
        partitions[partition] = (high if old is None else max(old[0], high), now_ms)
    idle = spec.idle_timeout_ms
    active = [m for m, seen in partitions.values() if idle is None or now_ms - seen < idle]
    own = previous.value if previous.own is None else previous.own
    if not active:  # every partition idle (or none yet): the watermark stays
        return own, partitions
    return max(own, min(active) - spec.delay_ms), partitions


def bounded(
    own: int,
    previous: Mapping[str, Mapping[str, Any]],
    read: Mapping[str, Mapping[str, Any]],
) -> tuple[int, dict[str, Mapping[str, Any]], str | None]:
    """(watermark, upstreams, the upstream that held it back) of a job reading upstream
    branches: its own watermark, never past the watermark the newest epoch it read of each
    upstream recorded (`previous`: the parent's upstreams, updated by those `read` now). An
    upstream whose epoch has no watermark yet holds it at none."""
    upstreams = {**previous, **read}
    value, held_by = own, None
    for name, doc in sorted(upstreams.items()):
        mark = doc.get("watermark")
        bound = NO_WATERMARK if mark is None else int(mark)
        if bound < value:
            value, held_by = bound, name
    return value, upstreams, held_by
