"""Reads of the audit log (added for the REST API)."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import QuerySet

from controlplane.audit.models import AuditEntry
from controlplane.errors import InvalidRequest


def audit_list(
    *,
    actor: str | None = None,
    action: str | None = None,
    kind: str | None = None,
    operation: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before_id: int | None = None,
    oldest_first: bool = False,
) -> QuerySet[AuditEntry]:
    """Audit entries, newest first. `action` matches a prefix (``POST /api/jobs``, ``operation.``);
    `since` is inclusive, `until` exclusive; `before_id` pages back (entries older than that
    one). With `oldest_first`, the other way round."""
    order = ("at", "id") if oldest_first else ("-at", "-id")
    entries = AuditEntry.objects.select_related("operation").order_by(*order)
    if before_id is not None:
        entries = entries.filter(id__lt=before_id)
    if actor:
        entries = entries.filter(actor_name=actor)
    if action:
        entries = entries.filter(action__startswith=action)
    if kind:
        entries = entries.filter(kind=kind)
    if operation is not None:
        try:
            entries = entries.filter(operation_id=uuid.UUID(operation))
        except ValueError:
            raise InvalidRequest(
                f"operation {operation!r} is not an operation id",
                fields={"operation": ["must be a UUID"]},
            ) from None
    if since is not None:
        entries = entries.filter(at__gte=since)
    if until is not None:
        entries = entries.filter(at__lt=until)
    return entries
