"""One operation: its phases and progress (live while it runs), result or error, audit trail."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from controlplane.api.conditional import matches
from controlplane.audit.selectors import audit_list
from controlplane.changes.keys import operation_key
from controlplane.operations.selectors import operation_get
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
        "trail": list(audit_list(operation=str(operation.pk)).order_by("at", "id")[:200]),
    }
    template = "web/partials/operation_live.html" if is_htmx(request) else "web/operation.html"
    response = page(request, template, context)
    response["ETag"] = etag
    return response
