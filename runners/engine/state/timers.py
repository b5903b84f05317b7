"""Timers of a per-key function (Flink's `KeyedProcessFunction` timers, Spark's
`transformWithState` timers): `ctx.timers` registers, deletes and lists the current key's
event-time and processing-time timers; `Job(on_timer=fn)` is called for each one that fires.

A key's timers are part of its keyed state: two columns of its row in the key group's chunk,
``_event_timers`` and ``_processing_timers`` (sorted ``list<int64>``, null when none), so they
move with the key group on a rescale, are restored by a rollback or a fork and replay exactly.
An event-time timer fires in the first epoch whose applied watermark (its parent's) has reached
it (``timestamp <= watermark``), a processing-time timer in the first epoch whose processing
time has (``timestamp <= processing_time_ms``); see docs/engine.md, "Timers".
"""

from __future__ import annotations

import builtins
import numbers
from collections.abc import Iterable

EVENT = "event"
PROCESSING = "processing"
DOMAINS = (EVENT, PROCESSING)
#: the state columns holding a key's pending timers (per domain)
COLUMNS = {EVENT: "_event_timers", PROCESSING: "_processing_timers"}


class TimerError(ValueError):
    """A timer the engine cannot register: names what is wrong and what to do."""


class Timers:
    """The pending timers of one key (`ctx.timers` inside `process` and `on_timer`).

    `job` names the job in errors; `on_timer`: the job has an ``on_timer`` function (without
    one a timer could never fire, so registering is refused); `event_time`: the job declares
    ``event_time`` (an event-time timer needs a watermark to fire)."""

    def __init__(
        self,
        event: Iterable[int] = (),
        processing: Iterable[int] = (),
        *,
        job: str = "",
        on_timer: bool = False,
        event_time: bool = False,
    ) -> None:
        self._pending = {EVENT: set(event), PROCESSING: set(processing)}
        self._job, self._on_timer, self._event_time = job, on_timer, event_time
        self.changed = False

    def register_event_time(self, timestamp_ms: int) -> None:
        """Fire `on_timer` once the applied watermark reaches `timestamp_ms` (event time, ms)."""
        if self._on_timer and not self._event_time:
            raise TimerError(
                f"job {self._job!r}: an event-time timer needs a watermark: declare "
                "event_time=EventTime(column, delay_ms) on the Job, or use "
                "ctx.timers.register_processing_time"
            )
        self._register(EVENT, timestamp_ms)

    def register_processing_time(self, timestamp_ms: int) -> None:
        """Fire `on_timer` in the first epoch whose processing time reaches `timestamp_ms`."""
        self._register(PROCESSING, timestamp_ms)

    def delete_event_time(self, timestamp_ms: int) -> None:
        """Forget the event-time timer at `timestamp_ms` (nothing when there is none)."""
        self._delete(EVENT, timestamp_ms)

    def delete_processing_time(self, timestamp_ms: int) -> None:
        """Forget the processing-time timer at `timestamp_ms` (nothing when there is none)."""
        self._delete(PROCESSING, timestamp_ms)

    def list(self) -> list[tuple[str, int]]:
        """The key's pending timers as (domain, timestamp_ms), in timestamp order (event before
        processing at equal times); domain is ``"event"`` or ``"processing"``."""
        return sorted(
            ((d, t) for d in DOMAINS for t in self._pending[d]),
            key=lambda item: (item[1], DOMAINS.index(item[0])),
        )

    def pending(self, domain: str) -> builtins.list[int]:
        """The pending timestamps of one domain, ascending."""
        return sorted(self._pending[domain])

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        domain, timestamp = item
        return domain in self._pending and timestamp in self._pending[domain]

    def __len__(self) -> int:
        return len(self._pending[EVENT]) + len(self._pending[PROCESSING])

    def pop(self, domain: str, timestamp_ms: int) -> bool:
        """Remove a timer about to fire; False when it was deleted meanwhile."""
        if timestamp_ms not in self._pending[domain]:
            return False
        self._pending[domain].discard(timestamp_ms)
        self.changed = True
        return True

    def _register(self, domain: str, timestamp_ms: int) -> None:
        if not self._on_timer:
            raise TimerError(
                f"job {self._job!r}: a timer needs Job(on_timer=fn) — the function called "
                "with (key, timestamp_ms, state, ctx) when it fires"
            )
        timestamp_ms = _check(timestamp_ms)
        if timestamp_ms not in self._pending[domain]:
            self._pending[domain].add(timestamp_ms)
            self.changed = True

    def _delete(self, domain: str, timestamp_ms: int) -> None:
        timestamp_ms = _check(timestamp_ms)
        if timestamp_ms in self._pending[domain]:
            self._pending[domain].discard(timestamp_ms)
            self.changed = True


def _check(timestamp_ms: object) -> int:
    """The timestamp as an int (numpy integers accepted), or a `TimerError`."""
    if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, numbers.Integral):
        raise TimerError(
            f"a timer's timestamp must be an int of milliseconds, not {timestamp_ms!r} "
            f"({type(timestamp_ms).__name__}): convert it, e.g. int(ts)"
        )
    if not -(2**63) <= int(timestamp_ms) < 2**63:
        raise TimerError(f"a timer's timestamp {timestamp_ms} does not fit in int64 milliseconds")
    return int(timestamp_ms)
