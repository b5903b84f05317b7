"""Refusals before any view runs, for every path (API, dashboard, admin):

* a body over `DATA_UPLOAD_MAX_MEMORY_SIZE` (``EPOCHAL_MAX_BODY_BYTES``) gets 413 naming
  ``body`` — without reading more of it into memory than a bounded drain;
* a NUL character in the path or a query parameter gets 400 naming it (no database can
  store one, and PostgreSQL refuses to compare with one).

API paths get the API's error shape, other paths the same JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from controlplane.api.errors import error_body

_DRAIN_LIMIT = 64 * 1024 * 1024
_CHUNK = 64 * 1024


def _drain(request: HttpRequest, length: int) -> None:
    """Read and drop the refused body so the client gets to read our answer (a server that
    closes a connection with unread data makes the client see a reset instead)."""
    stream = request.META.get("wsgi.input")
    left = min(length, _DRAIN_LIMIT)
    while stream is not None and left > 0:
        chunk = stream.read(min(_CHUNK, left))
        if not chunk:
            break
        left -= len(chunk)


class BodyLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        refused = self.refusal(request)
        if refused is not None:
            return refused
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
            _drain(request, length)
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
        return None
