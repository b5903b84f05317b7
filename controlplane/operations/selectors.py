"""Reads for operations."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import FilteredRelation, OuterRef, Q, QuerySet, Subquery

from controlplane.changes.keys import operation_key
from controlplane.changes.selectors import job_key_expression, revision_subquery
from controlplane.errors import NotFound
from controlplane.jobs.models import Job, Run
from controlplane.jobs.selectors import job_not_found
from controlplane.operations.models import ACTIVE_STATES, Operation


def operation_get(*, operation_id: str) -> Operation:
    """The operation, with its `revision` (`controlplane.changes`) read in the same query."""
    try:
        key = uuid.UUID(str(operation_id))
        return (
            Operation.objects.select_related("application", "job", "requested_by")
            .annotate(revision=revision_subquery(operation_key(key)))
            .get(pk=key)
        )
    except (Operation.DoesNotExist, ValueError):
        raise NotFound(
            f"no operation {operation_id}; list operations with GET /api/operations/",
            code="operation_not_found",
        ) from None


def operation_list(
    *,
    job: str | None = None,
    application: str | None = None,
    kind: str | None = None,
    state: str | None = None,
) -> QuerySet[Operation]:
    ops = Operation.objects.select_related("application", "job", "requested_by").order_by(
        "-created_at"
    )
    if job:
        ops = ops.filter(job__name=job)
    if application:
        ops = ops.filter(application__name=application)
    if kind:
        ops = ops.filter(kind=kind)
    if state:
        ops = ops.filter(state=state)
    return ops


def operation_active_for_job(*, job_id: int) -> Operation | None:
    return Operation.objects.filter(job_id=job_id, state__in=ACTIVE_STATES).first()


def operation_for_idempotency_key(*, user: Any, idempotency_key: str) -> Operation | None:
    """The operation `user` requested with `idempotency_key` (added for the REST API)."""
    if not idempotency_key or user is None or not getattr(user, "is_authenticated", False):
        return None
    return (
        Operation.objects.select_related("application", "job", "requested_by")
        .filter(requested_by=user, idempotency_key=idempotency_key)
        .first()
    )


def job_overview(*, name: str) -> Job:
    """Job `name` in one query with its application, version, `revision`, newest run
    (`latest_run`, None before the first) and active operation (`active_operation`)."""
    newest_run = Run.objects.filter(job=OuterRef("pk")).order_by("-created_at", "-id")
    found = (
        Job.objects.select_related("application", "version")
        .annotate(
            revision=revision_subquery(job_key_expression()),
            active_operation=FilteredRelation(
                "operations", condition=Q(operations__state__in=ACTIVE_STATES)
            ),
            latest_run=FilteredRelation(
                "runs", condition=Q(runs__id=Subquery(newest_run.values("id")[:1]))
            ),
        )
        .select_related("active_operation", "active_operation__requested_by", "latest_run")
        .filter(name=name)
        .first()
    )
    if found is None:
        raise job_not_found(name)
    # A filtered relation that matched no row leaves no attribute: make both always present.
    found.latest_run = getattr(found, "latest_run", None)  # type: ignore[attr-defined]
    operation = found.active_operation = getattr(found, "active_operation", None)  # type: ignore[attr-defined]
    if operation is not None:  # the operation's own links, without asking again
        operation.application = found.application
        operation.job = found
    return found
