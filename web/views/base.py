"""What every page shares: the signed-in user's role, domain errors rendered in words."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from controlplane import availability
from controlplane.accounts.roles import user_role
from controlplane.applications.errors import UnknownApplicationError, UnknownVersionError
from controlplane.applications.selectors import application_names
from controlplane.errors import EpochalError, NotFound
from controlplane.lineage.errors import LineageError, UnknownRevisionError
from web.access import can_operate

NOT_FOUND = (NotFound, UnknownRevisionError, UnknownApplicationError, UnknownVersionError)


def is_htmx(request: HttpRequest) -> bool:
    return bool(getattr(request, "htmx", False))


def page(
    request: HttpRequest, template: str, context: dict[str, Any], *, status: int = 200
) -> HttpResponse:
    """Render `template` with what the layout needs (role, navigation)."""
    context = {
        "can_operate": can_operate(request),
        "role": user_role(request.user),
        "nav_applications": application_names(),
        **context,
    }
    return render(request, template, context, status=status)


def error_page(request: HttpRequest, message: str, *, status: int, title: str = "") -> HttpResponse:
    title = title or {404: "Not found", 400: "Cannot do that", 409: "Conflict"}.get(status, "Error")
    template = "web/partials/error.html" if is_htmx(request) else "web/error.html"
    return page(request, template, {"title": title, "message": message}, status=status)


def domain_errors(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Unknown jobs, applications, versions, snapshots and refused requests, in words."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except NOT_FOUND as exc:
            message = exc.message if isinstance(exc, EpochalError) else str(exc)
            return error_page(request, message, status=404)
        except EpochalError as exc:
            return error_page(request, exc.message, status=exc.http_status)
        except LineageError as exc:
            return error_page(request, str(exc), status=400)

    return wrapped


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Every 404 the views do not answer themselves (`handler404`): our page for people,
    the API's error shape for programs — never Django's debug page listing the routes."""
    if request.path.startswith("/api/"):
        from controlplane.api.errors import error_body

        body = error_body(
            "not_found", f"no API endpoint at {request.path}; the endpoints are listed at /api/"
        )
        return JsonResponse(body, status=404)
    message = (
        f"There is no page at {request.path}. The jobs, operations and audit log are linked "
        "at the top of every page."
    )
    return error_page(request, message, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    """A 500 (`handler500`): a plain page that needs neither the database nor templates'
    context, since either may be what failed. The traceback goes to the server's log. A
    dependency that is away (database, store) is a 503 with Retry-After instead."""
    from django.http import HttpResponseServerError

    dependency = availability.unavailable(sys.exc_info()[1])
    if dependency is not None:
        return unavailable_response(request, dependency)

    if request.path.startswith("/api/"):
        body = {"error": {"code": "server_error", "message": "internal error; see the server log",
                          "fields": {}, "detail": {}}}  # fmt: skip
        return JsonResponse(body, status=500)
    return HttpResponseServerError(
        "<!doctype html><title>Server error · Epochal</title><h1>Server error</h1>"
        "<p>Something failed on the server; its log has the details.</p>"
        '<p><a href="/">Back to the jobs</a></p>'
    )


def unavailable_response(request: HttpRequest, dependency: str) -> HttpResponse:
    """503 with Retry-After: JSON for the API, the probes and /metrics; a plain page elsewhere."""
    text = availability.message(dependency)
    retry = str(availability.RETRY_AFTER_S)
    if request.path.startswith(("/api/", "/healthz", "/metrics")):
        body = {"error": {"code": f"{dependency}_unavailable", "message": text, "fields": {},
                          "detail": {"retry_after_s": availability.RETRY_AFTER_S}}}  # fmt: skip
        response: HttpResponse = JsonResponse(body, status=503)
    else:
        response = HttpResponse(
            f"<!doctype html><title>Unavailable · Epochal</title><h1>Unavailable</h1><p>{text}</p>",
            status=503,
        )
    response["Retry-After"] = retry
    return response


def healthz(request: HttpRequest) -> HttpResponse:
    """Readiness under its historical name (``/healthz/ready``)."""
    return healthz_ready(request)


def healthz_live(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers requests. Touches no dependency — a database outage must
    not get every web process restarted."""
    return JsonResponse({"status": "ok"})


def healthz_ready(request: HttpRequest) -> HttpResponse:
    """Readiness: the database answers too; 503 with Retry-After when it does not."""
    problem = availability.database_ready()
    if problem is not None:
        response = unavailable_response(request, "database")
        return response
    return JsonResponse({"status": "ok", "database": connection.vendor})
