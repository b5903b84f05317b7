"""Declarative jobs over REST: today's jobs as a job file, what a file would change, apply it.

The body of a diff or apply is the job file as JSON (docs/control-plane.md); it is checked
whole before anything is read or requested (400 naming ``jobs[i].field``; 422 when it names
what is not registered). Applying requests the ordinary operations, as an operator.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.roles import OPERATOR, VIEWER
from controlplane.api.base import ApiView
from controlplane.api.schema import ApiAutoSchema, error
from controlplane.errors import InvalidRequest
from controlplane.jobfiles import document
from controlplane.jobfiles.plan import apply, export, plan

TAGS = ["job files"]
_FILE_BODY = {"application/json": document.openapi_schema()}
_REFUSALS = {
    400: error("The file is not a job file: the fields it names (jobs[i].field) are wrong."),
    422: error(
        "The file names what is not registered (an application, version, store or job), or "
        "asks an existing job to change what only a fork changes (application, branch, "
        "resources)."
    ),
}


class _FileBodySchema(ApiAutoSchema):
    """The job file is the body: the schema says it is required (a request without one is
    a 400 naming apiVersion, kind and jobs)."""

    def _get_request_body(self, direction: str = "request") -> Any:
        body = super()._get_request_body(direction)
        if body is not None:
            body["required"] = True
        return body


def _entries(request: Request) -> list[document.JobEntry]:
    unknown = sorted(request.query_params)
    if unknown:
        raise InvalidRequest(
            f"unknown query parameter(s) {unknown}", fields={k: ["unknown"] for k in unknown}
        )
    return document.parse(request.data)


class JobFileView(ApiView):
    @extend_schema(
        tags=TAGS,
        summary="Today's jobs as a job file (what `epochal export` prints, as JSON)",
        parameters=[OpenApiParameter("application", str, description="Only its jobs.")],
        responses={200: OpenApiResponse(description="the job file")},
    )
    def get(self, request: Request) -> Response:
        unknown = sorted(set(request.query_params) - {"application"})
        if unknown:
            raise InvalidRequest(
                f"unknown query parameter(s) {unknown}; allowed: ['application']",
                fields={k: ["unknown"] for k in unknown},
            )
        entries = export(application=request.query_params.get("application") or None)
        return Response(
            {
                "apiVersion": document.API_VERSION,
                "kind": document.KIND,
                "jobs": [entry.to_dict() for entry in entries],
            }
        )


class JobFileDiffView(ApiView):
    write_role = VIEWER  # a diff changes nothing
    schema = _FileBodySchema()

    @extend_schema(
        tags=TAGS,
        summary="What applying the job file would change, as the requests it would make",
        request=_FILE_BODY,
        responses={200: OpenApiResponse(description="the changes"), **_REFUSALS},
    )
    def post(self, request: Request) -> Response:
        return Response({"changes": [c.to_dict() for c in plan(_entries(request))]})


class JobFileApplyView(ApiView):
    write_role = OPERATOR
    schema = _FileBodySchema()

    @extend_schema(
        tags=TAGS,
        summary="Make the jobs as the job file says, by the ordinary requests (operations)",
        request=_FILE_BODY,
        responses={200: OpenApiResponse(description="what was requested"), **_REFUSALS},
    )
    def post(self, request: Request) -> Response:
        outcomes = apply(_entries(request), user=request.user, via="api")
        self.audit_detail(job_file=[o.to_dict() for o in outcomes])
        body: dict[str, Any] = {"outcomes": [o.to_dict() for o in outcomes]}
        return Response(body)
