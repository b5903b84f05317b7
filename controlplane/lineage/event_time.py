"""Event time as the control plane shows it, from what the engine recorded
(`runners.engine.eventtime`, docs/engine.md "Event time").

Each epoch of an event-time job records two manifest stats the index keeps — `late_records`
(always) and `watermark_ms` (once there is a watermark) — and the document
``extra.event_time`` in its manifest: the watermark applied and after, the partitions, the
late count and, for windowed jobs, `due` (key group -> end of its earliest open window); a job
with timers also records `timers` (key group -> pending timers). The stats answer the job and
snapshot reads without the store; the document (read from the store) gives the per-key-group
view.

The lag is measured at the commit (the manifest's `created_at`): a commit's facts never change,
so reads of them stay cacheable by revision (docs/api.md). The lag now, which grows while a job
stands still, is the metric `epochal_job_watermark_lag_seconds`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: the manifest stats an event-time epoch records
WATERMARK_STAT = "watermark_ms"
LATE_STAT = "late_records"


@dataclass(frozen=True)
class EventTimeStats:
    """A commit's event time: its watermark (ms; None before the first event time or on a
    commit that does not record it, as a rescale's or a rollback's) and its late records."""

    watermark_ms: int | None
    late_records: int

    def lag_s(self, at: datetime) -> float | None:
        """Seconds from the watermark to `at` (None: no watermark)."""
        return watermark_lag_s(self.watermark_ms, at)

    def fields(self, at: datetime) -> dict[str, Any]:
        """The REST fields of a commit made at `at`: `watermark_ms`, `watermark_lag_s`,
        `late_records`."""
        return {
            "watermark_ms": self.watermark_ms,
            "watermark_lag_s": self.lag_s(at),
            "late_records": self.late_records,
        }


NO_EVENT_TIME: dict[str, Any] = {
    "watermark_ms": None,
    "watermark_lag_s": None,
    "late_records": None,
}
"""The REST fields of a commit without event time."""


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def event_time_stats(stats: Mapping[str, Any] | None) -> EventTimeStats | None:
    """The event time a commit's stats record (None: the commit records none)."""
    if not stats or (WATERMARK_STAT not in stats and LATE_STAT not in stats):
        return None
    return EventTimeStats(_int(stats.get(WATERMARK_STAT)), _int(stats.get(LATE_STAT)) or 0)


def watermark_lag_s(watermark_ms: int | None, at: datetime) -> float | None:
    """How far the watermark trailed wall-clock instant `at`, in seconds (None: no watermark)."""
    if watermark_ms is None:
        return None
    return round(at.timestamp() - watermark_ms / 1000, 3)


def event_time_fields(stats: Mapping[str, Any] | None, at: datetime) -> dict[str, Any]:
    """`watermark_ms`, `watermark_lag_s`, `late_records` of a commit made at `at` (all null
    for a commit without event time)."""
    facts = event_time_stats(stats)
    return dict(NO_EVENT_TIME) if facts is None else facts.fields(at)


def watermark_at(watermark_ms: int | None) -> datetime | None:
    """The watermark as an instant (UTC)."""
    return None if watermark_ms is None else datetime.fromtimestamp(watermark_ms / 1000, tz=UTC)
