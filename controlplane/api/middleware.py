"""Refusals before any view runs, for every path (API, dashboard, admin), and the audit of
every refusal no view recorded.

`BodyLimitMiddleware`:

* a body over `DATA_UPLOAD_MAX_MEMORY_SIZE` (``EPOCHAL_MAX_BODY_BYTES``) gets 413 naming
  ``body`` without a byte of it being read: the answer goes out and the web server closes
  the connection (reading an unbounded body from a slow client would hold a server thread for
  as long as the client likes, before anyone is authenticated);
* a NUL character in the path or a query parameter gets 400 naming it (no database can
  store one, and PostgreSQL refuses to compare with one);
* every other body is read here, in a bounded number of threads and within a deadline
  (`controlplane.api.request_bodies`).

`RefusalAuditMiddleware` writes the audit row of a refusal (400, 403, 404, 405, 408, 409, 413,
422) of a signed-in user that nothing else audited: those of `BodyLimitMiddleware`, the
dashboard's 403s and form 400s. The API's views audit their own (`controlplane.api.base`).
A refusal of nobody signed in is counted, not written (`controlplane.audit.rejections`).

API paths get the API's error shape, other paths the same JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from controlplane.accounts.tokens import token_authenticate
from controlplane.api.base import route_name
from controlplane.api.errors import error_body
from controlplane.api.request_bodies import read_body
from controlplane.audit.rejections import UNAUTHENTICATED, count_rejection
from controlplane.audit.services import audit_request


def _before_view(response: JsonResponse) -> JsonResponse:
    """Mark a refusal answered before any view (for `RefusalAuditMiddleware`)."""
    response.epochal_before_view = True  # type: ignore[attr-defined]
    return response


class BodyLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        refused = self.refusal(request)
        if refused is not None:
            return _before_view(refused)
        return self.get_response(request)

    def refusal(self, request: HttpRequest) -> JsonResponse | None:
        raw_length = request.META.get("CONTENT_LENGTH") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            return JsonResponse(
                error_body(
                    "malformed_request",
                    f"Content-Length {raw_length!r} is not a number",
                    fields={"Content-Length": ["not a number"]},
                ),
                status=400,
            )
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and length > limit:
            # Not read: the web server closes the connection after this answer.
            return JsonResponse(
                error_body(
                    "body_too_large",
                    f"the body is {length} bytes; this server accepts at most {limit}",
                    fields={"body": [f"at most {limit} bytes"]},
                    detail={"limit_bytes": limit, "length_bytes": length},
                ),
                status=413,
            )
        if "\x00" in request.path:
            return JsonResponse(
                error_body(
                    "malformed_request",
                    "the path contains a NUL character (%00)",
                    fields={"path": ["contains a NUL character"]},
                ),
                status=400,
            )
        for name, values in request.GET.lists():
            if "\x00" in name or any("\x00" in value for value in values):
                shown = name.replace("\x00", "?")
                return JsonResponse(
                    error_body(
                        "malformed_request",
                        f"query parameter {shown!r} contains a NUL character (%00)",
                        fields={shown: ["contains a NUL character"]},
                    ),
                    status=400,
                )
        return read_body(request, length)


REFUSALS: Final = frozenset({400, 403, 404, 405, 408, 409, 413, 422})
"""Statuses audited as refusals (401s are counted; 429s and 503s are the server protecting
itself from a flood, and a row each would be the flood)."""


def requester(request: HttpRequest) -> Any:
    """Who sent `request`: the signed-in user of its session, else the user of a usable
    `Authorization: Token` it presents, else None."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return user
    scheme, _, secret = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme == "Token" and secret.strip():
        found, _token = token_authenticate(secret.strip())
        return found
    return None


def _refusal_detail(request: HttpRequest, response: HttpResponse) -> dict[str, Any]:
    detail: dict[str, Any] = dict(getattr(request, "_epochal_audit_detail", {}))
    if response.get("Content-Type", "").startswith("application/json"):
        try:
            error = json.loads(response.content).get("error")
        except (ValueError, AttributeError):
            error = None
        if isinstance(error, dict):
            detail["code"] = error.get("code")
            detail["message"] = str(error.get("message"))[:500]
            if error.get("fields"):
                detail["fields"] = sorted(error["fields"])[:20]
    return detail


class RefusalAuditMiddleware:
    """The audit row of every refusal of a signed-in user that no view wrote (see above)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        response = self.get_response(request)
        if response.status_code not in REFUSALS or getattr(request, "_epochal_audited", False):
            return response
        before_view = getattr(response, "epochal_before_view", False)
        if request.path.startswith("/api/") and not before_view:
            return response  # the API's views audit what reaches them (controlplane.api.base)
        user = requester(request)
        if user is None:
            count_rejection(UNAUTHENTICATED, request)
            return response
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None and match.route else request.path
        audit_request(
            user=user,
            action=f"{request.method} /{route_name(route).lstrip('/')}",
            target=request.path.replace("\x00", "%00"),
            status_code=response.status_code,
            source="api" if request.path.startswith("/api/") else "web",
            detail=_refusal_detail(request, response),
        )
        return response
