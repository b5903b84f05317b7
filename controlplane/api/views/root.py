"""The API's front door (links to every collection) and the answer for unknown paths."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api.base import ApiView
from controlplane.api.serializers import absolute
from controlplane.errors import NotFound


class ApiRootView(ApiView):
    @extend_schema(
        tags=["meta"],
        responses={
            200: inline_serializer(
                "ApiRoot",
                {
                    name: serializers.URLField()
                    for name in (
                        "applications",
                        "entry_points",
                        "jobs",
                        "stores",
                        "sinks",
                        "operations",
                        "audit",
                        "users",
                        "schema",
                        "docs",
                    )
                },
            )
        },
    )
    def get(self, request: Request) -> Response:
        names = {
            "applications": "application-list",
            "entry_points": "entry-point-list",
            "jobs": "job-list",
            "stores": "store-list",
            "sinks": "sink-list",
            "operations": "operation-list",
            "audit": "audit-list",
            "users": "user-list",
            "schema": "schema",
            "docs": "docs",
        }
        return Response({key: absolute(request, name) for key, name in names.items()})


class UnknownPathView(ApiView):
    """Any path under /api/ that names no endpoint: 401 for anonymous, else a structured 404."""

    read_role = write_role = "viewer"
    schema = None  # not part of the API

    def _unknown(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        raise NotFound(f"no API endpoint at {request.path}; see /api/docs/", code="no_endpoint")

    get = post = put = patch = delete = _unknown
