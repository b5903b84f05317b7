"""Operations: request (on a job, or a fork on an application), get, list, cancel.

A request that creates an operation answers 202 with `Location` and the operation (its `url`
included). A repeated `Idempotency-Key` (per user) answers 200 with the operation the first
request created and `Idempotent-Replayed: true`. A second mutating operation on a job whose
operation is still pending or running answers 409 naming the running one.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.roles import OPERATOR
from controlplane.api.base import ApiView
from controlplane.api.conditional import conditional_read, etag_for
from controlplane.api.pagination import PAGE_PARAMETERS, KeysetPagination, page_of
from controlplane.api.schema import error
from controlplane.api.serializers import OperationRequestSerializer, OperationSerializer
from controlplane.applications.models import Application
from controlplane.applications.selectors import application_get
from controlplane.changes.keys import operation_key
from controlplane.errors import InvalidRequest
from controlplane.jobs.models import Job
from controlplane.jobs.selectors import job_get
from controlplane.operations import selectors, services
from controlplane.operations.models import IDEMPOTENCY_KEY_MAX, OperationKind, OperationState

TAGS = ["operations"]

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    location=OpenApiParameter.HEADER,
    description=f"Up to {IDEMPOTENCY_KEY_MAX} characters. Repeating the same request (same user, "
    "method, path "
    "and body) with it returns the first one's operation (200, `Idempotent-Replayed: true`); "
    "a different request with the same key gets 422 `idempotency_key_reused`.",
)
REQUEST_RESPONSES = {
    202: OpenApiResponse(OperationSerializer, description="Accepted: the operation was created."),
    200: OpenApiResponse(
        OperationSerializer, description="The operation an earlier request with this key made."
    ),
    409: error("Another operation of this job is pending or running (named in `detail`)."),
    422: error("The Idempotency-Key was used before for a different request."),
}


def _request(
    view: ApiView, request: Request, application: Application, job: Job | None
) -> Response:
    body = OperationRequestSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    key = request.headers.get("Idempotency-Key", "").strip()
    fingerprint = services.request_fingerprint(
        user=request.user, method=request.method or "", path=request.path, body=request.data
    )
    requested = services.operation_request(
        kind=body.validated_data["kind"],
        application=application,
        job=job,
        params=body.validated_data["params"],
        reason=body.validated_data["reason"],
        user=request.user,
        idempotency_key=key,
        fingerprint=fingerprint,
        via="api",
    )
    view.remember_operation(requested.operation)
    data = OperationSerializer(requested.operation, context={"request": request}).data
    headers = {"Location": data["url"]}
    if not requested.created:
        headers["Idempotent-Replayed"] = "true"
    return Response(data, status=202 if requested.created else 200, headers=headers)


class JobOperationRequestView(ApiView):
    write_role = OPERATOR

    @extend_schema(
        tags=TAGS,
        summary="Request an operation on a job (start, stop, savepoint, rescale, rollback, "
        "migrate; fork from the job's branch)",
        request=OperationRequestSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses=REQUEST_RESPONSES,
    )
    def post(self, request: Request, name: str) -> Response:
        job = job_get(name=name)
        return _request(self, request, job.application, job)


class ApplicationOperationRequestView(ApiView):
    write_role = OPERATOR

    @extend_schema(
        tags=TAGS,
        summary="Request an operation on an application (fork from any snapshot)",
        request=OperationRequestSerializer,
        parameters=[IDEMPOTENCY_KEY],
        responses=REQUEST_RESPONSES,
    )
    def post(self, request: Request, name: str) -> Response:
        return _request(self, request, application_get(name=name), None)


def _choice(request: Request, name: str, allowed: list[str]) -> str | None:
    value = request.query_params.get(name)  # present but empty is not a choice
    if value is not None and value not in allowed:
        raise InvalidRequest(
            f"{name} must be one of {allowed}", fields={name: [f"one of {allowed}"]}
        )
    return value


class OperationListView(ApiView):
    @extend_schema(
        tags=TAGS,
        parameters=[
            OpenApiParameter("job", str, description="Only this job's operations."),
            OpenApiParameter("application", str, description="Only this application's."),
            OpenApiParameter("kind", str, enum=list(OperationKind.values)),
            OpenApiParameter("state", str, enum=list(OperationState.values)),
            *PAGE_PARAMETERS,
        ],
        responses={200: page_of(OperationSerializer, "OperationPage")},
    )
    def get(self, request: Request) -> Response:
        operations = selectors.operation_list(
            job=request.query_params.get("job") or None,
            application=request.query_params.get("application") or None,
            kind=_choice(request, "kind", list(OperationKind.values)),
            state=_choice(request, "state", list(OperationState.values)),
        )
        pages = KeysetPagination(ordering=("-created_at", "-id"))
        items = pages.page(operations, request)
        data = OperationSerializer(items, many=True, context={"request": request}).data
        return Response(pages.response_data(data))


class OperationDetailView(ApiView):
    @extend_schema(tags=TAGS, responses={200: OperationSerializer})
    def get(self, request: Request, operation_id: str) -> Response:
        def look() -> tuple[None, str]:
            key, revision = selectors.operation_revision(operation_id=operation_id)
            return None, etag_for(request, "operation", key.hex, revision)

        def build(_: None) -> Response:
            # read after the revision: the ETag is never newer than the body
            operation = selectors.operation_get(operation_id=operation_id)
            return Response(OperationSerializer(operation, context={"request": request}).data)

        key, revision = selectors.operation_revision(operation_id=operation_id)
        return conditional_read(
            request,
            key=operation_key(key),
            seen=revision,
            first=(None, etag_for(request, "operation", key.hex, revision)),
            look=look,
            build=build,
        )


class OperationCancelView(ApiView):
    write_role = OPERATOR

    @extend_schema(
        tags=TAGS,
        summary="Cancel a pending operation now, or a running one at its next cancellable point",
        request=None,
        responses={
            200: OperationSerializer,
            409: error("The operation has ended or is past its last cancellable phase."),
        },
    )
    def post(self, request: Request, operation_id: str) -> Response:
        operation = selectors.operation_get(operation_id=operation_id)
        self.remember_operation(operation)
        operation = services.operation_cancel(operation=operation, user=request.user)
        return Response(OperationSerializer(operation, context={"request": request}).data)
