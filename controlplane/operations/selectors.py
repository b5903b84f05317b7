"""Reads for operations."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet

from controlplane.errors import NotFound
from controlplane.operations.models import ACTIVE_STATES, Operation


def operation_get(*, operation_id: str) -> Operation:
    try:
        key = uuid.UUID(str(operation_id))
        return Operation.objects.select_related("application", "job", "requested_by").get(pk=key)
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
