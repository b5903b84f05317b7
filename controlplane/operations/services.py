"""Requesting and cancelling operations.

`operation_request` validates, then writes the operation (the intent) in one transaction, and
only after the commit hands it to a worker. The database decides conflicts: a partial unique
index allows one active operation per job, and (requester, idempotency key) is unique, so of
any number of concurrent requests exactly one is accepted, a repeat with the same key returns
the same operation, and the others get `Conflict` naming the running operation.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import signature
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction

from controlplane.applications.models import Application
from controlplane.audit.services import audit_execution
from controlplane.errors import (
    Conflict,
    InvalidRequest,
    StateRefusal,
    Unprocessable,
    UnusableRequest,
)
from controlplane.jobs.models import Job
from controlplane.operations.framework import Target
from controlplane.operations.models import (
    ACTIVE_STATES,
    IDEMPOTENCY_KEY_MAX,
    Operation,
    OperationState,
)
from controlplane.operations.params import check_params
from controlplane.operations.registry import operation_spec
from controlplane.operations.transitions import (
    CANCELLED_EARLY,
    DONE_PHASES,
    operation_finish,
    operation_request_cancel,
    phase_records,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Requested:
    operation: Operation
    created: bool
    """False when an earlier request with the same idempotency key is returned."""


def _user(user: AbstractBaseUser | AnonymousUser | None) -> AbstractBaseUser | None:
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return user  # type: ignore[return-value]


def request_fingerprint(*, user: Any, method: str, path: str, body: Any) -> str:
    """What an idempotency key is bound to: the user, method, path and (canonical) body."""
    canonical = json.dumps(
        {"user": getattr(user, "pk", None), "method": method, "path": path, "body": body},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _keyed(requester: AbstractBaseUser | None, key: str, fingerprint: str = "") -> Operation | None:
    """The operation an earlier request of `requester` with idempotency key `key` created;
    `Unprocessable` (422) when that request was a different one (Stripe's rule)."""
    if not key:
        return None
    earlier = Operation.objects.filter(requested_by=requester, idempotency_key=key).first()
    if (
        earlier is not None
        and fingerprint
        and earlier.request_fingerprint
        and earlier.request_fingerprint != fingerprint
    ):
        raise Unprocessable(
            f"Idempotency-Key {key!r} was used for a different request (operation {earlier.pk});"
            " use a new key for a new request",
            code="idempotency_key_reused",
            fields={"Idempotency-Key": ["used before with another method, path or body"]},
            detail={"operation": str(earlier.pk)},
        )
    return earlier


#: what a kind refuses because of the job's current state (409); anything else it refuses in
#: a well-formed request is about what the request names (an unknown snapshot, a parallelism
#: above M, an unregistered function): 422
STATE_REFUSALS = frozenset(
    {"no_change", "empty_branch", "alignment_pending", "alignment_refused", "job_not_running"}
)


def _unusable(exc: InvalidRequest) -> InvalidRequest:
    """A kind's refusal of parameters the schema accepts (`check_params` ran first): never a
    400, since the request is well-formed; 409 or 422 with the same code, message and fields."""
    if exc.http_status != InvalidRequest.http_status:
        return exc
    kind = StateRefusal if exc.code in STATE_REFUSALS else UnusableRequest
    return kind(exc.message, code=exc.code, fields=exc.fields, detail=exc.detail)


def _running_conflict(job: Job) -> Conflict:
    active = Operation.objects.filter(job=job, state__in=ACTIVE_STATES).first()
    if active is None:
        return Conflict(f"job {job.name} changed while the request was made; retry")
    return Conflict(
        f"job {job.name} already has a {active.state} {active.kind} operation {active.pk} "
        f"(phase {active.current_phase or 'not started'}); wait for it to end or cancel it",
        code="operation_in_progress",
        detail={"operation": str(active.pk), "kind": active.kind, "state": active.state},
    )


def _branch_conflict(application: Application, branch: str) -> Conflict:
    other = Operation.objects.filter(
        application=application, target_branch=branch, state__in=ACTIVE_STATES
    ).first()
    where = "" if other is None else f" (operation {other.pk}, {other.state})"
    return Conflict(
        f"another operation is creating branch {branch!r} of {application.name}{where}; "
        "wait for it to end or choose another branch",
        code="branch_pending",
        fields={"branch": ["being created by another operation"]},
        detail={} if other is None else {"operation": str(other.pk)},
    )


def operation_request(
    *,
    kind: str,
    application: Application,
    job: Job | None = None,
    params: Mapping[str, Any] | None = None,
    user: AbstractBaseUser | AnonymousUser | None = None,
    idempotency_key: str = "",
    fingerprint: str = "",
    reason: str = "",
    via: str = "api",
    dispatch: bool = True,
) -> Requested:
    """Validate and record an operation, then dispatch it to a worker (after commit).

    Idempotent replay is decided here and only here: a request whose key an earlier request
    of the same user carried gets that request's operation (`created=False`) — also when a
    concurrent request with the key committed while this one was checked (which would
    otherwise look like a conflict)."""
    requester = _user(user)
    try:
        return _operation_record(
            kind=kind,
            application=application,
            job=job,
            params=params,
            user=user,
            idempotency_key=idempotency_key,
            fingerprint=fingerprint,
            reason=reason,
            via=via,
            dispatch=dispatch,
        )
    except Conflict:
        replay = _keyed(requester, idempotency_key, fingerprint)
        if replay is None:
            raise
        return Requested(replay, created=False)


def _operation_record(
    *,
    kind: str,
    application: Application,
    job: Job | None,
    params: Mapping[str, Any] | None,
    user: AbstractBaseUser | AnonymousUser | None,
    idempotency_key: str,
    fingerprint: str,
    reason: str,
    via: str,
    dispatch: bool,
) -> Requested:
    params = dict(params or {})
    requester = _user(user)
    if len(idempotency_key) > IDEMPOTENCY_KEY_MAX:
        raise InvalidRequest(
            f"the idempotency key is longer than {IDEMPOTENCY_KEY_MAX} characters",
            fields={"idempotency_key": [f"at most {IDEMPOTENCY_KEY_MAX} characters"]},
        )
    earlier = _keyed(requester, idempotency_key, fingerprint)
    if earlier is not None:
        return Requested(earlier, created=False)
    spec = operation_spec(kind)
    spec.authorize(params, Target(application=application, job=job, user=user))
    check_params(kind, params)
    if spec.needs_job and job is None:
        raise InvalidRequest(
            f"a {kind} operation acts on a job; name one", fields={"job": ["required"]}
        )
    if job is not None and job.application_id != application.pk:
        raise InvalidRequest(f"job {job.name} belongs to another application")
    active = Operation.objects.filter(job=job, state__in=ACTIVE_STATES)
    if job is not None and spec.needs_job and active.exists():
        raise _running_conflict(job)  # or a replay: `operation_request` looks again
    try:
        cleaned = spec.clean(params, Target(application=application, job=job, user=user))
    except InvalidRequest as exc:
        raise _unusable(exc) from None
    new_branch = spec.creates_branch(cleaned)
    operation = Operation(
        kind=kind,
        application=application,
        job=job if spec.needs_job else None,
        params=cleaned,
        reason=reason,
        idempotency_key=idempotency_key,
        request_fingerprint=fingerprint if idempotency_key else "",
        requested_by=requester,
        requested_via=via,
        target_branch=new_branch,
        phases=phase_records([p.name for p in spec.phases(cleaned)]),
    )
    if not spec.needs_job and job is not None:
        operation.context = {"source_job": job.name}
    try:
        with transaction.atomic():
            operation.save()
            if dispatch:
                transaction.on_commit(lambda: operation_dispatch(operation))
    except IntegrityError:
        earlier = _keyed(requester, idempotency_key, fingerprint)
        if earlier is not None:
            return Requested(earlier, created=False)
        if job is not None and spec.needs_job:
            raise _running_conflict(job) from None
        if new_branch:
            raise _branch_conflict(application, new_branch) from None
        raise
    audit_execution(
        operation=operation,
        action=f"operation.{kind}",
        outcome="requested",
        detail={"params": cleaned, "via": via},
        source=via,  # the request came this way; the worker only executes it
    )
    return Requested(operation, created=True)


RUN_OPERATION_TASK = "epochal.run_operation"
#: one more try after a failed send (a pooled connection the broker's restart closed), not
#: Celery's three: a broker that is away costs a request at most two broker timeouts
SEND_RETRY_POLICY = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.2,
}


def operation_enqueue(operation_id: str) -> None:
    """Send `epochal.run_operation` to the broker, by the task's name: the one place that does.

    A signature by name keeps this module free of an import of `tasks` (which imports the
    executor and the reconciler); Celery still runs it eagerly when the app says so.
    """
    signature(RUN_OPERATION_TASK, args=(operation_id,)).apply_async(retry_policy=SEND_RETRY_POLICY)


def broker_unavailable(exc: BaseException) -> str:
    """What a send the broker refused tells an operator: which broker (its URL without
    credentials) and why."""
    from celery import current_app
    from kombu.utils.url import maybe_sanitize_url

    url = maybe_sanitize_url(str(current_app.conf.broker_write_url or ""))  # what sends use
    why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"the broker ({url}) is unavailable: {why}"


def operation_dispatch(operation: Operation) -> None:
    """Hand the operation to a Celery worker. When the broker is away the operation stays
    recorded as pending and no worker holds it: the reconciler's next pass after the broker
    is back dispatches it (`reconciler.reconcile_operations`), and the executor's lease runs
    it once however many messages reach workers."""
    try:
        operation_enqueue(str(operation.pk))
    except Exception as exc:
        log.warning(
            "operation %s (%s) recorded but not dispatched: %s; it stays pending until the "
            "reconciler dispatches it",
            operation.pk,
            operation.kind,
            broker_unavailable(exc),
        )


def operation_cancel(
    *, operation: Operation, user: AbstractBaseUser | AnonymousUser | None = None
) -> Operation:
    """Cancel a pending operation now, or a running one at its next cancellable point."""
    with transaction.atomic():
        op = Operation.objects.select_for_update().get(pk=operation.pk)
        if op.state not in ACTIVE_STATES:
            raise Conflict(
                f"operation {op.pk} has ended ({op.state}); nothing to cancel",
                code="operation_ended",
            )
        if op.state == OperationState.PENDING:
            operation_finish(
                op,
                OperationState.CANCELLED,
                code="cancelled",
                message=CANCELLED_EARLY,
                cancel_requested=True,
            )
        else:
            spec = operation_spec(op.kind)
            names = [r["name"] for r in op.phases if r["state"] not in DONE_PHASES]
            cancellable = {p.name for p in spec.phases(op.params) if p.cancellable}
            if not any(name in cancellable for name in names):
                raise Conflict(
                    f"operation {op.pk} is past the point where it can be cancelled (phase "
                    f"{op.current_phase}); wait for it to end and undo it with a new operation",
                    code="not_cancellable",
                )
            operation_request_cancel(op)
    audit_execution(
        operation=op,
        action=f"operation.{op.kind}",
        outcome="cancel-requested",
        detail={"by": getattr(user, "username", "")},
    )
    return op
