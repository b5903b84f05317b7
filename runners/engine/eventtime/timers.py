"""The timers of per-key functions in the snapshot: which key groups hold pending timers, and
when their earliest ones are due.

Every epoch of a job with ``on_timer`` records in its manifest's ``extra.timers`` per key group
with pending timers the earliest event-time timer (``event``), the earliest processing-time
timer (``processing``) and how many timers are pending (``pending``), with the M they belong to.
The next epoch visits the key groups whose earliest timer is due — event time: at or before the
watermark it applies; processing time: at or before its processing time — even without input
for them, and the runner commits an epoch without input when timers are due and the source has
no new data (as for windows). Rollback, fork and rescale commits carry the document
(`state_ops.CARRIED_EXTRA`); after a migration every key group with state is visited once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: the manifest's ``extra`` key of the timers document
EXTRA = "timers"

#: per key group: (earliest event-time timer, earliest processing-time timer, timers pending),
#: or None when it has none left
KeyGroupTimers = tuple[int | None, int | None, int] | None


@dataclass(frozen=True)
class TimerDoc:
    """``extra.timers`` of one snapshot."""

    event: Mapping[int, int] = field(default_factory=dict)
    processing: Mapping[int, int] = field(default_factory=dict)
    pending: Mapping[int, int] = field(default_factory=dict)
    max_parallelism: int = 0

    def to_doc(self) -> dict[str, Any]:
        def keyed(values: Mapping[int, int]) -> dict[str, int]:
            return {str(kg): v for kg, v in sorted(dict(values).items())}

        return {
            "event": keyed(self.event),
            "processing": keyed(self.processing),
            "pending": keyed(self.pending),
            "max_parallelism": self.max_parallelism,
        }

    @classmethod
    def of_manifest(cls, manifest: Any) -> TimerDoc:
        doc = None if manifest is None else manifest.extra.get(EXTRA)
        if not isinstance(doc, dict):
            return cls()

        def keyed(name: str) -> dict[int, int]:
            return {int(kg): int(v) for kg, v in doc.get(name, {}).items()}

        return cls(
            keyed("event"), keyed("processing"), keyed("pending"), int(doc["max_parallelism"])
        )


def due_key_groups(job: Any, parent: Any, watermark_ms: int, now_ms: int) -> tuple[int, ...]:
    """The key groups an epoch visits for their timers: an event-time timer at or before the
    applied watermark, or a processing-time timer at or before the epoch's processing time.
    After a migration (another M, or a rehash or transform) every key group with state."""
    if getattr(job, "on_timer", None) is None or parent is None:
        return ()
    doc = TimerDoc.of_manifest(parent)
    if parent.kind == "migration" or doc.max_parallelism != parent.max_parallelism:
        return tuple(sorted(int(kg) for kg in parent.key_groups))
    due = {kg for kg, ts in doc.event.items() if ts <= watermark_ms}
    due |= {kg for kg, ts in doc.processing.items() if ts <= now_ms}
    return tuple(sorted(due))


def after_epoch(
    job: Any,
    parent: Any,
    reports: Iterable[Mapping[int, KeyGroupTimers]],
    fired: int,
    max_parallelism: int,
) -> tuple[dict[str, Any], dict[str, int]]:
    """(the manifest's ``extra`` entry, its stats ``timers_fired`` and ``timers_pending``) of
    an epoch of a job with ``on_timer``: the parent's document updated with the key groups the
    epoch wrote."""
    if getattr(job, "on_timer", None) is None:
        return {}, {}
    previous = TimerDoc.of_manifest(parent)
    same = previous.max_parallelism == max_parallelism
    event = dict(previous.event) if same else {}
    processing = dict(previous.processing) if same else {}
    pending = dict(previous.pending) if same else {}
    for report in reports:
        for kg, timers in report.items():
            for values in (event, processing, pending):
                values.pop(kg, None)
            if timers is None:
                continue
            first_event, first_processing, count = timers
            if first_event is not None:
                event[kg] = first_event
            if first_processing is not None:
                processing[kg] = first_processing
            if count:
                pending[kg] = count
    doc = TimerDoc(event, processing, pending, max_parallelism)
    stats = {"timers_fired": fired, "timers_pending": sum(pending.values())}
    return {EXTRA: doc.to_doc()}, stats
