"""What every page shares: the signed-in user's role, domain errors rendered in words."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from controlplane.accounts.roles import user_role
from controlplane.applications.errors import UnknownApplicationError, UnknownVersionError
from controlplane.applications.models import Application
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
        "nav_applications": list(
            Application.objects.order_by("name").values_list("name", flat=True)
        ),
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


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok", "database": connection.vendor})
