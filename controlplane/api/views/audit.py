"""The audit log: who asked for what, when, and how it ended."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils.dateparse import parse_date, parse_datetime
from django.utils.timezone import is_naive, make_aware
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api.base import ApiView
from controlplane.api.pagination import PAGE_PARAMETERS, KeysetPagination, page_of
from controlplane.api.serializers import AuditEntrySerializer
from controlplane.audit.models import AuditKind
from controlplane.audit.selectors import audit_list
from controlplane.errors import InvalidRequest


def _moment(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if raw is None:  # absent; an empty value is not a date (400, as the schema says)
        return None
    try:
        value = parse_datetime(raw)
        if value is None:
            day = parse_date(raw)
            value = None if day is None else datetime(day.year, day.month, day.day)
        if value is not None:
            # In UTC: the database refuses odd offsets (e.g. +20:42) that ISO 8601 allows.
            value = (make_aware(value) if is_naive(value) else value).astimezone(UTC)
    except (ValueError, OverflowError):
        value = None
    if value is None:
        raise InvalidRequest(
            f"{name} must be an ISO 8601 date or date-time, not {raw!r}",
            fields={name: ["ISO 8601 date or date-time"]},
        )
    return value


class AuditListView(ApiView):
    @extend_schema(
        tags=["audit"],
        parameters=[
            OpenApiParameter("actor", str, description="Username ('anonymous' for refused)."),
            OpenApiParameter(
                "action", str, description="Prefix, e.g. `POST /api/jobs` or `operation.`."
            ),
            OpenApiParameter("kind", str, enum=list(AuditKind.values)),
            OpenApiParameter("operation", OpenApiTypes.UUID, description="An operation id."),
            OpenApiParameter("since", OpenApiTypes.DATETIME, description="ISO 8601, inclusive."),
            OpenApiParameter("until", OpenApiTypes.DATETIME, description="ISO 8601, exclusive."),
            *PAGE_PARAMETERS,
        ],
        responses={200: page_of(AuditEntrySerializer, "AuditPage")},
    )
    def get(self, request: Request) -> Response:
        kind = request.query_params.get("kind")
        if kind is not None and kind not in AuditKind.values:
            raise InvalidRequest(
                f"kind must be one of {list(AuditKind.values)}",
                fields={"kind": [f"one of {list(AuditKind.values)}"]},
            )
        entries = audit_list(
            actor=request.query_params.get("actor") or None,
            action=request.query_params.get("action") or None,
            kind=kind,
            operation=request.query_params.get("operation"),  # empty: not an id (400)
            since=_moment(request, "since"),
            until=_moment(request, "until"),
        )
        pages = KeysetPagination(ordering=("-at", "-id"))
        items = pages.page(entries, request)
        return Response(pages.response_data(AuditEntrySerializer(items, many=True).data))
