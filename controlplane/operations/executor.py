"""Running an operation: take the lease, run the unfinished phases in order, record the end.

Exactly one worker executes an operation at a time: it holds a lease (`lease_owner`,
`lease_expires_at`) that a heartbeat thread renews. A worker that dies (SIGKILL, OOM, a lost
node) stops renewing; once the lease expires the reconciler dispatches the operation again
and the next worker resumes at the first phase not recorded as succeeded. Unexpected errors
are retried (with back-off) up to `EPOCHAL_OPERATION_MAX_ATTEMPTS` times; domain errors
(`EpochalError`) fail the operation at once with their code and message.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import signal
import socket
import threading
import traceback
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.db.models import F, Q
from django.utils import timezone

from controlplane.audit.services import audit_execution
from controlplane.errors import EpochalError
from controlplane.operations.framework import CancelledError, Phase, PhaseContext
from controlplane.operations.models import ACTIVE_STATES, Operation, OperationState
from controlplane.operations.registry import operation_spec
from controlplane.operations.transitions import (
    CANCELLED_EARLY,
    operation_finish,
    operation_start,
    phase_fail_running,
    phase_is_done,
    phase_progress,
    phase_record,
    phase_start,
    phase_succeed,
)

log = logging.getLogger(__name__)


QUEUED = "queued"
"""Lease owner of an operation handed to the broker but not yet taken by a worker."""


class LeaseLostError(Exception):
    """Another worker took the operation over (our lease expired); stop quietly."""


CRASH_ENV = "EPOCHAL_OPERATION_CRASH_AT"


def _maybe_crash(kind: str, phase: str, when: str) -> None:
    """Fault injection for tests: ``EPOCHAL_OPERATION_CRASH_AT=<kind>:<phase>[:before|after]``
    SIGKILLs the worker right before a phase runs or right after it acted but before its
    success is recorded (default: after). Never set in production."""
    raw = str(settings.EPOCHAL_OPERATION_CRASH_AT)
    if not raw:
        return
    parts = raw.split(":")
    point = (parts[0], parts[1], parts[2] if len(parts) > 2 else "after")
    if point == (kind, phase, when):
        log.warning("%s=%s: killing this worker", CRASH_ENV, raw)
        os.kill(os.getpid(), signal.SIGKILL)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def _lease_s() -> float:
    return float(settings.EPOCHAL_OPERATION_LEASE_S)


def _now() -> dt.datetime:
    return timezone.now()


def acquire_lease(operation_id: Any, owner: str) -> bool:
    """Take (or renew) the lease on an active operation; False when someone else holds it."""
    now = _now()
    taken = (
        Operation.objects.filter(pk=operation_id, state__in=ACTIVE_STATES)
        .filter(
            Q(lease_expires_at__isnull=True)
            | Q(lease_expires_at__lt=now)
            | Q(lease_owner=owner)
            | Q(lease_owner=QUEUED)
        )
        .update(
            lease_owner=owner,
            lease_expires_at=now + dt.timedelta(seconds=_lease_s()),
            attempts=F("attempts") + 1,
        )
    )
    return taken == 1


class _Heartbeat:
    """Renews the lease every third of its length until stopped; notes when it is lost."""

    def __init__(self, operation_id: Any, owner: str) -> None:
        self.operation_id = operation_id
        self.owner = owner
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="epochal-lease", daemon=True)

    def renew(self) -> None:
        renewed = Operation.objects.filter(pk=self.operation_id, lease_owner=self.owner).update(
            lease_expires_at=_now() + dt.timedelta(seconds=_lease_s())
        )
        if renewed == 0:
            self.lost = True

    def check(self) -> None:
        if self.lost:
            raise LeaseLostError(str(self.operation_id))

    def _loop(self) -> None:
        try:
            while not self._stop.wait(_lease_s() / 3):
                try:
                    self.renew()
                except Exception as exc:  # the database blinked: try again next beat
                    log.warning("lease renewal of %s failed: %s", self.operation_id, exc)
                    # on a new connection: Django never reopens a broken one by itself, and a
                    # heartbeat that cannot renew lets the lease expire under a running phase
                    connection.close()
        finally:
            connection.close()

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def execute(operation_id: Any, *, owner: str | None = None) -> str:
    """Run operation `operation_id` to its end (or until the lease is lost); its final state."""
    owner = owner or worker_id()
    close_old_connections()
    if not acquire_lease(operation_id, owner):
        current = Operation.objects.filter(pk=operation_id).values_list("state", flat=True).first()
        return current or "missing"
    operation = Operation.objects.select_related("application", "job", "requested_by").get(
        pk=operation_id
    )
    phases = operation_spec(operation.kind).phases(operation.params)
    if operation.state == OperationState.PENDING and operation.cancel_requested:
        return _finish(
            operation, OperationState.CANCELLED, code="cancelled", message=CANCELLED_EARLY
        )
    _begin(operation, phases)
    with _Heartbeat(operation.pk, owner) as heartbeat:
        try:
            for phase in phases:
                _run_phase(operation, phase, heartbeat)
        except LeaseLostError:
            log.warning("operation %s: lease lost to another worker; stopping", operation.pk)
            return "lease-lost"
        except CancelledError as exc:
            return _finish(
                operation,
                OperationState.CANCELLED,
                code="cancelled",
                message=f"cancelled before phase {exc}",
            )
        except EpochalError as exc:
            phase_fail_running(operation, str(exc))
            return _finish(
                operation,
                OperationState.FAILED,
                code=exc.code,
                message=exc.message,
                detail=exc.detail,
            )
        except Exception as exc:
            return _retry_or_fail(operation, exc)
    return _finish(operation, OperationState.SUCCEEDED)


def _begin(operation: Operation, phases: list[Phase]) -> None:
    """Start a pending operation, or note that a worker resumes a running one."""
    if operation.state == OperationState.PENDING:
        operation_start(operation, [p.name for p in phases])
        audit_execution(
            operation=operation, action=f"operation.{operation.kind}", outcome="started"
        )
        return
    audit_execution(
        operation=operation,
        action=f"operation.{operation.kind}",
        outcome="resumed",
        detail={"attempt": operation.attempts, "phase": operation.current_phase},
    )


def _run_phase(operation: Operation, phase: Phase, heartbeat: _Heartbeat) -> None:
    """Run `phase` unless it is done; CancelledError when a cancel may end it here."""
    if phase_is_done(phase_record(operation, phase.name)):
        return
    operation.refresh_from_db(fields=["cancel_requested"])
    if operation.cancel_requested and phase.cancellable:
        raise CancelledError(phase.name)
    heartbeat.check()
    phase_start(operation, phase.name)

    def beat() -> None:
        heartbeat.check()
        heartbeat.renew()

    _maybe_crash(operation.kind, phase.name, "before")
    phase.run(
        PhaseContext(
            operation, phase.name, beat, functools.partial(phase_progress, operation, phase.name)
        )
    )
    _maybe_crash(operation.kind, phase.name, "after")
    heartbeat.check()
    record = phase_succeed(operation, phase.name)
    audit_execution(
        operation=operation,
        action=f"operation.{operation.kind}.{phase.name}",
        outcome="succeeded",
        detail={"detail": record.get("detail", "")},
    )


def retry_backoff_s(attempts: int) -> float:
    """How long an operation whose phase raised waits before its next attempt."""
    return min(60.0, 2.0**attempts)


def _retry_or_fail(operation: Operation, exc: Exception) -> str:
    limit = int(settings.EPOCHAL_OPERATION_MAX_ATTEMPTS)
    operation.refresh_from_db(fields=["attempts"])
    trace = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    log.exception("operation %s: phase %s raised", operation.pk, operation.current_phase)
    if operation.attempts >= limit:
        phase_fail_running(operation, trace)
        return _finish(
            operation,
            OperationState.FAILED,
            code="internal_error",
            message=f"phase {operation.current_phase} failed {operation.attempts} times; "
            f"last error: {trace}. Check the worker log, fix the cause and request the "
            "operation again.",
        )
    backoff = retry_backoff_s(operation.attempts)
    Operation.objects.filter(pk=operation.pk).update(
        lease_owner="", lease_expires_at=_now() + dt.timedelta(seconds=backoff)
    )
    audit_execution(
        operation=operation,
        action=f"operation.{operation.kind}.{operation.current_phase}",
        outcome="retrying",
        detail={"error": trace, "attempt": operation.attempts, "retry_in_s": backoff},
    )
    return "retrying"


def _finish(
    operation: Operation,
    state: str,
    *,
    code: str = "",
    message: str = "",
    detail: dict[str, Any] | None = None,
) -> str:
    """End the operation in `state` (through `operation_finish`, once), audit and reindex;
    the state the operation ended in (another writer's, when it was first)."""
    if not operation_finish(operation, state, code=code, message=message, detail=detail):
        return str(operation.state)
    audit_execution(
        operation=operation,
        action=f"operation.{operation.kind}",
        outcome=state,
        detail={"code": code, "message": message} if code else {},
    )
    _after(operation)
    return state


def _after(operation: Operation) -> None:
    """Best effort: index the commits the operation made so the lineage shows them now."""
    try:
        from controlplane.jobs.store import application_repository
        from controlplane.lineage.services import reindex_application

        reindex_application(
            application=operation.application,
            repo=application_repository(operation.application),
        )
    except Exception:
        log.warning("reindex after operation %s failed", operation.pk, exc_info=True)
