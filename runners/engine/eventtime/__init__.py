"""Event time: watermarks carried in the snapshot, and windowed aggregation (docs/engine.md,
"Event time")."""

from runners.engine.eventtime.epoch import (
    EpochEventTime,
    TaskEventTime,
    after_epoch,
    merged,
    on_read,
    plan_epoch,
)
from runners.engine.eventtime.joins import IntervalJoin
from runners.engine.eventtime.watermark import (
    EXTRA,
    NO_WATERMARK,
    Closed,
    EventTime,
    EventTimeError,
)
from runners.engine.eventtime.windows import SessionWindow, Window, session, sliding, tumbling

__all__ = [
    "EXTRA",
    "NO_WATERMARK",
    "Closed",
    "EpochEventTime",
    "EventTime",
    "EventTimeError",
    "IntervalJoin",
    "SessionWindow",
    "TaskEventTime",
    "Window",
    "after_epoch",
    "merged",
    "on_read",
    "plan_epoch",
    "session",
    "sliding",
    "tumbling",
]
