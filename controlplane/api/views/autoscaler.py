"""A job's autoscaler: its policy (read; operators change it) and its recent decisions."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.roles import OPERATOR
from controlplane.api.base import ApiView
from controlplane.api.schema import error
from controlplane.autoscaler import selectors, services
from controlplane.autoscaler.models import AutoscaleDecision, AutoscalePolicy
from controlplane.errors import InvalidRequest
from controlplane.jobs.selectors import job_get

TAGS = ["autoscaler"]
MAX_DECISIONS = 200
_INTEGER = {"type": "integer", "minimum": 0}
_NUMBER = {"type": "number", "minimum": 0}
#: the PATCH body: any subset of the policy's fields (docs/autoscaling.md#the-policy)
POLICY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "mode": {"type": "string", "enum": ["off", "recommend", "apply"]},
        "target_utilisation": {**_NUMBER, "minimum": 0.05, "maximum": 1.0},
        "utilisation_min": {**_NUMBER, "maximum": 1.0},
        "utilisation_max": {**_NUMBER, "maximum": 2.0},
        "min_dwell_s": {**_NUMBER, "maximum": 86400},
        **{
            name: _INTEGER
            for name in (
                "min_parallelism",
                "max_parallelism",
                "scale_up_window",
                "scale_down_window",
                "cooldown_epochs",
                "metric_window",
                "catch_up_epochs",
            )
        },
    },
}


def decision_data(row: AutoscaleDecision) -> dict[str, Any]:
    return {
        "created_at": row.created_at.isoformat(),
        "mode": row.mode,
        "action": row.action,
        "epoch": row.epoch,
        "current_parallelism": row.current_parallelism,
        "recommended_parallelism": row.recommended_parallelism,
        "reason": row.reason,
        "outcome": row.outcome,
        "outcome_detail": row.outcome_detail,
        "operation": None if row.operation_id is None else str(row.operation_id),
        "inputs": row.inputs,
    }


def _body(job_name: str, limit: int) -> dict[str, Any]:
    job = job_get(name=job_name)
    policy = services.policy_of(job)
    return {
        "job": job.name,
        "parallelism": job.parallelism,
        "policy": {name: getattr(policy, name) for name in AutoscalePolicy.FIELDS},
        "decisions": [decision_data(d) for d in selectors.decisions(job)[:limit]],
    }


class JobAutoscalerView(ApiView):
    write_role = OPERATOR

    @extend_schema(
        tags=TAGS,
        summary="The job's autoscaling policy and its newest decisions (with their inputs)",
        parameters=[
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 0, "maximum": MAX_DECISIONS},  # type: ignore[arg-type]
                description=f"Decisions, 0..{MAX_DECISIONS} (default 20; 0: the policy only).",
            )
        ],
        responses={200: OpenApiResponse(description="policy and decisions")},
    )
    def get(self, request: Request, name: str) -> Response:
        unknown = sorted(set(request.query_params) - {"limit"})
        if unknown:
            raise InvalidRequest(
                f"unknown query parameter(s) {unknown}; allowed: ['limit']",
                fields={k: ["unknown parameter"] for k in unknown},
            )
        raw = request.query_params.get("limit", "20")
        if not (raw.isascii() and raw.isdigit()) or not 0 <= int(raw) <= MAX_DECISIONS:
            raise InvalidRequest(
                f"limit must be an integer from 0 to {MAX_DECISIONS}",
                fields={"limit": [f"an integer from 0 to {MAX_DECISIONS}"]},
            )
        return Response(_body(name, int(raw)))

    @extend_schema(
        tags=TAGS,
        summary="Change the job's autoscaling policy (only the fields given)",
        request={"application/json": POLICY_SCHEMA},
        responses={200: OpenApiResponse(description="policy and decisions"), 400: error("bad")},
    )
    def patch(self, request: Request, name: str) -> Response:
        job = job_get(name=name)
        if not isinstance(request.data, dict):
            raise InvalidRequest(
                "the body must be a JSON object of policy fields",
                fields={"body": ["a JSON object"]},
            )
        services.policy_set(job=job, changes=request.data, user=request.user)
        return Response(_body(name, 20))
