"""Every change of an operation's state and of its phases' states, in one place.

The executor (a worker running the phases) and cancellation (a request) both go through
here. An operation moves PENDING -> RUNNING -> one terminal state (SUCCEEDED, FAILED,
CANCELLED), or PENDING -> CANCELLED; a terminal state is written once: `finish` is a
conditional update on an active operation, so a second writer (a late worker, a cancel that
raced the end) changes nothing and learns the state that won. A phase moves PENDING ->
RUNNING -> SUCCEEDED or FAILED (SKIPPED counts as done).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from typing import Any

from django.db.models import Q
from django.utils import timezone

from controlplane.operations.models import ACTIVE_STATES, Operation, OperationState


class PhaseState(enum.StrEnum):
    """The state of one phase record (`Operation.phases`, stored as its string)."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    SKIPPED = "skipped"
    FAILED = "failed"


DONE_PHASES = frozenset({PhaseState.SUCCEEDED, PhaseState.SKIPPED})
"""A phase in one of these states is not run again."""

CANCELLED_EARLY = "cancelled before it started"
"""The message of an operation cancelled while still pending."""

TERMINAL_STATES = frozenset(
    {OperationState.SUCCEEDED, OperationState.FAILED, OperationState.CANCELLED}
)


def _iso(value: dt.datetime | None = None) -> str:
    return (value or timezone.now()).isoformat()


# -- phases ----------------------------------------------------------------------------------


def phase_records(names: Sequence[str]) -> list[dict[str, Any]]:
    """Fresh records, all PENDING, for phases `names` in order."""
    return [
        {
            "name": name,
            "state": PhaseState.PENDING.value,
            "started_at": None,
            "finished_at": None,
            "progress": 0.0,
            "detail": "",
        }
        for name in names
    ]


def phase_record(operation: Operation, name: str) -> dict[str, Any]:
    return next(r for r in operation.phases if r["name"] == name)


def phase_is_done(record: dict[str, Any]) -> bool:
    return record["state"] in DONE_PHASES


def _save_phases(operation: Operation) -> None:
    done = sum(
        1.0 if phase_is_done(p) else float(p.get("progress") or 0.0) for p in operation.phases
    )
    operation.progress = round(done / max(1, len(operation.phases)), 4)
    operation.save(update_fields=["phases", "current_phase", "progress", "updated_at"])


def phase_progress(operation: Operation, phase: str, fraction: float, detail: str) -> None:
    """Record how far phase `phase` got (0..1) and what it says."""
    record = phase_record(operation, phase)
    record["progress"] = max(0.0, min(1.0, float(fraction)))
    if detail:
        record["detail"] = detail
    _save_phases(operation)


def phase_start(operation: Operation, phase: str) -> None:
    """PENDING (or RUNNING, on a retry) -> RUNNING; the operation's current phase."""
    record = phase_record(operation, phase)
    record["state"] = PhaseState.RUNNING.value
    record["started_at"] = record["started_at"] or _iso()
    operation.current_phase = phase
    _save_phases(operation)


def phase_succeed(operation: Operation, phase: str) -> dict[str, Any]:
    """RUNNING -> SUCCEEDED; the record."""
    record = phase_record(operation, phase)
    record["state"] = PhaseState.SUCCEEDED.value
    record["progress"] = 1.0
    record["finished_at"] = _iso()
    _save_phases(operation)
    return record


def phase_fail_running(operation: Operation, message: str) -> None:
    """The running phase (if any) -> FAILED, with `message`."""
    for record in operation.phases:
        if record["state"] == PhaseState.RUNNING:
            record["state"] = PhaseState.FAILED.value
            record["finished_at"] = _iso()
            record["detail"] = message[:2000]
    _save_phases(operation)


# -- the operation ---------------------------------------------------------------------------


def operation_start(operation: Operation, phase_names: Sequence[str]) -> None:
    """PENDING -> RUNNING (the first worker to run it)."""
    operation.state = OperationState.RUNNING
    operation.started_at = timezone.now()
    if not operation.phases:
        operation.phases = phase_records(phase_names)
    operation.save(update_fields=["state", "started_at", "phases", "updated_at"])


def operation_finish(
    operation: Operation,
    state: str,
    *,
    code: str = "",
    message: str = "",
    detail: dict[str, Any] | None = None,
    cancel_requested: bool | None = None,
) -> bool:
    """Active -> terminal `state`, once: True when this call wrote it; False when the
    operation had ended already (`operation` then shows the state that won)."""
    if state not in TERMINAL_STATES:
        raise ValueError(f"{state!r} is not a terminal operation state")
    changes: dict[str, Any] = {
        "state": state,
        "finished_at": timezone.now(),
        "error_code": "" if state == OperationState.SUCCEEDED else code,
        "error_message": message,
        "lease_owner": "",
        "lease_expires_at": None,
        "updated_at": timezone.now(),
    }
    if detail:
        changes["result"] = {**operation.result, "error_detail": detail}
    if state == OperationState.SUCCEEDED:
        changes["progress"] = 1.0
    if cancel_requested is not None:
        changes["cancel_requested"] = cancel_requested
    written = Operation.objects.filter(Q(pk=operation.pk), Q(state__in=ACTIVE_STATES)).update(
        **changes
    )
    if written:
        for name, value in changes.items():
            setattr(operation, name, value)
    else:
        operation.refresh_from_db()
    return bool(written)


def operation_request_cancel(operation: Operation) -> None:
    """Ask a running operation to stop at its next cancellable point."""
    operation.cancel_requested = True
    operation.save(update_fields=["cancel_requested", "updated_at"])
