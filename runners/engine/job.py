"""What a user declares: a source, a key, and either built-in aggregations or a per-key function."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runners.engine.aggregations import Aggregation
from runners.engine.eventtime.dedup import check as check_dedup
from runners.engine.eventtime.joins import check as join_check
from runners.engine.eventtime.joins import is_join
from runners.engine.eventtime.watermark import EventTime, EventTimeError
from runners.engine.eventtime.windows import SessionWindow, Window
from runners.engine.eventtime.windows import check as check_window
from runners.engine.sinks import Sink
from runners.engine.sources import Source
from runners.engine.state import EpochContext, KeyedState

ProcessFn = Callable[
    [Any, list[dict[str, Any]], KeyedState, EpochContext], Iterable[dict[str, Any]]
]
#: ``on_timer(key, timestamp_ms, state, ctx) -> rows`` (``ctx.timer_domain``: which fired)
TimerFn = Callable[[Any, int, KeyedState, EpochContext], Iterable[dict[str, Any]]]


class JobError(ValueError):
    """A job declaration the engine cannot run."""


@dataclass
class Job:
    """A keyed stateful job.

    `aggregate` (vectorised built-ins), `process` (a Python function per key and epoch) or
    `dedup_within_watermark` (the first record of each key within the watermark): exactly one.
    `time_mode` "wall" stamps each epoch with the driver's clock; "logical" uses
    ``epoch * logical_epoch_ms`` so that replays after crashes reproduce time-based results
    bit for bit.
    """

    name: str
    source: Source
    key: str | Sequence[str]
    aggregate: Sequence[Aggregation] | None = None
    process: ProcessFn | None = None
    code_version: str = "1"
    config: Mapping[str, Any] = field(default_factory=dict)
    time_mode: str = "wall"
    logical_epoch_ms: int = 1000
    #: destinations outside the store each epoch's output is committed to (`sinks.Sink`:
    #: prepare, commit, committed and a name of their own)
    sinks: Sequence[Sink] = ()
    #: the event-time column and allowed delay: each epoch records its watermark
    #: (runners.engine.eventtime)
    event_time: EventTime | None = None
    #: tumbling, sliding or session event-time windows of the aggregations (needs `event_time`)
    window: Window | SessionWindow | None = None
    #: emit each key's first record, drop its duplicates until the watermark passes the first
    #: one's event time plus the delay (Spark's dropDuplicatesWithinWatermark; needs `event_time`)
    dedup_within_watermark: bool = False
    #: the per-key function's timer callback (needs `process`; ``ctx.timers`` registers)
    on_timer: TimerFn | None = None

    def __post_init__(self) -> None:
        self.sinks = list(self.sinks)
        for sink in self.sinks:
            if not isinstance(sink, Sink):
                raise JobError(
                    f"job {self.name!r}: sink {sink!r} lacks prepare/commit/committed "
                    "(runners.engine.sinks.Sink)"
                )
        sink_names = [s.name for s in self.sinks]
        if len(set(sink_names)) != len(sink_names):
            raise JobError(f"job {self.name!r}: sinks {sink_names} share a name: give each its own")
        try:
            join_check(self)  # an IntervalJoin source: neither, its event time
        except EventTimeError as exc:
            raise JobError(str(exc)) from None
        forms = [self.aggregate is not None, self.process is not None, self.dedup_within_watermark]
        if not is_join(self) and sum(forms) != 1:
            raise JobError(
                f"job {self.name!r}: give exactly one of aggregate=[…], process=fn or "
                "dedup_within_watermark=True"
            )
        if self.aggregate is not None:
            self.aggregate = list(self.aggregate)
            if not self.aggregate:
                raise JobError(f"job {self.name!r}: aggregate=[] computes nothing")
            names = [a.name for a in self.aggregate]
            if len(set(names)) != len(names):
                raise JobError(f"job {self.name!r}: aggregations repeat a column: {names}")
            clash = set(names) & set(self.key_columns)
            if clash:
                raise JobError(f"job {self.name!r}: aggregate columns {clash} clash with the key")
        if self.time_mode not in ("wall", "logical"):
            raise JobError(f"time_mode must be 'wall' or 'logical', not {self.time_mode!r}")
        if not self.key_columns:
            raise JobError(f"job {self.name!r}: key names no column")
        try:
            check_dedup(self)
            check_window(self)
        except EventTimeError as exc:
            raise JobError(str(exc)) from None
        self._check_on_timer()

    def _check_on_timer(self) -> None:
        if self.on_timer is None:
            return
        if self.process is None:
            raise JobError(
                f"job {self.name!r}: on_timer runs with a per-key function: give process=fn "
                "(aggregate=[…] and windows have no timers)"
            )
        if not callable(self.on_timer):
            raise JobError(
                f"job {self.name!r}: on_timer must be a function (key, timestamp_ms, state, "
                f"ctx) -> rows, not {self.on_timer!r}"
            )

    @property
    def closes_by_watermark(self) -> bool:
        """Whether its state has parts the watermark closes (windows, buffered join rows,
        remembered keys): the snapshot then records per key group when the earliest one is due."""
        return self.window is not None or is_join(self) or self.dedup_within_watermark

    @property
    def key_columns(self) -> tuple[str, ...]:
        return (self.key,) if isinstance(self.key, str) else tuple(self.key)

    @property
    def aggregations(self) -> list[Aggregation]:
        return list(self.aggregate or [])

    @property
    def config_hash(self) -> str:
        doc: dict[str, Any] = {"name": self.name, "key": list(self.key_columns)}
        doc["config"] = self.config
        doc["aggregate"] = [a.name for a in self.aggregations]
        if self.event_time is not None:  # a job without them keeps its hash
            doc["event_time"] = self.event_time.describe()
        if self.window is not None:
            doc["window"] = self.window.describe()
        if is_join(self):
            doc["join"] = self.source.describe()  # type: ignore[attr-defined]
        if self.dedup_within_watermark:
            doc["dedup_within_watermark"] = True
        raw = json.dumps(doc, sort_keys=True, default=str).encode()
        return hashlib.sha256(raw).hexdigest()

    @property
    def input_columns(self) -> list[str]:
        """Columns the aggregate path reads (None = all for the per-key path)."""
        cols = list(self.key_columns)
        for a in self.aggregations:
            if a.column is not None and a.column not in cols:
                cols.append(a.column)
        if self.event_time is not None and self.event_time.column not in cols:
            cols.append(self.event_time.column)
        return cols
