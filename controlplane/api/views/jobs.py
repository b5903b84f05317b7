"""Jobs: list, create, one (with its current run, active operation and head), runs, logs."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.roles import OPERATOR
from controlplane.api.base import ApiView
from controlplane.api.conditional import (
    etag_for,
    matches,
    not_modified_after_watch,
    tag,
    watching,
)
from controlplane.api.pagination import PAGE_PARAMETERS, KeysetPagination, page_of
from controlplane.api.response_cache import cached, remember
from controlplane.api.schema import error
from controlplane.api.serializers import (
    JobCreateSerializer,
    JobDetailSerializer,
    JobSerializer,
    LogsSerializer,
    RunSerializer,
    job_detail_representation,
)
from controlplane.applications.selectors import application_get, version_get, version_latest
from controlplane.changes.feed import wait_for_change
from controlplane.changes.keys import job_key
from controlplane.errors import Conflict, InvalidRequest
from controlplane.jobs import selectors, services
from controlplane.jobs.models import JobState
from controlplane.jobs.selectors import runs_watched_at
from controlplane.operations.selectors import JobMark, job_mark, job_overview

TAGS = ["jobs"]
MAX_LOG_LINES = 5000


class JobListView(ApiView):
    write_role = OPERATOR

    @extend_schema(
        tags=TAGS,
        parameters=[
            OpenApiParameter("application", str, description="Only this application's jobs."),
            OpenApiParameter("state", str, enum=list(JobState.values)),
            *PAGE_PARAMETERS,
        ],
        responses={200: page_of(JobSerializer, "JobPage")},
    )
    def get(self, request: Request) -> Response:
        state = request.query_params.get("state")  # present but empty is not a state
        if state is not None and state not in JobState.values:
            raise InvalidRequest(
                f"state must be one of {list(JobState.values)}",
                fields={"state": [f"one of {list(JobState.values)}"]},
            )
        jobs = selectors.job_list(
            application=request.query_params.get("application") or None, state=state
        )
        pages = KeysetPagination(ordering="name")
        items = pages.page(jobs, request)
        context = {"request": request, "watched_at": runs_watched_at()}
        data = JobSerializer(items, many=True, context=context).data
        return Response(pages.response_data(data))

    @extend_schema(
        tags=TAGS,
        request=JobCreateSerializer,
        responses={
            201: JobSerializer,
            404: error("Unknown application or version."),
            409: error("The name or the application's branch has a job already, or no version."),
            422: error("More parallelism than the application's max parallelism."),
        },
    )
    def post(self, request: Request) -> Response:
        body = JobCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields: dict[str, Any] = dict(body.validated_data)
        application = application_get(name=fields.pop("application"))
        number = fields.pop("version", None)
        version = (
            version_latest(application=application)
            if number is None
            else version_get(application=application, number=number)
        )
        if version is None:
            raise Conflict(
                f"application {application.name} has no version yet; create one with "
                f"POST /api/applications/{application.name}/versions/",
                fields={"version": ["the application has no versions"]},
                code="no_version",
            )
        job = services.job_create(
            application=application, version=version, created_by=request.user, **fields
        )
        context = {"request": request, "watched_at": runs_watched_at()}
        data = JobSerializer(job, context=context).data
        return Response(data, status=201, headers={"Location": data["url"]})


class JobDetailView(ApiView):
    @extend_schema(tags=TAGS, responses={200: JobDetailSerializer})
    def get(self, request: Request, name: str) -> Response:
        mark = job_mark(name=name)
        etag = _job_etag(request, mark)
        if matches(request, etag):
            with watching(request) as deadline:
                changed = deadline is not None and wait_for_change(
                    job_key(mark.job_id), mark.revision, deadline=deadline, release_connection=True
                )
            if not changed:
                return not_modified_after_watch(request, etag)
            mark = job_mark(name=name)
            etag = _job_etag(request, mark)
        kept = cached(request, etag)
        if kept is not None:
            return kept
        job = job_overview(name=name)  # read after the revision: the ETag is never newer
        ctx = {
            "request": request,
            "application": job.application.name,
            "current_run": job.latest_run,  # type: ignore[attr-defined]
            "active_operation": job.active_operation,  # type: ignore[attr-defined]
            "head": mark.head,
            "shown": mark.shown(job),
        }
        return remember(request, tag(Response(job_detail_representation(job, ctx)), etag), etag)


def _job_etag(request: Request, mark: JobMark) -> str:
    """The job read's ETag: its revision, and whether its state is shown as `unknown` (which
    changes with time, not with a revision)."""
    return etag_for(request, "job", mark.job_id, mark.revision, "u" if mark.unwatched else "w")


class JobRunListView(ApiView):
    @extend_schema(
        tags=TAGS, parameters=PAGE_PARAMETERS, responses={200: page_of(RunSerializer, "RunPage")}
    )
    def get(self, request: Request, name: str) -> Response:
        job = selectors.job_get(name=name)
        pages = KeysetPagination(ordering=("-created_at", "-id"))
        items = pages.page(selectors.job_run_list(job), request)
        return Response(pages.response_data(RunSerializer(items, many=True).data))


class JobLogsView(ApiView):
    @extend_schema(
        tags=TAGS,
        summary="The last lines of a run's log (default: the current run)",
        parameters=[
            OpenApiParameter("run", str, description="A run id (default: the newest run)."),
            OpenApiParameter(
                "tail",
                {"type": "integer", "minimum": 1, "maximum": MAX_LOG_LINES},  # type: ignore[arg-type]
                description=f"Lines, 1..{MAX_LOG_LINES} (default 100).",
            ),
        ],
        responses={200: LogsSerializer},
    )
    def get(self, request: Request, name: str) -> Response:
        job = selectors.job_get(name=name)
        raw = request.query_params.get("tail", "100")
        tail = int(raw) if raw.isascii() and raw.isdigit() else 0
        if not 1 <= tail <= MAX_LOG_LINES:
            raise InvalidRequest(
                f"tail must be an integer from 1 to {MAX_LOG_LINES}",
                fields={"tail": [f"an integer from 1 to {MAX_LOG_LINES}"]},
            )
        run_id = request.query_params.get("run")
        run = (
            selectors.job_run_get(job, run_id=run_id) if run_id else selectors.job_current_run(job)
        )
        text = "" if run is None else services.run_logs(run, tail_lines=tail)
        run_id = None if run is None else run.run_id
        return Response(LogsSerializer({"run_id": run_id, "tail": tail, "text": text}).data)
