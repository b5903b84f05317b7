"""Operations: the list (filtered by job, kind, state and who asked), and one operation — its
phases with durations and progress (live while it runs), result or error, audit trail."""

from __future__ import annotations

from datetime import datetime

from django.http import HttpRequest, HttpResponse
from django.utils.dateparse import parse_datetime

from controlplane.api.conditional import matches
from controlplane.audit.selectors import audit_list
from controlplane.changes.keys import operation_key
from controlplane.jobs.selectors import job_list
from controlplane.operations.models import OperationKind, OperationState
from controlplane.operations.selectors import operation_get, operation_list
from web.access import viewer_required
from web.live import live_etag, not_modified, still_unchanged, watch_headers
from web.views.base import domain_errors, is_htmx, page


@viewer_required
@domain_errors
def operation_detail(request: HttpRequest, operation_id: str) -> HttpResponse:
    operation = operation_get(operation_id=operation_id)
    etag = live_etag("operation", operation.pk.hex, operation.revision)  # type: ignore[attr-defined]
    if is_htmx(request) and matches(request, etag):  # type: ignore[arg-type]
        if still_unchanged(request, operation_key(operation.pk), operation.revision):  # type: ignore[attr-defined]
            return not_modified(etag)
        operation = operation_get(operation_id=operation_id)
        etag = live_etag("operation", operation.pk.hex, operation.revision)  # type: ignore[attr-defined]
    context = {
        "operation": operation,
        "watch_headers": watch_headers(etag),
        "trail": list(audit_list(operation=str(operation.pk), oldest_first=True)[:200]),
    }
    template = "web/partials/operation_live.html" if is_htmx(request) else "web/operation.html"
    response = page(request, template, context)
    response["ETag"] = etag
    return response


PAGE = 50


@viewer_required
def operations(request: HttpRequest) -> HttpResponse:
    get = request.GET
    filters = {k: get.get(k, "").strip() for k in ("job", "kind", "state", "requester")}
    problems = []
    if filters["kind"] and filters["kind"] not in OperationKind.values:
        problems.append(f"kind {filters['kind']!r} is not one of {list(OperationKind.values)}")
        filters["kind"] = ""
    if filters["state"] and filters["state"] not in OperationState.values:
        problems.append(f"state {filters['state']!r} is not one of {list(OperationState.values)}")
        filters["state"] = ""
    ops = operation_list(
        job=filters["job"] or None,
        kind=filters["kind"] or None,
        state=filters["state"] or None,
        requester=filters["requester"] or None,
        before=_moment(get.get("before", "")),
    )
    rows = list(ops[: PAGE + 1])
    more = len(rows) > PAGE
    rows = rows[:PAGE]
    query = get.copy()
    query.pop("before", None)
    context = {
        "operations": rows,
        "filters": filters,
        "jobs": [job.name for job in job_list()],
        "kinds": OperationKind.values,
        "states": OperationState.values,
        "problems": problems,
        "query": query.urlencode(),
        "next_before": rows[-1].created_at.isoformat() if more and rows else None,
    }
    return page(request, "web/operations.html", context)


def _moment(raw: str) -> datetime | None:
    """The `before` cursor (an ISO time this page gave), None when absent or not one."""
    try:
        return parse_datetime(raw) if raw else None
    except ValueError:
        return None
