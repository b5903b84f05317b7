"""Reads for operations."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import FilteredRelation, OuterRef, Q, QuerySet, Subquery

from controlplane.changes.keys import operation_key
from controlplane.changes.models import Change
from controlplane.changes.selectors import revision_subquery
from controlplane.errors import NotFound
from controlplane.jobs.models import Job, Run
from controlplane.jobs.selectors import job_not_found
from controlplane.lineage.models import Branch, Snapshot
from controlplane.lineage.selectors import SnapshotSummary, summary_columns, summary_of_row
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
    """Job `name` in one query with its application, version, newest run (`latest_run`,
    None before the first) and active operation (`active_operation`)."""
    newest_run = Run.objects.filter(job=OuterRef("pk")).order_by("-created_at", "-id")
    found = (
        Job.objects.select_related("application", "version")
        .annotate(
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


@dataclass(frozen=True)
class JobMark:
    """What a conditional read of a job needs first: its id, its revision and its branch's
    head (None before the first commit)."""

    job_id: int
    revision: int
    head: SnapshotSummary | None


def job_mark(*, name: str) -> JobMark:
    """Job `name`'s id, revision and head in one plain statement: a conditional read that
    finds the job unchanged (304) asks nothing else, and one that does not has the head."""
    sql = (
        f"SELECT j.id, (SELECT MAX(c.id) FROM {Change._meta.db_table} c "
        f"WHERE c.key = %s || j.id), {summary_columns('s')} "
        f"FROM {Job._meta.db_table} j "
        f"LEFT JOIN {Branch._meta.db_table} b "
        "ON b.application_id = j.application_id AND b.name = j.branch "
        f"LEFT JOIN {Snapshot._meta.db_table} s ON s.id = b.head_id "
        "WHERE j.name = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, ["job:", name])
        row = cursor.fetchone()
    if row is None:
        raise job_not_found(name)
    return JobMark(int(row[0]), int(row[1] or 0), summary_of_row(row[2:]))
