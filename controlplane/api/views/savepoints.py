"""A job's periodic savepoints (the Flink Kubernetes Operator's `periodicSavepointInterval`
with a savepoint history): the setting and the savepoints kept (read), and a change of the
setting (operators). The reconciler takes them (`operations/schedule.py`)."""

from __future__ import annotations

from typing import Final

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.roles import OPERATOR
from controlplane.api.base import ApiView
from controlplane.api.schema import error
from controlplane.errors import InvalidRequest
from controlplane.jobs.selectors import job_get
from controlplane.jobs.services import MIN_SAVEPOINT_INTERVAL_S, job_set_savepoint_schedule
from controlplane.operations.schedule import schedule_data
from controlplane.patterns import object_refusals

TAGS = ["jobs"]
MAX_INTERVAL_S = 30 * 24 * 3600
MAX_RETENTION = 10_000
SCHEDULE_PATCH: Final = {
    "type": "object",
    "description": "The fields to change; the other stays. `interval_s` 0 turns periodic "
    f"savepoints off; otherwise at least {MIN_SAVEPOINT_INTERVAL_S} s. `retention` 0 keeps "
    "every periodic savepoint; otherwise the newest N are kept (savepoints people ask for "
    "are never removed).",
    "properties": {
        "interval_s": {"type": "integer", "minimum": 0, "maximum": MAX_INTERVAL_S},
        "retention": {"type": "integer", "minimum": 0, "maximum": MAX_RETENTION},
    },
    "additionalProperties": False,
}


class JobSavepointScheduleView(ApiView):
    write_role = OPERATOR

    @extend_schema(
        tags=TAGS,
        summary="The job's periodic savepoints: the setting and the savepoints kept",
        responses={200: OpenApiResponse(description="interval_s, retention and savepoints")},
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(schedule_data(job_get(name=name)))

    @extend_schema(
        tags=TAGS,
        summary="Change the job's periodic savepoints (interval and retention)",
        request={"application/json": SCHEDULE_PATCH},
        responses={
            200: OpenApiResponse(description="interval_s, retention and savepoints"),
            400: error("An unknown field, a wrong JSON type or a value out of bounds."),
            404: error("No such job."),
        },
    )
    def patch(self, request: Request, name: str) -> Response:
        job = job_get(name=name)
        refused = object_refusals(SCHEDULE_PATCH, request.data)
        if refused:
            raise InvalidRequest(
                "periodic savepoint fields refused: " + ", ".join(sorted(refused)),
                fields=refused,
            )
        job = job_set_savepoint_schedule(
            job,
            interval_s=request.data.get("interval_s", job.savepoint_interval_s),
            retention=request.data.get("retention", job.savepoint_retention),
        )
        return Response(schedule_data(job))
