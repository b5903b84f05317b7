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
from controlplane.patterns import object_refusals

TAGS = ["autoscaler"]
MAX_DECISIONS = 200
_WINDOW: Final = {"type": "integer", "minimum": 1, "maximum": 1000}
POLICY_PATCH: Final = {
    "type": "object",
    "description": "The policy fields to change (docs/autoscaling.md); the others stay. "
    "Each field is checked against this schema (400); how they fit together and with the "
    "policy's other fields, and max_parallelism at most the application's M, is a 422.",
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


def _check_changes(job: Job, changes: dict[str, Any]) -> None:
    """A PATCH is checked against its published schema first (400 naming each field); what
    the schema cannot say is a 422: max_parallelism above the application's M, or below
    min_parallelism (naming each of the two the request gave). Other fields that do not fit
    together are found by the policy's own check (`patch`)."""
    refused = object_refusals(POLICY_PATCH, changes)
    if refused:
        raise InvalidRequest(
            "autoscaling policy fields refused: " + ", ".join(sorted(refused)), fields=refused
        )
    high = changes.get("max_parallelism")
    m = job.application.max_parallelism
    if high is not None and high > m:
        raise UnusableRequest(
            f"max_parallelism {high} is above the maximum parallelism of application "
            f"{job.application.name} (M={m}): a job runs at most M tasks",
            code="parallelism_above_max",
            fields={"max_parallelism": [f"at most {m} (the application's M)"]},
        )
    current = services.policy_of(job)
    low = changes.get("min_parallelism", current.min_parallelism)
    high = changes.get("max_parallelism", current.max_parallelism)
    if high < low:
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
                "Fields that do not fit together or with the policy's others (min_parallelism "
                "above max_parallelism, utilisation_min not below target_utilisation, …), or "
                "max_parallelism above the application's maximum parallelism (M)."
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
        _check_changes(job, request.data)
        try:
            services.policy_set(job=job, changes=request.data, user=request.user)
        except InvalidRequest as exc:
            # every field is well-formed (the schema took them): what is left is how they
            # relate to each other and to the policy's other fields (min <= max, the
            # utilisation band around the target), which only the whole policy shows
            raise UnusableRequest(exc.message, fields=exc.fields) from None
        return Response(_body(name, 20))
