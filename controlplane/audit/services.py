"""Writes to the audit log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from controlplane.audit.models import AuditEntry, AuditKind

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

    from controlplane.operations.models import Operation


def _actor(user: AbstractBaseUser | AnonymousUser | None) -> tuple[Any, str]:
    if user is None or not getattr(user, "is_authenticated", False):
        return None, "" if user is None else "anonymous"
    return user, user.get_username()


def audit_request(
    *,
    user: AbstractBaseUser | AnonymousUser | None,
    action: str,
    target: str = "",
    status_code: int | None = None,
    outcome: str = "",
    source: str = "api",
    operation: Operation | None = None,
    detail: Mapping[str, Any] | None = None,
) -> AuditEntry:
    """Record one request (REST call, dashboard action, CLI command); its `outcome` is the
    status's word (`outcome_of`) unless given."""
    actor, name = _actor(user)
    if not outcome and status_code is not None:
        outcome = outcome_of(status_code)
    return AuditEntry.objects.create(
        kind=AuditKind.REQUEST,
        actor=actor,
        actor_name=name,
        action=action[:200],
        target=target[:300],
        status_code=status_code,
        outcome=outcome,
        source=source,
        operation=operation,
        detail=dict(detail or {}),
    )


def audit_execution(
    *,
    operation: Operation,
    action: str,
    outcome: str,
    detail: Mapping[str, Any] | None = None,
    source: str = "worker",
) -> AuditEntry:
    """Record one step of an operation's execution (started, a phase, the result); `source`:
    where it happened (the request itself: the way it came, `cli`, `web`, `api` …)."""
    user = operation.requested_by
    return AuditEntry.objects.create(
        kind=AuditKind.EXECUTION,
        actor=user,
        actor_name="" if user is None else user.get_username(),
        action=action[:200],
        target=f"operation {operation.pk}",
        outcome=outcome,
        source=source,
        operation=operation,
        detail=dict(detail or {}),
    )


def outcome_of(status_code: int) -> str:
    """The audit's word for the HTTP status a request (REST or dashboard) was answered with:
    the one map from statuses to outcomes."""
    if status_code == 202:
        return "accepted"
    if status_code < 400:
        return "ok"
    return {
        401: "unauthenticated",
        403: "forbidden",
        404: "not-found",
        409: "conflict",
        429: "throttled",
    }.get(status_code, "error" if status_code >= 500 else "rejected")
