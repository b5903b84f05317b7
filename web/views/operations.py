"""One operation: its phases and progress (live while it runs), result or error, audit trail."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from controlplane.audit.selectors import audit_list
from controlplane.operations.selectors import operation_get
from web.access import viewer_required
from web.views.base import domain_errors, is_htmx, page


@viewer_required
@domain_errors
def operation_detail(request: HttpRequest, operation_id: str) -> HttpResponse:
    operation = operation_get(operation_id=operation_id)
    context = {
        "operation": operation,
        "trail": list(audit_list(operation=str(operation.pk)).order_by("at", "id")[:200]),
    }
    template = "web/partials/operation_live.html" if is_htmx(request) else "web/operation.html"
    return page(request, template, context)
