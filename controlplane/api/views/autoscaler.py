"""A job's autoscaler: its policy (read; operators change it) and its recent decisions."""

from __future__ import annotations

from typing import Any, Final

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.accounts.roles import OPERATOR
from controlplane.api.base import ApiView
from controlplane.api.schema import error
from controlplane.applications.models import MAX_PARALLELISM_LIMIT
from controlplane.autoscaler import selectors, services
from controlplane.autoscaler.decision import MODES
from controlplane.autoscaler.models import AutoscaleDecision, AutoscalePolicy
from controlplane.errors import InvalidRequest, UnusableRequest
from controlplane.jobs.models import Job
from controlplane.jobs.selectors import job_get

TAGS = ["autoscaler"]
MAX_DECISIONS = 200
_WINDOW: Final = {"type": "integer", "minimum": 1, "maximum": 1000}
POLICY_PATCH: Final = {
    "type": "object",
    "description": "The policy fields to change (docs/autoscaling.md); the others stay. "
    "max_parallelism at least min_parallelism and at most the application's M (else 422).",
    "properties": {
        "mode": {"type": "string", "enum": list(MODES)},
        "target_utilisation": {"type": "number", "minimum": 0.05, "maximum": 1.0},
        "min_parallelism": {"type": "integer", "minimum": 1, "maximum": MAX_PARALLELISM_LIMIT},
        "max_parallelism": {"type": "integer", "minimum": 1, "maximum": MAX_PARALLELISM_LIMIT},
        "scale_up_window": _WINDOW,
        "scale_down_window": _WINDOW,
        "cooldown_epochs": {"type": "integer", "minimum": 0, "maximum": 1000},
        "metric_window": _WINDOW,
        "catch_up_epochs": _WINDOW,
        "utilisation_min": {"type": "number", "minimum": 0.0, "maximum": 1.0},
        "utilisation_max": {"type": "number", "minimum": 0.05, "maximum": 2.0},
        "min_dwell_s": {"type": "number", "minimum": 0.0, "maximum": 86400},
    },
    "additionalProperties": False,
}
"""The PATCH body: every field `AutoscalePolicy.FIELDS` names, with the bounds
`Policy.problems` checks (tests/security/test_schema_contract.py holds them equal)."""


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


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _check_parallelism_range(job: Job, changes: dict[str, Any]) -> None:
    """Parallelism bounds of a PATCH: above the schema's limit a 400; what the schema cannot
    say (422): max_parallelism at most the application's M, and at least min_parallelism once
    the changes are applied."""
    current = services.policy_of(job)
    low = _integer(changes.get("min_parallelism", current.min_parallelism))
    high = _integer(changes.get("max_parallelism", current.max_parallelism))
    beyond = [
        name
        for name in ("min_parallelism", "max_parallelism")
        if (value := _integer(changes.get(name))) is not None and value > MAX_PARALLELISM_LIMIT
    ]
    if beyond:
        raise InvalidRequest(
            f"{', '.join(beyond)}: at most {MAX_PARALLELISM_LIMIT}",
            fields={name: [f"at most {MAX_PARALLELISM_LIMIT}"] for name in beyond},
        )
    m = job.application.max_parallelism
    if high is not None and high > m:
        raise UnusableRequest(
            f"max_parallelism {high} is above the maximum parallelism of application "
            f"{job.application.name} (M={m}): a job runs at most M tasks",
            code="parallelism_above_max",
            fields={"max_parallelism": [f"at most {m} (the application's M)"]},
        )
    if low is not None and high is not None and high < low:
        named = [f for f in ("min_parallelism", "max_parallelism") if f in changes]
        raise UnusableRequest(
            f"max_parallelism {high} is below min_parallelism {low}",
            fields={f: ["min_parallelism must not exceed max_parallelism"] for f in named},
        )


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
        request={"application/json": POLICY_PATCH},
        responses={
            200: OpenApiResponse(description="policy and decisions"),
            400: error("A field the policy does not have, a wrong JSON type or a bad value."),
            404: error("No such job."),
            422: error(
                "max_parallelism above the application's maximum parallelism (M), or below "
                "min_parallelism."
            ),
        },
    )
    def patch(self, request: Request, name: str) -> Response:
        job = job_get(name=name)
        if not isinstance(request.data, dict):
            raise InvalidRequest(
                "the body must be a JSON object of policy fields",
                fields={"body": ["a JSON object"]},
            )
        _check_parallelism_range(job, request.data)
        services.policy_set(job=job, changes=request.data, user=request.user)
        return Response(_body(name, 20))
