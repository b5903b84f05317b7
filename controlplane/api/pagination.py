"""One page shape everywhere: ``{"next": url|null, "previous": url|null, "results": [...]}``.

Pages are cursor-based: follow `next` (or pass its `cursor` back); `limit` (1..1000, default
50) sets the page size. Querysets use DRF's keyset `CursorPagination` (stable under inserts);
the lineage endpoints hand out their selectors' own cursors; short in-memory lists (branches,
tags) use a position cursor. A cursor that was not issued by us is a 422 `invalid_cursor` (a
string the schema allows, that the server cannot use).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from drf_spectacular.utils import OpenApiParameter, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.utils.urls import replace_query_param

from controlplane.errors import InvalidRequest, Unprocessable

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000

PAGE_PARAMETERS = [
    OpenApiParameter(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},  # type: ignore[arg-type]
        description=f"Page size, 1..{MAX_LIMIT} (default {DEFAULT_LIMIT}); 0 or more than "
        f"{MAX_LIMIT} is a 400 `invalid` naming `limit`.",
    ),
    OpenApiParameter("cursor", str, description="Where the page starts: from a `next` link."),
]


def page_limit(request: Request, default: int = DEFAULT_LIMIT) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    value = int(raw) if raw.isascii() and raw.isdigit() else 0
    if not 1 <= value <= MAX_LIMIT:
        raise InvalidRequest(
            f"limit must be an integer from 1 to {MAX_LIMIT}, not {raw!r}",
            fields={"limit": [f"an integer from 1 to {MAX_LIMIT}"]},
        )
    return value


def page_response_data(
    request: Request, results: list[Any], next_cursor: str | None
) -> dict[str, Any]:
    url = request.build_absolute_uri()
    return {
        "next": None if next_cursor is None else replace_query_param(url, "cursor", next_cursor),
        "previous": None,
        "results": results,
    }


class KeysetPagination(CursorPagination):
    """DRF's cursor pagination with our parameter names and 400s for bad input."""

    page_size = DEFAULT_LIMIT
    page_size_query_param = "limit"
    max_page_size = MAX_LIMIT
    cursor_query_param = "cursor"

    def __init__(self, ordering: str | tuple[str, ...]) -> None:
        self.ordering = ordering

    def get_page_size(self, request: Request) -> int:
        return page_limit(request, self.page_size)

    def decode_cursor(self, request: Request) -> Cursor | None:
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise Unprocessable(
                "cursor is not one this API handed out; start again without a cursor",
                code="invalid_cursor",
                fields={"cursor": ["not a cursor we issued"]},
            ) from None

    def page(self, queryset: Any, request: Request) -> list[Any]:
        return list(self.paginate_queryset(queryset, request) or [])

    def response_data(self, results: list[Any]) -> dict[str, Any]:
        return {
            "next": self.get_next_link(),
            "previous": self.get_previous_link(),
            "results": results,
        }


def sequence_page(request: Request, items: Sequence[Any]) -> tuple[list[Any], str | None]:
    """A page of an in-memory list and the cursor of the next one (None at the end)."""
    limit = page_limit(request)
    raw = request.query_params.get("cursor")
    start = 0
    if raw:
        try:
            decoded = base64.urlsafe_b64decode(raw.encode("ascii")).decode("ascii")
            if not decoded.startswith("o:"):
                raise ValueError(decoded)
            start = int(decoded[2:])
            if start < 0:
                raise ValueError(decoded)
        except (ValueError, UnicodeError):
            raise Unprocessable(
                "cursor is not one this API handed out; start again without a cursor",
                code="invalid_cursor",
                fields={"cursor": ["not a cursor we issued"]},
            ) from None
    end = start + limit
    more = end < len(items)
    cursor = base64.urlsafe_b64encode(f"o:{end}".encode("ascii")).decode("ascii") if more else None
    return list(items[start:end]), cursor


def page_of(serializer: type[serializers.Serializer] | serializers.Serializer, name: str) -> Any:
    """The schema component of a page of `serializer` items."""
    child = serializer() if isinstance(serializer, type) else serializer
    return inline_serializer(
        name=name,
        fields={
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": serializers.ListSerializer(child=child),
        },
    )
