"""The event-time view of a snapshot (the job page's head, the lineage page's snapshot panel):
watermark, late records, partitions, and per key group its open windows and pending timers
(`controlplane.lineage.event_time_reads`)."""

from __future__ import annotations

from typing import Any

from controlplane.applications.models import Application
from controlplane.errors import NotFound
from controlplane.lineage.event_time_reads import snapshot_event_time


def event_time_context(application: Application, snapshot_id: str | None) -> dict[str, Any]:
    """`event_time` (None: no snapshot, or one without event time) and `event_time_note`
    (why it cannot be shown)."""
    if snapshot_id is None:
        return {"event_time": None, "event_time_note": ""}
    try:
        found = snapshot_event_time(application=application, snapshot_id=snapshot_id)
    except NotFound as exc:
        return {"event_time": None, "event_time_note": exc.message}
    return {"event_time": found, "event_time_note": ""}
